"""Every output says where to look next: the run's last lines name ``view`` and ``report`` for the
job; ``report`` and ``export`` take the latest job when ``--job-id`` is left out (one line says
which); ``list --jobs`` lists a store's jobs; the report's links go where they were told."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from rollout.cli import feed, listing, viewer
from rollout.cli.run import report
from rollout.jobs.run import JobResult
from rollout.results.report import ReportTotals
from store import Store
from store.models import JobLock
from tests.feed.helpers import finish, make_job


async def _make_two_jobs(db: Path) -> None:
    store = Store(f"sqlite://{db}")
    await store.init()
    try:
        old = await make_job(store, "a-old", {"g": 1})
        await finish(store, old["g"][0], 10)
        new = await make_job(store, "b-new", {"g": 2})
        await finish(store, new["g"][0], 10)
        await finish(store, new["g"][1], 4)
    finally:
        await store.close()


def _two_jobs(db: Path) -> str:
    asyncio.run(_make_two_jobs(db))
    return f"sqlite://{db}"


def test_the_run_ends_with_the_commands_that_show_the_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = JobResult(
        job_id="j1", totals=ReportTotals(), out=tmp_path / "o.jsonl", store="sqlite:///abs/x.db"
    )
    assert report(result, True, "sqlite://my store.db") == 0  # relative: named by its absolute path
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "browse:  python launcher.py view --db-path sqlite:///abs/x.db   (job j1)",
        "report:  python launcher.py report --db-path sqlite:///abs/x.db --job-id j1",
    ]
    pg = JobResult(job_id="j1", totals=ReportTotals(), out=tmp_path / "o.jsonl", store="postgresql://h/db")
    assert report(pg, True, "postgresql://u:p@h/db") == 0  # as given: the named store has no credentials
    assert capsys.readouterr().out.splitlines()[-1] == (
        "report:  python launcher.py report --db-path postgresql://u:p@h/db --job-id j1"
    )


def test_export_and_report_take_the_latest_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = _two_jobs(tmp_path / "t.db")
    line = (
        f"job b-new: the latest of 2 job(s) in {db} (--job-id picks another; "
        f"python launcher.py list --jobs --db-path {db} lists them)"
    )
    assert feed.main(["export", "--db-path", db, "--out", str(tmp_path / "x.jsonl")]) == 0
    assert capsys.readouterr().err.splitlines() == [line]
    rows = [json.loads(x) for x in (tmp_path / "x.jsonl").read_text().splitlines()]
    assert [r["job_id"] for r in rows] == ["b-new", "b-new"]

    assert (
        viewer.main(
            [
                "report",
                "--db-path",
                db,
                "--out",
                str(tmp_path / "r.html"),
                "--viewer-url",
                "http://viewer.test:9000/",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [line]
    assert (
        captured.out
        == f"report written to {tmp_path / 'r.html'}; session links to http://viewer.test:9000/\n"
    )
    html = (tmp_path / "r.html").read_text()
    assert 'href="http://viewer.test:9000/sessions/b-new-g-0"' in html and "127.0.0.1:8765" not in html


def test_a_report_without_a_running_viewer_says_where_its_links_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _two_jobs(tmp_path / "t.db")
    monkeypatch.setattr(viewer, "viewer_serves", lambda url, job: False)
    assert (
        viewer.main(["report", "--job-id", "a-old", "--db-path", db, "--out", str(tmp_path / "r.html")]) == 0
    )
    assert capsys.readouterr().err == (
        "warning: no viewer of job a-old runs at http://127.0.0.1:8765: the report's session links point there; "
        f"start one (python launcher.py view --db-path {db}) or pass --viewer-url\n"
    )
    monkeypatch.setattr(
        viewer, "viewer_serves", lambda url, job: (url, job) == ("http://127.0.0.1:8765", "a-old")
    )
    assert (
        viewer.main(["report", "--job-id", "a-old", "--db-path", db, "--out", str(tmp_path / "r.html")]) == 0
    )
    assert capsys.readouterr().err == ""


def test_list_jobs_marks_a_job_left_unfinished_and_says_how_to_finish_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _two_jobs(tmp_path / "t.db")

    async def part() -> None:
        store = Store(db)
        await store.init()
        try:
            made = await make_job(store, "c-part", {"g": 3})
            await finish(store, made["g"][0], 10)
        finally:
            await store.close()

    asyncio.run(part())
    assert listing.main(["--jobs", "--db-path", db]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[:1] + lines[2].split()[3:] == ["c-part", "3", "1", "(unfinished)", "toy", "10.00"]
    assert lines[-1] == (  # its sessions were graded: the resume grades too
        "unfinished: the job's own command with --resume --job-id c-part runs the rest, e.g. python launcher.py "
        f"--resume --job-id c-part --enable-evaluation --db-path {db} with the run's --agent-root or --tasks, "
        "--gateway-config, --llm-model and --image when it had them (docs/outcomes.md, Resume)"
    )

    async def hold() -> None:
        store = Store(db)
        await store.init()
        try:
            held = JobLock(job_id="c-part", owner="o", pid=os.getpid(), host=socket.gethostname())
            assert await store.take_job_lock(held, 60, lambda lock: False) is None
        finally:
            await store.close()

    asyncio.run(hold())  # a launcher runs it: said so, and no resume is advised
    assert listing.main(["--jobs", "--db-path", db]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[:1] + lines[2].split()[3:] == ["c-part", "3", "1", "(running)", "toy", "10.00"]
    assert len(lines) == 5

    async def killed() -> None:  # its launcher was killed (SIGKILL): its lock stays, fresh, its pid is gone
        ended = subprocess.Popen(["true"])
        ended.wait()  # a pid that existed and ended
        store = Store(db)
        try:
            await store.release_job_lock("c-part", "o")
            dead = JobLock(job_id="c-part", owner="p", pid=ended.pid, host=socket.gethostname())
            assert await store.take_job_lock(dead, 60, lambda lock: False) is None
        finally:
            await store.close()

    asyncio.run(killed())  # not running: a resume takes it over at once on this host, and is advised
    assert listing.main(["--jobs", "--db-path", db]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[5:6] == ["(unfinished)"] and lines[-1].startswith("unfinished: ")


def test_list_jobs_lists_the_stores_jobs_newest_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _two_jobs(tmp_path / "t.db")
    assert listing.main(["--jobs", "--db-path", db, "--json"]) == 0
    jobs = json.loads(capsys.readouterr().out)
    assert [(j["job_id"], j["sessions"], j["finished"], j["envs"], j["mean_score"]) for j in jobs] == [
        ("b-new", 2, 2, ["toy"], 7.0),
        ("a-old", 1, 1, ["toy"], 10.0),
    ]
    assert listing.main(["--jobs", "--db-path", db]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["job", "created", "(UTC)", "sessions", "finished", "envs", "mean"]
    assert lines[2].split()[:1] + lines[2].split()[3:] == ["b-new", "2", "2", "toy", "7.00"]
    assert lines[3].split()[:1] + lines[3].split()[3:] == ["a-old", "1", "1", "toy", "10.00"]
    assert len(lines) == 4  # every job finished: nothing to say under the table
    assert listing.main(["--jobs", "--db-path", f"sqlite://{tmp_path / 'none.db'}"]) == 1
    assert (
        capsys.readouterr().err
        == f"error: no trajectory store at {tmp_path / 'none.db'} (run a job first, or pass --db-path)\n"
    )
