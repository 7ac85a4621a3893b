"""``python -m gateway`` as a process: a gateway that cannot listen on its address exits before
its app starts, leaving the store as it was (it must not mark the sessions of the gateway that
holds the port as interrupted)."""

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
    cfg.write_text(yaml.safe_dump({"listen_host": "127.0.0.1", "listen_port": port,
                                   "storage_config": {"db_url": f"sqlite://{db}"},
                                   "llm_routes": {"m": {"base_url": "http://127.0.0.1:9/v1"}}}))
    try:
        p = subprocess.run([sys.executable, "-m", "gateway", "--config", str(cfg)], capture_output=True, text=True,
                           timeout=120, env=os.environ.copy())
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
