"""Credentials in database and upstream URLs are never echoed: ``/readyz``, errors, admin
answers, metrics, recorded steps and log lines show ``***`` for a password (``u:secret@h``) and
for a credential query parameter (``?password=secret``, ``?api_key=...``). Real gateway, real
stores (SQLite; PostgreSQL when a server can be started)."""

from __future__ import annotations

import logging

import pytest

from gateway.errors import GatewayError
from gateway.settings import RouteSettings
from gateway.upstream import route_base_url
from store import Store, StoreUnavailable, hide_secrets, redact_url
from store.engine import DbUrlError, parse_db_url
from tests.fake_upstream import FakeUpstream
from tests.gateway.conftest import MESSAGES, StartGateway
from tests.pg_server import PgServer

DB_SECRET = "pgSECRET1"
PARAM_SECRET = "pgSECRET2"
UP_SECRET = "upSECRET3"


def test_redact_url_hides_passwords_and_credential_parameters() -> None:
    assert redact_url(f"postgresql://u:{DB_SECRET}@h:5432/db?password={PARAM_SECRET}&sslmode=require") == (
        "postgresql://u:***@h:5432/db?password=***&sslmode=require"
    )
    assert (
        redact_url(f"postgresql://u@h/db?password={PARAM_SECRET}", drop_user=True)
        == "postgresql://h/db?password=***"
    )
    assert (
        redact_url(f"postgresql://u:a/b@c{DB_SECRET}@h/db") == "postgresql://u:***@h/db"
    )  # '/' and '@' in it
    assert redact_url("https://h/v1?api_key=k1&key=k2&sig=k3&api-version=2024&sslpassword=k4#f") == (
        "https://h/v1?api_key=***&key=***&sig=***&api-version=2024&sslpassword=***#f"
    )
    assert redact_url("http://h:8/v1") == "http://h:8/v1" and redact_url("runs/t.db") == "runs/t.db"
    text = f"connect failed: password={PARAM_SECRET} dsn=u:{DB_SECRET}@h"
    url = f"postgresql://u:{DB_SECRET}@h/db?password={PARAM_SECRET}"
    assert hide_secrets(text, url) == "connect failed: password=*** dsn=u:***@h"


def test_store_identity_and_errors_carry_no_credential(refused_port: int) -> None:
    port = refused_port
    store = Store(f"postgresql://u:{DB_SECRET}@127.0.0.1:{port}/db?password={PARAM_SECRET}&sslmode=disable")
    assert store.identity() == f"postgresql://127.0.0.1:{port}/db?password=***&sslmode=disable"
    assert (
        Store(f"postgresql://u:{DB_SECRET}@127.0.0.1:{port}/db").identity()
        == f"postgresql://127.0.0.1:{port}/db"
    )
    with pytest.raises(DbUrlError) as ei:
        parse_db_url(f"mysql://u:{DB_SECRET}@h/db?password={PARAM_SECRET}")
    assert DB_SECRET not in str(ei.value) and PARAM_SECRET not in str(ei.value)


async def test_a_store_that_cannot_open_names_no_credential(refused_port: int) -> None:
    store = Store(f"postgresql://u:{DB_SECRET}@127.0.0.1:{refused_port}/db?password={PARAM_SECRET}")
    try:
        with pytest.raises(StoreUnavailable) as ei:
            await store.init()
    finally:
        await store.close()
    assert "cannot open the database" in str(ei.value)
    assert DB_SECRET not in str(ei.value) and PARAM_SECRET not in str(ei.value)


async def test_readyz_and_the_startup_log_name_no_database_credential(
    start_gateway: StartGateway, pg_server: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = pg_server.create_database()  # trust auth: the passwords below are ignored by the server
    try:
        root, _, db = url.rpartition("/")
        with_secrets = f"{root.replace('postgres@', f'postgres:{DB_SECRET}@')}/{db}?password={PARAM_SECRET}"
        caplog.set_level(logging.INFO)
        gw = await start_gateway(db_url=with_secrets)
        r = await gw.http().get("/readyz")
        assert r.status_code == 200
        assert r.json()["db_url"] == f"postgresql://{root.split('@')[1]}/{db}?password=***"
        await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        await gw.stop()
        gateway_log = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("gateway"))
        for secret in (DB_SECRET, PARAM_SECRET):
            assert secret not in r.text and secret not in gateway_log
        assert "storage=postgresql://" in gateway_log
    finally:
        pg_server.drop_database(url)


async def test_upstream_credentials_are_not_shown(
    start_gateway: StartGateway, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture, refused_port: int
) -> None:
    caplog.set_level(logging.INFO)
    with_cred = upstream.base_url.replace("http://", f"http://user:{UP_SECRET}@")
    dead = f"http://user:{UP_SECRET}@127.0.0.1:{refused_port}/v1"
    gw = await start_gateway(
        routes={
            "m": {
                "base_url": with_cred,
                "base_urls": [with_cred, dead],
                "health_check_interval_s": 3600,
                "retry": {"max_attempts": 1},
                "api_key": None,
            },
            "solo": {"base_url": dead, "retry": {"max_attempts": 1}, "api_key": None},
        }
    )
    http = gw.http()
    shown = [
        (await http.get("/admin/routes/m/workers")).text,
        (await http.get("/metrics")).text,
        (await http.get("/readyz", params={"route": "solo"})).text,
    ]
    r = await http.post(
        "/admin/routes/m/workers", json={"base_url": f"http://user:{UP_SECRET}@127.0.0.1:9/v1"}
    )
    shown.append(r.text)
    r = await http.delete(
        "/admin/routes/m/workers", params={"base_url": f"http://user:{UP_SECRET}@127.0.0.1:8/v1"}
    )
    assert r.status_code == 404
    shown.append(r.text)
    r = await http.post("/v1/sessions/s-dead/chat/completions", json={"model": "solo", "messages": MESSAGES})
    assert r.status_code == 502
    shown.append(r.text)
    for sid in ("a", "b", "c", "d"):
        await http.post(f"/v1/sessions/{sid}/chat/completions", json={"model": "m", "messages": MESSAGES})
    await gw.stop()
    assert "user:***@" in shown[0]
    for text in shown:
        assert UP_SECRET not in text
    gateway_log = "\n".join(
        r.getMessage() for r in caplog.records if r.name.startswith(("gateway", "uvicorn"))
    )
    assert "taken out" in gateway_log and UP_SECRET not in gateway_log
    assert UP_SECRET not in gw.db_dump()  # meta_json.upstream_worker included


def test_a_per_session_route_error_names_no_credential() -> None:
    route = RouteSettings(base_url=f"http://user:{UP_SECRET}@h/s/{{session_id}}/v1")
    with pytest.raises(GatewayError) as ei:
        route_base_url("t", route, None)
    assert UP_SECRET not in ei.value.message and "user:***@h" in ei.value.message
