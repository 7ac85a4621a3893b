"""``python -m gateway`` as a process: a gateway that cannot listen on its address exits before
its app starts, leaving the store as it was (it must not mark the sessions of the gateway that
holds the port as interrupted); a store that cannot be opened or a bad ``--db-url`` ends it with
one line, not a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from store import GatewaySession, Store


async def test_a_busy_port_exits_3_and_leaves_the_sessions_active(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    store = Store(f"sqlite://{db}")
    await store.init()
    await store.write_batch([], [GatewaySession(session_id="live", total_steps=1, step_counts={"m": 1})])
    await store.close()
    busy = socket.create_server(("127.0.0.1", 0))  # another process's listener
    port = busy.getsockname()[1]
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "listen_host": "127.0.0.1",
                "listen_port": port,
                "storage_config": {"db_url": f"sqlite://{db}"},
                "llm_routes": {"m": {"base_url": "http://127.0.0.1:9/v1"}},
            }
        )
    )
    try:
        p = subprocess.run(
            [sys.executable, "-m", "gateway", "--config", str(cfg)],
            capture_output=True,
            text=True,
            timeout=120,
            env=os.environ.copy(),
        )
    finally:
        busy.close()
    assert p.returncode == 3 and f"cannot listen on 127.0.0.1:{port}" in p.stderr
    store = Store(f"sqlite://{db}")
    await store.init()
    try:
        row = await store.load_gateway_session("live")
    finally:
        await store.close()
    assert row is not None and row.status == "active"


def test_a_store_that_cannot_be_opened_exits_4_and_a_bad_db_url_exits_2(tmp_path: Path) -> None:
    notes = tmp_path / "notes.db"
    notes.write_text("not a database\n")
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "listen_host": "127.0.0.1",
                "listen_port": 0,
                "storage_type": "sqlite",
                "storage_config": {"db_url": f"sqlite://{tmp_path}/t.db"},
                "llm_routes": {"m": {"base_url": "http://127.0.0.1:9/v1"}},
            }
        )
    )
    refused = socket.create_server(("127.0.0.1", 0))
    port = refused.getsockname()[1]
    refused.close()  # nothing listens there now

    def run(db_url: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "--config", str(cfg), "--db-url", db_url],
            capture_output=True,
            text=True,
            timeout=120,
            env=os.environ.copy(),
        )

    p = run(str(notes))
    assert (p.returncode, p.stderr.strip()) == (
        4,
        f"error: storage sqlite://{notes}: cannot open the database (DatabaseError: file is not a database)",
    )
    assert notes.read_text() == "not a database\n"
    p = run(f"postgresql://u:pw@127.0.0.1:{port}/db")  # the config's storage_type gives way to the URL
    assert p.returncode == 4 and p.stderr.startswith(
        f"error: storage postgresql://127.0.0.1:{port}/db: cannot open the database (ConnectionRefusedError: "
    ), p.stderr
    assert "pw" not in p.stderr and "Traceback" not in p.stderr
    p = run(str(tmp_path / "nowhere" / "t.db"))  # validated as the config's own value would be
    assert (
        p.returncode == 2 and f"the folder {tmp_path}/nowhere of the SQLite file does not exist" in p.stderr
    )
    assert not (tmp_path / "t.db").exists()


def test_a_port_out_of_range_or_a_folder_as_db_url_is_one_line_naming_the_flag_or_the_file(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump({"listen_port": 70000, "storage_config": {"db_url": f"sqlite://{tmp_path}/t.db"}})
    )

    def run(*args: str) -> tuple[int, str]:
        p = subprocess.run(
            [sys.executable, "-m", "gateway", "--config", str(cfg), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=os.environ.copy(),
        )
        return p.returncode, p.stderr

    assert run() == (
        2,
        f"error: gateway config {cfg}: listen_port: Input should be less than or equal to 65535\n",
    )
    assert run("--port", "99999") == (2, "error: --port: Input should be less than or equal to 65535\n")
    assert run("--port", "0", "--db-url", str(tmp_path)) == (
        2,
        f"error: --db-url: storage '{tmp_path}': {tmp_path} is a folder, not a SQLite file\n",
    )
    assert not (tmp_path / "t.db").exists()


def test_a_route_whose_server_the_launcher_starts_is_named_when_the_gateway_runs_alone() -> None:
    from gateway.__main__ import managed_warnings
    from gateway.settings import load_settings

    settings = load_settings(str(Path(__file__).resolve().parents[2] / "configs" / "gateway.yaml"))
    assert managed_warnings(settings) == [
        "warning: route 'local' is served by a model server the launcher starts (managed: "
        "llama_cpp_tokens); this gateway does not start it: start one on http://127.0.0.1:8081/v1 "
        "(configs/gateway.yaml says how) or its calls fail"
    ]
    plain = settings.model_copy(
        update={"llm_routes": {"x": settings.llm_routes["local"].model_copy(update={"managed": None})}}
    )
    assert managed_warnings(plain) == []
