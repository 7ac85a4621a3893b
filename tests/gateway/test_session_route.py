"""A session is bound to one route: its launcher's route (``job_environments.llm_model``), else
the route of its first call. A call of the session naming another route is refused (400
``session_route_mismatch``, in its protocol's error shape), counted as a rejected call, and never
reaches the upstream; an alias of the session's route is that route. Both session managers: in
memory, and shared over the store (two gateways)."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import openai
import pytest

from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream
from tests.gateway.conftest import MESSAGES, StartGateway

SHARED = pytest.mark.parametrize("shared", [False, True], ids=["memory", "shared"])


def _routes(**extra: Any) -> dict[str, dict[str, Any]]:
    """Two routes on the fake upstream: ``fake`` (alias ``fake-alias``) and ``strong``, which asks
    the upstream for another model (what a trainer must never get in a ``fake`` session)."""
    return {"fake": {"aliases": ["fake-alias"]}, "strong": {"upstream_model": "strong-model"}, **extra}


@SHARED
async def test_a_call_naming_another_route_is_refused(
    start_gateway: StartGateway, upstream: FakeUpstream, shared: bool
) -> None:
    gw = await start_gateway(routes=_routes(), shared_sessions=shared)
    client = gw.client("s1")
    first = await client.chat.completions.create(model="fake", messages=MESSAGES)  # type: ignore[arg-type]
    assert first.choices[0].message.content == DEFAULT_TEXT

    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model="strong", messages=MESSAGES)  # type: ignore[arg-type]
    err = e.value.body
    assert isinstance(err, dict)
    assert (e.value.status_code, err["code"], err["param"], err["type"]) == (
        400,
        "session_route_mismatch",
        "model",
        "invalid_request_error",
    )
    assert "bound to route `fake`" in err["message"] and "`strong`" in err["message"]
    with pytest.raises(openai.BadRequestError):  # the Responses API too, streamed or not
        await client.responses.create(model="strong", input="hi", stream=True)

    assert [r.json["model"] for r in upstream.requests] == ["fake"]  # the other model was never called
    steps = await gw.steps("s1")
    assert [(s.seq, s.llm_model) for s in steps] == [(1, "fake")]
    status = (await gw.http().get("/v1/sessions/s1")).json()
    assert (status["total_steps"], status["step_counts"], status["rejected_calls"]) == (
        1,
        {"fake": 1},
        {"session_route_mismatch": 2},
    )
    assert await gw.metric("gateway_error_responses_total", status="400", code="session_route_mismatch") == 2

    again = await client.chat.completions.create(model="fake-alias", messages=MESSAGES)  # type: ignore[arg-type]
    assert again.choices[0].message.content == DEFAULT_TEXT  # an alias of the session's route is that route
    assert [(s.seq, s.llm_model, s.step_id) for s in await gw.steps("s1")] == [(1, "fake", 1), (2, "fake", 2)]
    # another session is free to start on the other route
    other = await gw.client("s2").chat.completions.create(model="strong", messages=MESSAGES)  # type: ignore[arg-type]
    assert other.choices[0].message.content == DEFAULT_TEXT


@SHARED
async def test_a_launcher_session_is_bound_to_its_route_from_its_first_call(
    start_gateway: StartGateway, upstream: FakeUpstream, shared: bool
) -> None:
    gw = await start_gateway(routes={"m": {}, "strong": {}}, shared_sessions=shared)
    await gw.register("job-s")  # llm_model "m"
    with pytest.raises(openai.BadRequestError) as e:
        await gw.client("job-s").chat.completions.create(model="strong", messages=MESSAGES)  # type: ignore[arg-type]
    assert e.value.code == "session_route_mismatch"
    assert upstream.requests == [] and await gw.steps("job-s") == []
    ok = await gw.client("job-s").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert ok.choices[0].message.content == DEFAULT_TEXT
    assert [s.llm_model for s in await gw.steps("job-s")] == ["m"]


@SHARED
async def test_parallel_first_calls_on_two_routes_bind_one(start_gateway: StartGateway, shared: bool) -> None:
    """Calls racing to be a session's first, half on each route: one route wins, every call on the
    other is refused, and no step of the other route is recorded."""
    gw = await start_gateway(routes=_routes(), shared_sessions=shared)
    client = gw.client("race")

    async def call(model: str) -> str:
        try:
            await client.chat.completions.create(model=model, messages=MESSAGES)  # type: ignore[arg-type]
        except openai.BadRequestError as e:
            assert e.code == "session_route_mismatch"
            return f"refused {model}"
        return model

    got = await asyncio.gather(*(call(m) for m in ["fake", "strong"] * 6))
    winners = {g for g in got if not g.startswith("refused")}
    assert len(winners) == 1, got
    [winner] = winners
    loser = "strong" if winner == "fake" else "fake"
    assert got.count(winner) == 6 and got.count(f"refused {loser}") == 6
    assert {s.llm_model for s in await gw.steps("race")} == {winner}


async def test_the_binding_holds_across_gateways_sharing_the_store(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    a = await start_gateway(routes=_routes(), shared_sessions=True)
    b = await start_gateway(routes=_routes(), shared_sessions=True)
    await a.client("s1").chat.completions.create(model="fake", messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError) as e:
        await b.client("s1").chat.completions.create(model="strong", messages=MESSAGES)  # type: ignore[arg-type]
    assert e.value.code == "session_route_mismatch"
    await b.client("s1").chat.completions.create(model="fake-alias", messages=MESSAGES)  # type: ignore[arg-type]
    assert [s.llm_model for s in await a.steps("s1")] == ["fake", "fake"]
    assert len(upstream.requests) == 2


async def test_anthropic_messages_refusal_in_anthropic_shape(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    routes = {
        "a": {"api": "anthropic", "base_url": upstream.origin},
        "a2": {"api": "anthropic", "base_url": upstream.origin},
    }
    gw = await start_gateway(routes=routes)
    client = gw.anthropic("s1")
    await client.messages.create(model="a", max_tokens=10, messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError) as e:
        await client.messages.create(model="a2", max_tokens=10, messages=MESSAGES)  # type: ignore[arg-type]
    body = e.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert (
        body["error"]["type"] == "invalid_request_error" and "bound to route `a`" in body["error"]["message"]
    )
    assert len(upstream.requests) == 1
