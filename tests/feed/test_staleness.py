"""Policy versions per group and the staleness bound (``max_policy_lag``) over a real SQLite store,
through the feed service: every view gives the same flags."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollout.results.groups import GroupOptions, policy_lag
from rollout.servers.feed.app import FeedSettings, create_feed_app
from rollout.servers.feed.client import FeedClient
from store import SessionStep, Store
from store.feed import FeedQueries
from tests.feed.helpers import finish, session, step

pytestmark = pytest.mark.skipif(
    "policy_version" not in SessionStep.__table__.c,  # type: ignore[attr-defined]
    reason="this store version has no policy versions",
)

# session -> the policy version of each of its steps (None: made before any version was set)
VERSIONS: dict[str, list[int | None]] = {
    "old-0": [3, 4],
    "old-1": [4],  # oldest step 3
    "new-0": [5],
    "new-1": [5, 6],  # oldest step 5, newest in the job 6
    "pre-0": [None, 6],
    "pre-1": [6],  # one step before any version: lag unknown
    "none-0": [],
    "none-1": [6],  # a sample without steps (infrastructure failure) does not count
}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = Store(f"sqlite://{tmp_path}/t.db")
    await s.init()
    await s.add_job_sessions([session(sid, "j", sid.split("-")[0], int(sid[-1])) for sid in VERSIONS])
    await s.write_batch(
        [step(sid, k + 1, "a", policy_version=v) for sid, vs in VERSIONS.items() for k, v in enumerate(vs)],
        [],
    )
    for sid, vs in VERSIONS.items():
        await finish(s, sid, 5.0 + int(sid[-1]) if vs else None, "scored" if vs else "infra_error")
    yield s
    await s.close()


async def groups(store: Store, **params: Any) -> dict[str, dict[str, Any]]:
    app = create_feed_app(FeedQueries(store.reader), FeedSettings(min_valid=1))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://feed") as c:
        r = await c.get("/v1/jobs/j/groups", params=params)
    assert r.status_code == 200, r.text
    return {g["group_id"]: g for g in r.json()["groups"]}


def summary(gs: dict[str, dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
    return {
        k: (
            g["min_policy_version"],
            g["max_policy_version"],
            g["policy_lag"],
            "stale" in g["flags"],
            g["trainable"],
        )
        for k, g in gs.items()
    }


async def test_each_group_carries_its_min_and_max_policy_version(store: Store) -> None:
    for view in ("full", "tokens", "scores"):
        assert summary(await groups(store, view=view)) == {
            "old": (3, 4, None, False, True),
            "new": (5, 6, None, False, True),
            "pre": (6, 6, None, False, True),
            "none": (6, 6, None, False, True),
        }, view


async def test_max_policy_lag_flags_groups_too_far_behind_the_newest_version(store: Store) -> None:
    for view in ("full", "tokens", "scores"):
        # newest version stamped in the job: 6
        assert summary(await groups(store, view=view, max_policy_lag=1)) == {
            "old": (3, 4, 3, True, False),
            "new": (5, 6, 1, False, True),
            "pre": (6, 6, None, True, False),
            "none": (6, 6, 0, False, True),
        }, view
    got = summary(await groups(store, view="scores", max_policy_lag=3))
    assert (
        got["old"] == (3, 4, 3, False, True) and got["pre"][3]
    )  # unknown lag stays stale whatever the bound


async def test_the_readers_own_policy_version_sets_the_lag(store: Store) -> None:
    got = summary(await groups(store, view="scores", max_policy_lag=2, policy_version=7))
    assert got == {
        "old": (3, 4, 4, True, False),
        "new": (5, 6, 2, False, True),
        "pre": (6, 6, None, True, False),
        "none": (6, 6, 1, False, True),
    }


async def test_bad_bounds_are_refused(store: Store) -> None:
    app = create_feed_app(FeedQueries(store.reader), FeedSettings(min_valid=1))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://feed") as c:
        for params in ({"max_policy_lag": -1}, {"policy_version": "x"}):
            r = await c.get("/v1/jobs/j/groups", params=params)
            assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(params)), r.text
    with FeedClient("http://127.0.0.1:9") as client:
        for kw in ({"max_policy_lag": -1}, {"policy_version": -2}, {"max_policy_lag": True}):
            with pytest.raises(ValueError):
                client.page("j", **kw)  # type: ignore[arg-type]


def test_policy_lag_rules() -> None:
    bound = GroupOptions(min_valid=1, max_policy_lag=2, policy_version=10)
    assert policy_lag(8, False, bound) == (2, False)
    assert policy_lag(7, False, bound) == (3, True)
    assert policy_lag(9, True, bound) == (None, True)  # a step without a version
    assert policy_lag(None, False, bound) == (None, True)  # no step stamped
    assert policy_lag(8, False, GroupOptions(min_valid=1, max_policy_lag=2)) == (
        None,
        True,
    )  # no current version
    assert policy_lag(1, True, GroupOptions(min_valid=1)) == (None, False)  # no bound asked
    with pytest.raises(ValueError):
        GroupOptions(max_policy_lag=-1)
