"""The lines that tell a user where to look next: the commands that show a job, and which job a
command chose when ``--job-id`` was left out."""

from __future__ import annotations

import shlex

import httpx


def latest_job_line(job_id: str, n_jobs: int, store: str) -> str:
    """The one line a command prints when it took the latest job for a missing ``--job-id``."""
    return (
        f"job {job_id}: the latest of {n_jobs} job(s) in {store} (--job-id picks another; "
        f"python launcher.py list --jobs --db-path {shlex.quote(store)} lists them)"
    )


def next_step_lines(job_id: str, db_path: str) -> list[str]:
    """The run's last lines: how to browse and report this job."""
    db, job = shlex.quote(db_path), shlex.quote(job_id)
    return [
        f"browse:  python launcher.py view --db-path {db}   (job {job_id})",
        f"report:  python launcher.py report --db-path {db} --job-id {job}",
    ]


def viewer_serves(url: str, job_id: str, timeout_s: float = 1.0) -> bool:
    """True when a viewer answers at ``url`` and lists ``job_id`` (it serves this job's store)."""
    try:
        r = httpx.get(url.rstrip("/") + "/api/jobs", timeout=timeout_s)
        jobs = r.json() if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        return False
    return isinstance(jobs, list) and any(isinstance(j, dict) and j.get("job_id") == job_id for j in jobs)
