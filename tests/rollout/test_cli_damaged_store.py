"""A database file damaged on disk gets one line naming the problem from the launcher's commands,
never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from store import JobEnvironment, Store

ROOT = Path(__file__).resolve().parents[2]


async def _damaged_store(path: Path) -> None:
    store = Store(f"sqlite://{path}")
    await store.init()
    try:
        await store.add_job_sessions(
            [
                JobEnvironment(
                    session_id=f"s{i:04d}",
                    job_id="j",
                    env_name="e",
                    case_id=f"c{i}" * 40,
                    llm_model="m",
                    group_id=f"g{i}",
                    env_params={"dataset": {"q": "x" * 200}},
                )
                for i in range(400)
            ]
        )
    finally:
        await store.close()
    size = path.stat().st_size
    with open(path, "r+b") as f:  # the last pages of the file overwritten with noise
        f.seek(size - 6 * 4096)
        f.write(os.urandom(6 * 4096))


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "--job-id", "j", "--out", "OUT"],
        # a resumed job reads its rows before it checks the running gateway (a new job checks the gateway first)
        [
            "--env",
            "basics",
            "--agent-root",
            str(ROOT / "env"),
            "--gateway-base-url",
            "http://127.0.0.1:1/v1/sessions",
            "--job-id",
            "j",
            "--resume",
        ],
    ],
)
async def test_a_damaged_database_is_one_line_of_error(tmp_path: Path, argv: list[str]) -> None:
    db = tmp_path / "t.db"
    await _damaged_store(db)
    argv = [str(tmp_path / "out.jsonl") if a == "OUT" else a for a in argv]
    p = subprocess.run(
        [sys.executable, str(ROOT / "launcher.py"), *argv, "--db-path", f"sqlite://{db}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert "error: the store cannot be" in p.stderr and "malformed" in p.stderr, p.stderr
