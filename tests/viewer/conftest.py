"""Fixtures of the viewer tests: two real jobs of the toy env through the launcher (real gateway,
runtimes and evaluator; the fake upstream as the model) in one temporary store, the viewer
serving it as a real subprocess, and headless Chromium (the system's, never a downloaded one)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fake_upstream import FakeUpstream
from tests.viewer.toy_env import gateway_config, make_env, model_reply

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Jobs:
    root: Path
    db: Path
    env_root: Path
    report: Path
    outputs: dict[str, tuple[int, str, str]]


def launcher_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


async def launch(*args: str, cwd: Path) -> tuple[int, str, str]:
    """Run launcher.py with ``args`` (plus ``--no-progress``); (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "launcher.py"),
        *args,
        "--no-progress",
        cwd=str(cwd),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=launcher_env(),
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
    return proc.returncode or 0, out.decode(), err.decode()


def job_args(env_root: Path, cfg: Path, db: Path, job_id: str, group: int, tmp: Path) -> list[str]:
    return [
        "--agent-root",
        str(env_root),
        "--gateway-config",
        str(cfg),
        "--llm-model",
        "fake",
        "--db-path",
        f"sqlite://{db}",
        "--enable-evaluation",
        "--pool-size",
        "3",
        "--rl-group-size",
        str(group),
        "--job-id",
        job_id,
        "--out",
        str(tmp / f"{job_id}.jsonl"),
    ]


async def _run_jobs(root: Path) -> Jobs:
    env_root = make_env(root / "envs")
    db = root / "trajs.db"
    report = root / "jobA-report.html"
    outputs: dict[str, tuple[int, str, str]] = {}
    for job_id, diverge, group in (("jobA", True, 2), ("jobB", False, 1)):
        async with FakeUpstream() as up:
            up.script(None, [model_reply(diverge)] * 100)
            cfg = gateway_config(root / f"gw-{job_id}.yaml", up.base_url, db)
            extra = ["--report", str(report)] if job_id == "jobA" else []
            outputs[job_id] = await launch(
                *job_args(env_root, cfg, db, job_id, group, root), *extra, cwd=root
            )
    return Jobs(root=root, db=db, env_root=env_root, report=report, outputs=outputs)


@pytest.fixture(scope="session")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    """jobA (3 cases x 2 samples; sample 1 of case ``logs`` answers wrong, case ``crash``
    crashes) and jobB (3 cases x 1 sample, all answers right), with jobA's ``--report``."""
    return asyncio.run(_run_jobs(tmp_path_factory.mktemp("viewer-jobs")))


class Viewer:
    """``launcher.py view`` as a subprocess; ``url`` is where it listens."""

    def __init__(self, db: Path, agent_root: Path, cwd: Path) -> None:
        self.log = cwd / "viewer.log"  # a file, not a pipe: a full pipe would block the viewer
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(REPO / "launcher.py"),
                    "view",
                    "--db-path",
                    f"sqlite://{db}",
                    "--port",
                    "0",
                    "--agent-root",
                    str(agent_root),
                ],
                cwd=str(cwd),
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=launcher_env(),
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until the viewer listens (or exits)
        if not line.startswith("viewer on "):
            self.stop()
            raise AssertionError(f"viewer did not start: {line!r} {self.log.read_text(errors='replace')}")
        self.url = line.split()[2].rstrip("/")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(scope="session")
def viewer(jobs: Jobs) -> Iterator[Viewer]:
    v = Viewer(jobs.db, jobs.env_root, jobs.root)
    yield v
    v.stop()


def need_chromium() -> None:
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing: scripts/setup.sh installs the Debian package chromium")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless system Chromium driven by playwright's sync API, per test module: the sync API
    runs an event loop of its own while open, so it must be closed before async tests run."""
    need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(30_000)
    yield pg
    ctx.close()
