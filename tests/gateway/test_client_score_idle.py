"""A client's own score of a session (``POST /v1/sessions/{sid}/score``, an admin key) kept apart
from a grader's reward, and the gateway's close of sessions left idle (``session_idle_close_s``),
swept by a direct call with an injected time."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gateway.idle import close_idle
from store import utcnow
from tests.gateway.conftest import CLIENT_KEY, MESSAGES, Gateway, StartGateway

ADMIN_KEY = "sk-admin-score-1"


async def _call(gw: Gateway, sid: str, key: str = "unused") -> None:
    """One chat call of session ``sid`` named by the X-Session-ID header (one base URL)."""
    r = await gw.http().post(
        "/v1/chat/completions",
        json={"model": "m", "messages": MESSAGES},
        headers={"x-session-id": sid, "Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text


async def test_client_score_is_recorded_with_its_provenance_not_as_a_reward(gw: Gateway) -> None:
    await _call(gw, "s1")
    r = await gw.http().post("/v1/sessions/s1/score", json={"reward": 0.75, "reason": "inspect: includes"})
    assert r.status_code == 200, r.text
    assert {k: v for k, v in r.json().items() if k != "recorded_at"} == {
        "session_id": "s1",
        "client_score": 7.5,
        "reason": "inspect: includes",
        "provenance": "client",
    }
    r = await gw.http().post("/v1/sessions/s1/score", json={"score": 3})  # a later score replaces it
    assert r.json()["client_score"] == 3.0
    assert [
        tuple(row)
        for row in gw.sql("SELECT session_id, score, reason, provenance FROM session_client_scores")
    ] == [("s1", 3.0, None, "client")]
    assert [tuple(row) for row in gw.sql("SELECT reward, step_reward FROM session_steps")] == [(None, None)]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ('{"score": NaN}', "score"),
        ('{"score": 10.5}', "score"),
        ('{"score": -1}', "score"),
        ('{"score": true}', "score"),
        ('{"reward": 1.5}', "reward"),
        ('{"reward": "1"}', "reward"),
        ('{"score": 1e999}', "score"),
        ("{}", None),
        ('{"score": 5, "reward": 0.5}', None),
        ('{"score": 5, "extra": 1}', "extra"),
    ],
)
async def test_bad_scores_are_400_in_the_api_shape(gw: Gateway, body: str, param: str | None) -> None:
    await _call(gw, "s1")
    r = await gw.http().post(
        "/v1/sessions/s1/score", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"], err["type"]) == ("invalid_request", param, "invalid_request_error")
    assert gw.sql("SELECT COUNT(*) AS n FROM session_client_scores")[0]["n"] == 0


async def test_score_of_an_unknown_session_is_404(gw: Gateway) -> None:
    r = await gw.http().post("/v1/sessions/nope/score", json={"score": 1})
    assert (r.status_code, r.json()["error"]["code"]) == (404, "session_not_found")


async def test_score_takes_an_admin_key_not_a_client_key(start_gateway: StartGateway) -> None:
    gw = await start_gateway(auth={"api_keys": [CLIENT_KEY], "admin_api_keys": [ADMIN_KEY]})
    await _call(gw, "s1", CLIENT_KEY)
    client = await gw.http().post(
        "/v1/sessions/s1/score", json={"score": 10}, headers={"Authorization": f"Bearer {CLIENT_KEY}"}
    )
    assert (client.status_code, client.json()["error"]["code"]) == (403, "admin_key_required")
    admin = await gw.http().post(
        "/v1/sessions/s1/score", json={"score": 10}, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    assert admin.status_code == 200 and admin.json()["client_score"] == 10.0


async def test_idle_sessions_without_a_job_are_closed_by_the_sweep(start_gateway: StartGateway) -> None:
    gw = await start_gateway(session_idle_close_s=3600)
    before = utcnow()  # every session below changed at or after this (however slow the machine)
    await _call(gw, "idle")
    await _call(gw, "busy")
    await gw.register("launched")  # a launcher's session: its launcher closes it
    await gw.http().post("/v1/sessions/launched/chat/completions", json={"model": "m", "messages": MESSAGES})
    g = gw.app_state
    after = utcnow()  # and at or before this
    assert await close_idle(g, before + timedelta(seconds=3599)) == []
    g.sessions.live("busy").updated_at = after + timedelta(seconds=3000)  # a later call (in memory)
    assert await close_idle(g, after + timedelta(seconds=3601)) == ["idle"]
    status = (await gw.http().get("/v1/sessions/idle")).json()
    assert (status["status"], status["close_reason"]) == ("closed", "idle")
    assert [
        tuple(r) for r in gw.sql("SELECT session_id, status, close_reason FROM gateway_sessions ORDER BY 1")
    ] == [("busy", "active", None), ("idle", "closed", "idle"), ("launched", "active", None)]
    r = await gw.http().post(
        "/v1/chat/completions", json={"model": "m", "messages": MESSAGES}, headers={"x-session-id": "idle"}
    )
    assert r.status_code == 409


async def test_idle_close_is_off_by_default(gw: Gateway) -> None:
    await _call(gw, "s1")
    assert gw.settings.session_idle_close_s is None
    assert await close_idle(gw.app_state, utcnow() + timedelta(days=365)) == []
