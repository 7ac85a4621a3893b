"""Admin keys apart from the clients' keys (``auth.admin_api_keys`` / ``admin_api_keys_env``): the
``/admin/...`` endpoints take only an admin key; the key every runtime receives (a client key)
gets a 403 there, and with client keys but no admin key the admin endpoints are refused to all
(fail closed). An admin key opens nothing else. Real gateway, real openai SDK."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from pydantic import ValidationError

from gateway.settings import GatewaySettings
from rollout.jobs.options import JobOptions
from rollout.jobs.processes import gateway_admin_key, gateway_api_key
from rollout.servers.batches import BatchError, BatchService
from tests.fake_upstream import DEFAULT_TEXT
from tests.gateway.conftest import CLIENT_KEY, MESSAGES, Gateway, StartGateway

ADMIN_KEY = "sk-admin-SECRET-5e1f0a77"

# every admin endpoint: (method, path, JSON body or None)
ADMIN: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/admin/policy_version", None),
    ("POST", "/admin/policy_version", {"version": 3}),
    ("POST", "/admin/pause", {"timeout_s": 0}),
    ("POST", "/admin/resume", {}),
    ("GET", "/admin/routes/m/workers", None),
    ("POST", "/admin/routes/m/workers", {"base_url": "http://127.0.0.1:9/v1"}),
    ("DELETE", "/admin/routes/m/workers?base_url=http://127.0.0.1:9/v1", None),
    ("GET", "/admin", None),
    ("GET", "/admin/no-such-path", None),
]


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _send(
    gw: Gateway, method: str, path: str, body: dict[str, Any] | None, key: str | None
) -> httpx.Response:
    return await gw.http().request(method, path, json=body, headers=_bearer(key) if key else {})


@pytest.mark.parametrize(("method", "path", "body"), ADMIN)
async def test_admin_endpoints_take_only_an_admin_key(
    start_gateway: StartGateway, method: str, path: str, body: dict[str, Any] | None
) -> None:
    gw = await start_gateway(auth={"api_keys": [CLIENT_KEY], "admin_api_keys": [ADMIN_KEY]})
    client = await _send(gw, method, path, body, CLIENT_KEY)
    assert client.status_code == 403
    assert client.json() == {
        "error": {
            "message": "This is a client key: the admin endpoints take an admin key (auth.admin_api_keys).",
            "type": "permission_error",
            "param": None,
            "code": "admin_key_required",
        }
    }
    missing = await _send(gw, method, path, body, None)
    wrong = await _send(gw, method, path, body, "sk-not-it")
    assert [(r.status_code, r.json()["error"]["code"]) for r in (missing, wrong)] == [
        (401, "invalid_api_key")
    ] * 2
    assert missing.json()["error"]["message"].startswith("Missing admin key")
    assert ADMIN_KEY not in missing.text + wrong.text + client.text
    state = gw.app_state.policy
    assert (state.paused, state.version) == (False, None)  # nothing refused changed anything
    assert await gw.metric("gateway_error_responses_total", status="403", code="admin_key_required") == 1
    admin = await _send(gw, method, path, body, ADMIN_KEY)
    assert admin.status_code not in (401, 403), admin.text


async def test_an_admin_key_opens_nothing_but_admin(start_gateway: StartGateway) -> None:
    gw = await start_gateway(auth={"api_keys": [CLIENT_KEY], "admin_api_keys": [ADMIN_KEY]})
    with pytest.raises(openai.AuthenticationError):
        await gw.client("s1", api_key=ADMIN_KEY).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert (await gw.http().get("/v1/models", headers=_bearer(ADMIN_KEY))).status_code == 401
    out = await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    r = await gw.http().post("/admin/policy_version", json={"version": 9}, headers={"x-api-key": ADMIN_KEY})
    assert (r.status_code, r.json()["policy_version"]) == (200, 9)


async def test_auth_on_without_an_admin_key_refuses_every_admin_call(start_gateway: StartGateway) -> None:
    gw = await start_gateway(auth={"api_keys": [CLIENT_KEY]})
    for method, path, body in ADMIN:
        r = await _send(gw, method, path, body, CLIENT_KEY)
        assert (r.status_code, r.json()["error"]["code"]) == (403, "admin_disabled"), path
    r = await _send(gw, "POST", "/admin/pause", {"timeout_s": 0}, None)
    assert (r.status_code, r.json()["error"]["code"]) == (403, "admin_disabled")
    assert "auth.admin_api_keys" in r.json()["error"]["message"]
    assert gw.app_state.policy.paused is False
    out = await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT  # model calls are not held


async def test_admin_keys_alone_leave_model_calls_open(start_gateway: StartGateway) -> None:
    gw = await start_gateway(auth={"admin_api_keys": [ADMIN_KEY]})
    out = await gw.client("s1", api_key="anything").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == DEFAULT_TEXT
    assert (await _send(gw, "POST", "/admin/pause", {"timeout_s": 0}, "anything")).status_code == 401
    assert gw.app_state.policy.paused is False
    assert (await _send(gw, "GET", "/admin/policy_version", None, ADMIN_KEY)).status_code == 200


def test_admin_key_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_TEST_ADMIN", f" {ADMIN_KEY} ,second-admin")
    s = GatewaySettings.model_validate(
        {
            "auth": {
                "api_keys": [CLIENT_KEY],
                "admin_api_keys": ["first-admin"],
                "admin_api_keys_env": "GW_TEST_ADMIN",
            }
        }
    )
    assert s.auth.admin_keys() == ("first-admin", ADMIN_KEY, "second-admin")
    assert s.auth.keys() == (CLIENT_KEY,) and s.auth.enabled
    assert gateway_admin_key(s) == "first-admin"
    assert gateway_api_key(s) == CLIENT_KEY  # what the runtimes get: a client key, never an admin key
    assert gateway_api_key(GatewaySettings.model_validate({"auth": {"admin_api_keys": [ADMIN_KEY]}})) is None
    with pytest.raises(ValidationError, match="admin key #1 .* is also a client key") as ei:
        GatewaySettings.model_validate({"auth": {"api_keys": [CLIENT_KEY], "admin_api_keys": [CLIENT_KEY]}})
    assert CLIENT_KEY not in str(ei.value)
    with pytest.raises(
        ValidationError, match="auth.admin_api_keys_env names GW_TEST_UNSET, which is not set"
    ):
        GatewaySettings.model_validate({"auth": {"admin_api_keys_env": "GW_TEST_UNSET"}})
    with pytest.raises(ValidationError, match=r"auth.admin_api_keys\[0\] is not a valid key"):
        GatewaySettings.model_validate({"auth": {"admin_api_keys": ["has space"]}})
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", f" {ADMIN_KEY} ")
    assert gateway_admin_key(None) == ADMIN_KEY


async def test_serve_sets_policy_versions_with_the_admin_key_only(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    """``launcher.py serve`` reaches ``/admin/policy_version`` with its admin key; the client key it
    gives runtimes is refused there."""
    gw = await start_gateway(auth={"api_keys": [CLIENT_KEY], "admin_api_keys": [ADMIN_KEY]})
    url = gw.session_base("x").rsplit("/", 1)[0]
    opts = JobOptions(gateway_config=tmp_path / "gateway.yaml")
    service = BatchService(None, opts, url, CLIENT_KEY, "m", admin_key=ADMIN_KEY)  # type: ignore[arg-type]
    assert await service._policy_version("POST", 4) == 4
    assert gw.app_state.policy.version == 4
    runtime_keyed = BatchService(None, opts, url, CLIENT_KEY, "m", admin_key=CLIENT_KEY)  # type: ignore[arg-type]
    with pytest.raises(BatchError, match="refused this service's admin key"):
        await runtime_keyed._policy_version("POST", 5)
    assert gw.app_state.policy.version == 4
