"""Per-session route ``base_url``: ``{session_id}`` is replaced by the call's session id
(percent-encoded as one path segment) so an upstream such as a training inference server can
attribute each request; sessionless calls to such a route are refused with 400
``session_required``; the template is checked at config load."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import anthropic
import openai
import pytest
from pydantic import ValidationError

from gateway.settings import ConfigError, GatewaySettings, RouteSettings, load_settings
from gateway.upstream import route_base_url
from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream
from tests.gateway.conftest import MESSAGES, ROUTE_KEY, StartGateway


def templated(upstream: FakeUpstream, **extra: object) -> dict[str, dict[str, object]]:
    """Route ``t`` (openai, per session) and ``m`` (openai, fixed) on the fake upstream."""
    return {"t": {"base_url": f"{upstream.origin}/sessions/{{session_id}}/v1", **extra}, "m": {}}


async def test_session_calls_go_to_the_session_url(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes=templated(upstream))
    client = gw.client("s1")
    out = await client.chat.completions.create(model="t", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    chunks = [
        c async for c in await client.chat.completions.create(model="t", messages=MESSAGES, stream=True)
    ]  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == DEFAULT_TEXT
    await gw.client("s2").responses.create(model="t", input="hi")
    await gw.client("s3").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert [(r.path, r.headers["x-session-id"]) for r in upstream.requests] == [
        ("/sessions/s1/v1/chat/completions", "s1"),
        ("/sessions/s1/v1/chat/completions", "s1"),
        ("/sessions/s2/v1/responses", "s2"),
        ("/v1/chat/completions", "s3"),  # a fixed route is untouched
    ]
    assert all(r.headers["authorization"] == f"Bearer {ROUTE_KEY}" for r in upstream.requests)
    steps = await gw.steps("s1")
    assert [(s.llm_model, s.status) for s in steps] == [("t", "ok"), ("t", "ok")]
    assert [s.step_id for s in steps] == [1, 2]


async def test_the_session_id_is_one_percent_encoded_segment(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(routes=templated(upstream))
    sid = "run 1:a?b#c%d"
    client = openai.AsyncOpenAI(
        base_url=f"{gw.url}/v1/sessions/{quote(sid, safe='')}", api_key="k", max_retries=0
    )
    try:
        out = await client.chat.completions.create(model="t", messages=MESSAGES)  # type: ignore[arg-type]
    finally:
        await client.close()
    assert out.choices[0].message.content == DEFAULT_TEXT
    [req] = upstream.requests
    # quoted as one segment; aiohttp (yarl) then sends ":" as is, which a path segment allows (RFC 3986 3.3)
    assert (req.path, req.query) == ("/sessions/run%201:a%3Fb%23c%25d/v1/chat/completions", "")
    assert req.headers["x-session-id"] == sid
    [step] = await gw.steps(sid)
    assert step.status == "ok"


async def test_a_sessionless_call_to_a_per_session_route_is_a_400(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    routes = {
        **templated(upstream),
        "a": {"api": "anthropic", "base_url": f"{upstream.origin}/sessions/{{session_id}}"},
    }
    gw = await start_gateway(routes=routes)
    with pytest.raises(openai.BadRequestError) as ei:
        await gw.client().chat.completions.create(model="t", messages=MESSAGES)  # type: ignore[arg-type]
    err = ei.value.response.json()["error"]
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "session_required", "model")
    assert "per-session URL" in err["message"] and "/v1/sessions/{session_id}/" in err["message"]
    with pytest.raises(openai.BadRequestError):
        await gw.client().chat.completions.create(model="t", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError) as ai:
        await gw.anthropic().messages.create(model="a", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
    body = ai.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "per-session URL" in body["error"]["message"]
    # the same route through a session works, and the fixed route works sessionless
    a = await gw.anthropic("s9").messages.create(model="a", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
    assert a.content[0].text == DEFAULT_TEXT  # type: ignore[union-attr]
    await gw.client().chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert [r.path for r in upstream.requests] == ["/sessions/s9/v1/messages", "/v1/chat/completions"]
    assert await gw.metric("gateway_error_responses_total", status="400", code="session_required") == 3
    assert await gw.metric("gateway_upstream_in_flight", route="t") == 0


def test_route_base_url_substitution() -> None:
    route = RouteSettings(base_url="http://trainer:8000/sessions/{session_id}/v1/")
    assert route.per_session and route.base_url == "http://trainer:8000/sessions/{session_id}/v1"
    assert route_base_url("t", route, "job-1/s 2") == "http://trainer:8000/sessions/job-1%2Fs%202/v1"
    assert route_base_url("t", route, "é") == "http://trainer:8000/sessions/%C3%A9/v1"
    fixed = RouteSettings(base_url="http://u/v1")
    assert not fixed.per_session and route_base_url("m", fixed, None) == "http://u/v1"
    from gateway.errors import GatewayError

    for sid in (None, ".", ".."):
        with pytest.raises(GatewayError) as ei:
            route_base_url("t", route, sid)
        assert (ei.value.status, ei.value.code) == (400, "session_required")


@pytest.mark.parametrize(
    ("base_url", "message"),
    [
        ("http://t/sessions/{sid}/v1", "placeholder {sid}; the only one replaced is {session_id}"),
        ("http://t/{session_id}/{job_id}/v1", "placeholder {job_id}"),
        ("http://t/{}/v1", "placeholder {}"),
        ("http://t/{session_id/v1", "stray brace"),
        ("http://t/session_id}/v1", "stray brace"),
        ("http://{session_id}.trainer/v1", "may only appear in the URL path"),
        ("http://t/v1?session={session_id}", "may only appear in the URL path"),
    ],
)
def test_bad_templates_fail_at_load(base_url: str, message: str) -> None:
    with pytest.raises(ValidationError) as ei:
        GatewaySettings.model_validate({"llm_routes": {"t": {"base_url": base_url}}})
    assert message in str(ei.value) and "llm_routes.t.base_url" in str(ei.value)


def test_load_settings_names_the_file_and_route(tmp_path: Path) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text("llm_routes:\n  t:\n    base_url: http://t/sessions/{run}/v1\n    api_key: sk-SECRET-9\n")
    with pytest.raises(ConfigError) as ei:
        load_settings(cfg)
    text = str(ei.value)
    assert str(cfg) in text and "llm_routes.t.base_url" in text and "{run}" in text
    assert "sk-SECRET-9" not in text  # config errors never echo the input (it may hold keys)
