"""The feed service over a real SQLite store: pages by cursor, long-poll, SSE with Last-Event-ID,
errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from rollout.servers.feed.app import FeedSettings, create_feed_app
from store import Store
from store.feed import FeedQueries
from tests.feed.helpers import finish, make_job


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = Store(f"sqlite://{tmp_path}/t.db")
    await s.init()
    yield s
    await s.close()


def client(store: Store) -> httpx.AsyncClient:
    app = create_feed_app(
        FeedQueries(store.reader), FeedSettings(min_valid=2, poll_interval_s=0.02, keepalive_s=0.05)
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://feed")


async def test_pages_follow_the_cursor_and_say_when_the_job_is_done(store: Store) -> None:
    ids = await make_job(store, "j", {"a": 2, "b": 2, "c": 2})
    for g in ("b", "a"):
        await finish(store, ids[g][0], 10)
        await finish(store, ids[g][1], 0)
    async with client(store) as c:
        r = await c.get("/v1/jobs/j/groups", params={"after": 0, "limit": 1})
        page = r.json()
        assert r.status_code == 200
        assert [g["group_id"] for g in page["groups"]] == ["b"] and page["next_cursor"] == 1
        assert page["progress"] == {
            "sessions": 6,
            "finished": 4,
            "groups": 3,
            "groups_ready": 2,
            "done": False,
        }
        (b,) = page["groups"]
        assert [s["score"] for s in b["samples"]] == [10.0, 0.0]
        assert [round(s["advantage"], 6) for s in b["samples"]] == [1.0, -1.0]
        assert b["samples"][0]["steps"][0]["content"] == f"answer {ids['b'][0]}"
        page = (await c.get("/v1/jobs/j/groups", params={"after": 1})).json()
        assert [g["group_id"] for g in page["groups"]] == ["a"] and page["next_cursor"] == 2
        page = (await c.get("/v1/jobs/j/groups", params={"after": 2})).json()
        assert page["groups"] == [] and page["next_cursor"] == 2 and not page["progress"]["done"]
        await finish(store, ids["c"][0], 5)
        await finish(store, ids["c"][1], None, "grader_broken", eval_reason="boom")
        page = (await c.get("/v1/jobs/j/groups", params={"after": 2, "view": "scores"})).json()
        (cg,) = page["groups"]
        assert cg["flags"] == ["too_few_valid"] and not cg["trainable"]
        assert [s["valid"] for s in cg["samples"]] == [True, False] and cg["samples"][1]["score"] is None
        assert cg["samples"][0]["steps"] is None
        assert page["progress"]["done"]
        # min_valid per request
        page = (await c.get("/v1/jobs/j/groups", params={"after": 2, "min_valid": 1})).json()
        assert page["groups"][0]["trainable"] and page["groups"][0]["min_valid"] == 1


async def test_long_poll_answers_when_a_group_becomes_ready(store: Store) -> None:
    ids = await make_job(store, "j", {"a": 2})
    await finish(store, ids["a"][0], 1)
    async with client(store) as c:
        waiting = asyncio.create_task(c.get("/v1/jobs/j/groups", params={"after": 0, "wait": 30}))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # nothing ready: the request is held
        await finish(store, ids["a"][1], 3)
        page = (await asyncio.wait_for(waiting, 30)).json()
        # (its progress was read before the groups, so it may or may not say done yet)
        assert [g["group_id"] for g in page["groups"]] == ["a"] and page["next_cursor"] == 1
        # a done job answers at once, even with a wait
        page = (
            await asyncio.wait_for(c.get("/v1/jobs/j/groups", params={"after": 1, "wait": 30}), 10)
        ).json()
        assert page["groups"] == [] and page["progress"]["done"]


def _events(text: str) -> list[dict[str, str]]:
    out = []
    for block in text.split("\n\n"):
        ev: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith(":"):
                continue
            k, _, v = line.partition(": ")
            ev[k] = v
        if ev:
            out.append(ev)
    return out


async def test_sse_resumes_from_last_event_id_and_ends_with_done(store: Store) -> None:
    ids = await make_job(store, "j", {"a": 1, "b": 1, "c": 1})
    for g in ("c", "a", "b"):
        await finish(store, ids[g][0], 4)
    async with client(store) as c:
        events = _events((await c.get("/v1/jobs/j/groups/stream")).text)
        assert [(e.get("id"), e["event"]) for e in events] == [
            ("1", "group"),
            ("2", "group"),
            ("3", "group"),
            (None, "done"),
        ]
        assert [json.loads(e["data"])["group_id"] for e in events[:3]] == ["c", "a", "b"]
        events = _events((await c.get("/v1/jobs/j/groups/stream", headers={"Last-Event-ID": "2"})).text)
        assert [e.get("id") for e in events] == ["3", None]
        assert json.loads(events[1]["data"])["done"] is True
        r = await c.get("/v1/jobs/j/groups/stream", headers={"Last-Event-ID": "x"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_last_event_id"


async def test_unknown_job_and_bad_parameters_are_clear_errors(store: Store) -> None:
    async with client(store) as c:
        r = await c.get("/v1/jobs/nope/groups")
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_job"
        assert (await c.get("/v1/jobs/nope")).status_code == 404
        assert (await c.get("/v1/jobs/nope/groups/stream")).status_code == 404
        for after in (-1, "abc", 2**63):  # beyond 2**63 - 1 no stored cursor can be
            r = await c.get("/v1/jobs/nope/groups", params={"after": after})
            assert r.status_code == 400, after
            err = r.json()["error"]  # the gateway's error shape, not FastAPI's {"detail": ...}
            assert set(err) == {"message", "type", "param", "code"}, r.text
            assert (err["param"], err["code"], err["type"]) == (
                "after",
                "invalid_request",
                "invalid_request_error",
            )
            assert err["message"].startswith(
                "invalid request to /v1/jobs/nope/groups: query parameter 'after': "
            )
            assert err["message"].endswith(f"(got {str(after)!r})"), err
        r = await c.get("/v1/jobs/nope/groups/stream", headers={"Last-Event-ID": str(2**63)})
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_last_event_id"
        assert r.json()["error"]["param"] == "last-event-id"
        r = await c.get("/v1/jobs/nope/groups", params={"normalize": "zscore", "limit": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "limit"
        assert r.json()["error"]["message"] == (
            "invalid request to /v1/jobs/nope/groups: query parameter 'limit': Input should be greater than or "
            "equal to 1 (got '0'); also: 'normalize' (invalid)"
        )
        for path in ("/v1/jobs/nope/groups", "/v1/jobs/nope/groups/stream"):  # a typo is not the default
            r = await c.get(path, params={"after": 0, "min_vaild": 5})
            assert (r.status_code, r.json()["error"]["param"], r.json()["error"]["code"]) == (
                400,
                "min_vaild",
                "unknown_parameter",
            ), r.text
            assert r.json()["error"]["message"].startswith(
                "unknown query parameter 'min_vaild' (known: after, "
            ), r.text
            r = await c.get(path, params={"min_valid": 2**63})
            assert (r.status_code, r.json()["error"]["param"]) == (400, "min_valid"), r.text
        r = await c.get("/v1/nothing/here")
        assert r.status_code == 404 and r.json()["error"]["message"] == "Not Found"


async def test_a_job_recorded_before_the_feed_is_backfilled_in_finishing_order(
    store: Store, tmp_path: Path
) -> None:
    ids = await make_job(store, "old", {"a": 1, "b": 2, "c": 1})
    for sid in (ids["c"][0], ids["b"][0], ids["a"][0]):  # b is still incomplete
        await finish(store, sid, 5)
    async with store.writer.begin() as conn:  # as an older version left it: no feed entries
        await conn.execute(text("DELETE FROM feed_groups"))
    app = create_feed_app(FeedQueries(store.reader), FeedSettings(), backfill=store.backfill_feed)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://feed") as c:
        page = (await c.get("/v1/jobs/old/groups")).json()
        assert [(g["group_id"], g["cursor"]) for g in page["groups"]] == [("c", 1), ("a", 2)]
        await finish(store, ids["b"][1], 5)  # completed by this version: appended, not backfilled again
        page = (await c.get("/v1/jobs/old/groups", params={"after": 2})).json()
        assert [(g["group_id"], g["cursor"], g["revision"]) for g in page["groups"]] == [("b", 3, 1)]
    assert await store.backfill_feed("old") == 0


async def test_min_valid_below_one_is_refused_and_a_group_without_a_valid_sample_is_never_trainable(
    store: Store,
) -> None:
    ids = await make_job(store, "j", {"bad": 2})
    for sid in ids["bad"]:  # every sample an evaluator error
        await finish(store, sid, None, "error", eval_reason="KeyError")
    async with client(store) as c:
        for path in ("/v1/jobs/j/groups", "/v1/jobs/j/groups/stream"):
            for value in (0, -1):
                r = await c.get(path, params={"min_valid": value})
                err = r.json()["error"]
                assert (r.status_code, err["param"], err["code"]) == (400, "min_valid", "invalid_request"), (
                    r.text
                )
                assert err["message"].endswith(
                    f"Input should be greater than or equal to 1 (got '{value}')"
                ), err
        (g,) = (await c.get("/v1/jobs/j/groups", params={"min_valid": 1, "view": "scores"})).json()["groups"]
        assert (g["n_valid"], g["min_valid"], g["trainable"], g["flags"]) == (0, 1, False, ["too_few_valid"])
    with pytest.raises(ValueError, match=r"^min_valid must be an integer >= 1 .*not 0$"):
        FeedSettings(min_valid=0)
    with pytest.raises(
        ValueError, match=r"^poll_interval_s must be a finite number of seconds above 0, not nan$"
    ):
        FeedSettings(poll_interval_s=float("nan"))


async def test_every_route_refuses_unknown_and_repeated_parameters(store: Store) -> None:
    await make_job(store, "j", {"a": 1})
    async with client(store) as c:
        r = await c.get("/v1/jobs/j", params={"foo": 1})
        assert r.status_code == 400 and r.json()["error"] == {
            "message": "unknown query parameter 'foo' (known: none)",
            "type": "invalid_request_error",
            "param": "foo",
            "code": "unknown_parameter",
        }
        assert (await c.get("/v1/jobs/j")).status_code == 200
        for path, query in (
            ("/v1/jobs/j/groups", "limit=1&limit=2"),
            ("/v1/jobs/j/groups/stream", "after=0&after=3"),
        ):
            r = await c.get(f"{path}?{query}")
            name = query.split("=")[0]
            assert r.status_code == 400 and r.json()["error"] == {
                "message": f"query parameter {name!r} is given more than once (give it once)",
                "type": "invalid_request_error",
                "param": name,
                "code": "repeated_parameter",
            }, r.text
