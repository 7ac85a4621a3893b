"""An SDK that times out and retries (``retry_join_window_s``): the first call is not cancelled,
the retry gets its answer: one model call, one step."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.fake_upstream import FakeRequest, FakeUpstream, Reply, chat_completion
from tests.gateway.conftest import MESSAGES, StartGateway, eventually

UP_PATH = "/v1/chat/completions"


async def test_sdk_retry_after_a_read_timeout_joins_the_first_call(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    """The upstream answers only once the SDK's retry is waiting for the first call (an event,
    not a delay), so the order "client times out, retry joins, answer arrives" holds on any
    machine; the client timeout only has to cover the join-to-answer hand-off."""
    gw = await start_gateway(max_steps=1)
    release = asyncio.Event()

    async def held_answer(_req: FakeRequest) -> Reply:
        await release.wait()
        return Reply.json(chat_completion("late"))

    upstream.script(UP_PATH, [held_answer])
    recent = gw.app_state.sessions.recent_calls

    async def release_once_a_retry_joined() -> None:
        await eventually(lambda: any(c.waiters > 0 for c in recent.calls("s1")), timeout=30.0)
        release.set()

    releaser = asyncio.create_task(release_once_a_retry_joined())
    client = gw.client("s1", timeout=1.5, max_retries=2)
    out = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    await releaser
    assert out.choices[0].message.content == "late"
    assert (
        len(upstream.requests) == 1 and not upstream.requests[0].disconnected
    )  # one model call, not cancelled
    [step] = await gw.steps("s1")
    assert (step.status, step.status_code, step.is_trainable) == ("ok", 200, True)
    assert step.response["choices"][0]["message"]["content"] == "late"
    # the client left before the answer came (which was held until after its retry joined)
    assert 0 < step.meta_json["client_left_after_s"] < step.latency_ms / 1000
    st = (await gw.http().get("/v1/sessions/s1")).json()
    assert st["total_steps"] == 1  # the retry used no budget (max_steps 1, and it was answered)
    assert await gw.metric("gateway_idempotent_replays_total", endpoint="chat.completions") == 1


async def test_no_retry_within_the_window_records_the_answer_as_client_disconnected(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(retry_join_window_s=0.3)
    upstream.script(UP_PATH, [Reply.json(chat_completion("unseen"), delay_headers_s=0.6)])
    with pytest.raises(openai.APITimeoutError):
        await gw.client("s1", timeout=0.3).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    [step] = await gw.wait_steps("s1", 1, timeout=3.0)
    assert (step.status, step.status_code, step.meta_json["phase"]) == (
        "client_disconnected",
        200,
        "detached",
    )
    assert step.response["choices"][0]["message"]["content"] == "unseen"  # the answer nobody got, kept
    assert not upstream.requests[0].disconnected  # the upstream call was let finish
    assert gw.app_state.sessions.in_flight("s1") == 0
    # a late retry is a new call
    upstream.script(UP_PATH, [Reply.json(chat_completion("again"))])
    r = await gw.http().post(
        "/v1/sessions/s1/chat/completions",
        json={"model": "m", "messages": MESSAGES},
        headers={"x-stainless-retry-count": "1"},
    )
    assert r.json()["choices"][0]["message"]["content"] == "again"
    assert len(await gw.steps("s1")) == 2


async def test_a_client_that_cannot_retry_is_cancelled_as_before(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    """Raw HTTP without ``x-stainless-retry-count`` or ``Idempotency-Key``: nothing could join,
    so the upstream call is cancelled at once."""
    gw = await start_gateway()
    upstream.script(UP_PATH, [Reply.json(chat_completion("late"), delay_headers_s=30)])
    with pytest.raises(httpx.ReadTimeout):
        await gw.http(timeout=0.3).post(
            "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES}
        )
    await upstream.wait_for_disconnect(1, timeout=2.0)
    [step] = await gw.wait_steps("s1", 1)
    assert step.status == "client_disconnected" and "client_left_after_s" not in step.meta_json


async def test_streamed_calls_are_not_kept_for_a_retry(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway()
    upstream.script(UP_PATH, [Reply.json(chat_completion("late"), delay_headers_s=30)])
    with pytest.raises(openai.APITimeoutError):
        stream = await gw.client("s1", timeout=0.3).chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[call-overload]
            stream=True,
        )
        async for _ in stream:
            pass
    await upstream.wait_for_disconnect(1, timeout=2.0)
    [step] = await gw.wait_steps("s1", 1)
    assert (step.status, step.is_stream) == ("client_disconnected", True)
    assert "client_left_after_s" not in step.meta_json


async def test_parallel_calls_with_one_body_are_never_cross_wired(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    """Two samples of one prompt in flight; a retry-looking call with the same body while both
    clients are connected is a new call, never an answer of the others."""
    gw = await start_gateway()
    upstream.script(UP_PATH, [Reply.json(chat_completion(f"a{i}"), delay_headers_s=0.3) for i in range(3)])
    body = {"model": "m", "messages": MESSAGES}
    http = gw.http()
    answers = await asyncio.gather(
        http.post("/v1/sessions/s1/chat/completions", json=body, headers={"x-stainless-retry-count": "0"}),
        http.post("/v1/sessions/s1/chat/completions", json=body, headers={"x-stainless-retry-count": "0"}),
        http.post("/v1/sessions/s1/chat/completions", json=body, headers={"x-stainless-retry-count": "1"}),
    )
    contents = sorted(r.json()["choices"][0]["message"]["content"] for r in answers)
    assert contents == ["a0", "a1", "a2"]
    assert not any("x-gateway-replayed" in r.headers for r in answers)
    assert len(upstream.requests) == 3 and len(await gw.steps("s1")) == 3


async def test_a_retry_that_also_gives_up_leaves_the_step_client_disconnected(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(retry_join_window_s=0.5)
    upstream.script(UP_PATH, [Reply.json(chat_completion("too late for all"), delay_headers_s=3.0)])
    with pytest.raises(openai.APITimeoutError):
        await gw.client("s1", timeout=0.5, max_retries=1).chat.completions.create(
            model="m", messages=MESSAGES
        )  # type: ignore[arg-type]
    [step] = await gw.wait_steps("s1", 1, timeout=6.0)
    assert (step.status, step.meta_json["phase"]) == ("client_disconnected", "detached")
    assert len(upstream.requests) == 1


async def test_closed_session_or_stopping_gateway_ends_a_detached_call(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(close_grace_s=0.2)
    upstream.script(UP_PATH, [Reply.json(chat_completion("late"), delay_headers_s=30)] * 2)
    with pytest.raises(openai.APITimeoutError):
        await gw.client("s1", timeout=0.3).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    await upstream.wait_for_requests(1, timeout=30)  # the call is the gateway's (however loaded the machine)
    r = await gw.http().post("/v1/sessions/s1/close")
    assert r.status_code == 200
    [step] = await gw.wait_steps("s1", 1, timeout=2.0)  # recorded at the close, not 30 s later
    assert step.status == "client_disconnected"
    await upstream.wait_for_disconnect(1, timeout=2.0)

    before = len(upstream.requests)
    with pytest.raises(openai.APITimeoutError):
        await gw.client("s2", timeout=0.3).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    await upstream.wait_for_requests(before + 1, timeout=30)
    # a shutdown records the detached call instead of dropping it, without waiting for its
    # upstream (30 s away; the deadline is a hang guard)
    await asyncio.wait_for(gw.stop(), 20)
    rows = gw.sql("SELECT status FROM session_steps WHERE session_id='s2'")
    assert [r["status"] for r in rows] == ["client_disconnected"]
