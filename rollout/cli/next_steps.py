"""The lines that tell a user where to look next: the commands that show a job, and which job a
command chose when ``--job-id`` was left out."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterable
from pathlib import Path

import httpx

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher.py"


def launcher_command() -> str:
    """``python launcher.py`` as typed in the working folder: the script's absolute path when the
    working folder is another than the project's."""
    try:
        here = Path.cwd().resolve()
    except OSError:  # the working folder is gone
        here = None
    return "python launcher.py" if here == LAUNCHER.parent else f"python {shlex.quote(str(LAUNCHER))}"


def command_again(
    parser: argparse.ArgumentParser, argv: Iterable[str], drop: Iterable[str], add: Iterable[str]
) -> str:
    """The command that ran with ``argv`` (flags of ``parser``, no abbreviations) as typed again
    here: the flags whose ``dest`` is in ``drop`` (and their values) left out, ``add`` appended."""
    dropped, kept, skip = set(drop), [], False
    for token in argv:
        if skip:
            skip = False
            continue
        action = parser._option_string_actions.get(token.split("=", 1)[0]) if token.startswith("--") else None
        if action is not None and action.dest in dropped:
            skip = action.nargs != 0 and "=" not in token
            continue
        kept.append(token)
    return " ".join([launcher_command(), *map(shlex.quote, [*kept, *add])])


def latest_job_line(job_id: str, n_jobs: int, store: str) -> str:
    """The one line a command prints when it took the latest job for a missing ``--job-id``."""
    return (
        f"job {job_id}: the latest of {n_jobs} job(s) in {store} (--job-id picks another; "
        f"{launcher_command()} list --jobs --db-path {shlex.quote(store)} lists them)"
    )


def next_step_lines(job_id: str, db_path: str) -> list[str]:
    """The run's last lines: how to browse and report this job."""
    db, job, launcher = shlex.quote(db_path), shlex.quote(job_id), launcher_command()
    return [
        f"browse:  {launcher} view --db-path {db}   (job {job_id})",
        f"report:  {launcher} report --db-path {db} --job-id {job}",
    ]


def viewer_serves(url: str, job_id: str, timeout_s: float = 1.0) -> bool:
    """True when a viewer answers at ``url`` and lists ``job_id`` (it serves this job's store)."""
    try:
        r = httpx.get(url.rstrip("/") + "/api/jobs", timeout=timeout_s)
        jobs = r.json() if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        return False
    return isinstance(jobs, list) and any(isinstance(j, dict) and j.get("job_id") == job_id for j in jobs)
