"""The tests' throwaway PostgreSQL server cleans up after a test run that was killed: a server
whose owning process died is stopped and its folder deleted by the next start's sweep."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.pg_server import DIR_PREFIX, OWNER_FILE, PgServer, PgUnavailable, owner_alive, running, sweep_stale


def _postmaster(server: PgServer) -> int:
    assert server.dir is not None
    return int((server.dir / "data" / "postmaster.pid").read_text().split("\n", 1)[0])


def test_a_server_whose_owner_died_is_stopped_and_removed_by_the_sweep() -> None:
    root = Path(tempfile.mkdtemp(prefix="pgsweep-"))  # short: the server's Unix socket lives below it
    os.chmod(root, 0o755)  # the server user must enter it
    servers: list[PgServer] = []
    try:
        try:
            live, stale = PgServer(root=root).start(), PgServer(root=root).start()
        except PgUnavailable as e:
            pytest.skip(f"no PostgreSQL server here: {e}")
        servers += [live, stale]
        assert live.dir is not None and stale.dir is not None
        owner = json.loads((live.dir / OWNER_FILE).read_text())
        assert owner["pid"] == os.getpid() and owner_alive(owner)
        # the owner of ``stale`` was a pytest that is gone: a process that ran and was reaped
        gone = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            check=True,
        )
        dead_pid = int(gone.stdout)
        (stale.dir / OWNER_FILE).write_text(json.dumps({"pid": dead_pid, "start": "1"}))
        assert not owner_alive({"pid": dead_pid, "start": "1"})
        postmaster = _postmaster(stale)
        assert running(postmaster) and stale.sql(f"{stale.url}/postgres", "SELECT 1").strip() == "1"
        legacy = root / f"{DIR_PREFIX}legacy"  # a folder without an owner file: not ours to judge
        legacy.mkdir()

        assert sweep_stale(root) == [stale.dir]

        assert not running(postmaster) and not stale.dir.exists()
        with pytest.raises(PgUnavailable, match="psql failed"):
            stale.sql(f"{stale.url}/postgres", "SELECT 1")
        stale.dir = None  # nothing left to stop
        assert live.sql(f"{live.url}/postgres", "SELECT 1").strip() == "1"  # its owner runs: untouched
        assert legacy.is_dir() and (live.dir / "data").is_dir()
        assert sweep_stale(root) == []
    finally:
        for server in servers:
            if server.dir is not None and server.dir.exists():
                server.stop()
        shutil.rmtree(root, ignore_errors=True)
