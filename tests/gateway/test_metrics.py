"""``GET /metrics`` after a known sequence of calls, parsed with prometheus_client's parser:
requests by endpoint/route/status, latency and TTFT histograms, upstream calls in flight per
route, steps recorded, telemetry queue depth and dropped records, synthetic stops, retries,
the errors the gateway answered itself, each with its exact value."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fake_upstream import FakeUpstream, Reply, chat_chunk
from tests.gateway.conftest import MESSAGES, Gateway, StartGateway, eventually

UP_PATH = "/v1/chat/completions"
CHAT_M = (("endpoint", "chat.completions"), ("route", "m"))


async def test_exact_counts_after_a_known_sequence(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(max_steps=5, routes={"m": {"retry": {"max_attempts": 2, "backoff_s": 0}}})
    client = gw.client("s1")
    await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]  # 1: ok
    async for _ in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]  # 2: ok, a stream
        pass
    await client.responses.create(model="m", input="hi")  # 3: ok, Responses
    upstream.script(UP_PATH, [Reply.json({"error": {"message": "busy"}}, status=503)])
    await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]  # 4: 503, retried, ok
    upstream.script(UP_PATH, [Reply.json({"error": {"message": "boom"}}, status=500)])
    with pytest.raises(openai.InternalServerError):  # 5: upstream 500 (not retried), relayed
        await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    stop = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert stop.headers["x-gateway-stop-reason"] == "max_steps"  # 6: budget used: synthetic stop
    await gw.client().chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]  # 7: passthrough
    with pytest.raises(openai.NotFoundError):  # 8: unknown route, answered by the gateway itself
        await client.chat.completions.create(model="nope", messages=MESSAGES)  # type: ignore[arg-type]
    assert len(upstream.requests) == 7  # 1, 2, 3, 4 twice, 5, 7

    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
    }

    requests = {k[1]: v for k, v in m.items() if k[0] == "gateway_requests_total"}
    assert requests == {
        (*CHAT_M, ("status", "200")): 5,  # 1, 2, 4, 6 (synthetic stop), 7 (passthrough)
        (*CHAT_M, ("status", "500")): 1,  # 5
        (("endpoint", "responses"), ("route", "m"), ("status", "200")): 1,  # 3
    }
    assert m[("gateway_request_latency_seconds_count", CHAT_M)] == 5  # every relayed chat call; not the stop
    assert m[("gateway_request_latency_seconds_count", (("endpoint", "responses"), ("route", "m")))] == 1
    assert m[("gateway_request_latency_seconds_bucket", (CHAT_M[0], ("le", "+Inf"), CHAT_M[1]))] == 5
    assert m[("gateway_ttft_seconds_count", (("route", "m"),))] == 1  # the one relayed stream
    assert m[("gateway_upstream_in_flight", (("route", "m"),))] == 0
    assert m[("gateway_steps_recorded_total", ())] == 5  # 1-5; no step for the stop, the passthrough, the 404
    assert m[("gateway_synthetic_stops_total", ())] == 1
    assert {k[1]: v for k, v in m.items() if k[0] == "gateway_upstream_retries_total"} == {
        (("reason", "status_503"), ("route", "m")): 1
    }
    assert m[("gateway_telemetry_queue_depth", ())] == 0
    assert m[("gateway_telemetry_dropped_total", ())] == 0
    assert {k[1]: v for k, v in m.items() if k[0] == "gateway_error_responses_total"} == {
        (("code", "model_not_found"), ("status", "404")): 1
    }
    assert {k[1]: v for k, v in m.items() if k[0] == "gateway_stream_keepalives_total"} == {}
    assert [s.status for s in await gw.steps("s1")] == ["ok", "ok", "ok", "ok", "error"]


async def test_upstream_in_flight_per_route_during_a_stream(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes={"m": {}, "other": {}}, keepalive_interval_s=0.1)
    upstream.script(
        UP_PATH,
        [
            Reply.sse(
                [chat_chunk("x", role="assistant"), chat_chunk(finish_reason="stop"), b"data: [DONE]\n\n"],
                delay_s=[0, 1.0, 0],
            )
        ],
    )
    http = gw.http()
    task = asyncio.ensure_future(
        http.post(
            "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
        )
    )
    await upstream.wait_for_requests(1)

    async def streaming() -> bool:
        return await gw.metric("gateway_upstream_in_flight", route="m") == 1

    await eventually(streaming)
    assert await gw.metric("gateway_upstream_in_flight", route="other") == 0
    await eventually(lambda: gw.metric("gateway_stream_keepalives_total", route="m"), timeout=3)
    r = await task
    assert r.status_code == 200 and r.content.endswith(b"data: [DONE]\n\n")
    assert await gw.metric("gateway_upstream_in_flight", route="m") == 0
    assert await gw.metric("gateway_stream_keepalives_total", route="m") == r.content.count(b": keep-alive\n")


async def test_queue_depth_while_the_db_is_locked(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    """best_effort: the writer holds the first record (its commit waits for the lock); the
    next ones wait in the queue, and the gauge says how many."""
    gw = await start_gateway(telemetry={"mode": "best_effort"})
    lock = gw.hold_write_lock()
    try:
        client = gw.client("s1")
        for _ in range(3):
            await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert await gw.metric("gateway_telemetry_queue_depth") == 2
        assert await gw.metric("gateway_steps_recorded_total") == 0
    finally:
        lock.rollback()
        lock.close()
    await gw.wait_steps("s1", 3)

    async def drained() -> bool:
        return (
            await gw.metric("gateway_steps_recorded_total") == 3
            and await gw.metric("gateway_telemetry_queue_depth") == 0
        )

    await eventually(drained)


async def test_errors_answered_by_the_gateway_are_counted(gw: Gateway, upstream: FakeUpstream) -> None:
    http = gw.http()
    assert (await http.post("/v1/sessions/s1/chat/completions", content=b"{not json")).status_code == 400
    assert (
        await http.post("/v1/sessions/s1/chat/completions", json={"model": "zz", "messages": MESSAGES})
    ).status_code == 404
    assert (await http.get("/v1/nothing-here")).status_code == 404
    assert (await http.get("/v1/sessions/unknown")).status_code == 404
    assert (
        await http.post("/v1/sessions/nope/close", json={})
    ).status_code == 404  # never seen: nothing made
    await gw.register("s2")
    await http.post("/v1/sessions/s2/close", json={})
    assert (
        await http.post("/v1/sessions/s2/chat/completions", json={"model": "m", "messages": MESSAGES})
    ).status_code == 409
    m = await gw.metrics()
    errors = {k[1]: v for k, v in m.items() if k[0] == "gateway_error_responses_total"}
    codes = {(dict(k)["status"], dict(k)["code"]): v for k, v in errors.items()}
    assert codes == {
        ("400", ""): 1,  # malformed JSON (no error code)
        ("404", "model_not_found"): 1,
        ("404", ""): 1,
        ("404", "session_not_found"): 2,
        ("409", "session_closed"): 1,
    }
    assert not any(k[0] == "gateway_requests_total" for k in m)  # none of them reached a route
    assert upstream.requests == []
