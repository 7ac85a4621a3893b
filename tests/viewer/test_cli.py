"""``launcher.py view`` and ``launcher.py report`` refuse what they cannot read, with a clear
message and exit code 1, and create nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.viewer.conftest import REPO, launcher_env


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "launcher.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=launcher_env(),
        timeout=120,
    )


def test_view_and_report_without_a_store(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    view = run("view", "--db-path", f"sqlite://{missing}", "--port", "0", cwd=tmp_path)
    assert view.returncode == 1 and f"no trajectory store at {missing}" in view.stderr
    report = run("report", "--job-id", "j", "--db-path", "mysql://h/db", cwd=tmp_path)
    assert report.returncode == 1 and "unsupported storage URL" in report.stderr
    assert not missing.exists() and not (tmp_path / "runs").exists()


def test_view_needs_known_flags(tmp_path: Path) -> None:
    bad = run("view", "--bogus", cwd=tmp_path)
    assert bad.returncode == 2 and "unrecognized arguments: --bogus" in bad.stderr
    no_store = run(
        "report", cwd=tmp_path
    )  # no --job-id: the latest job of the default store, which is missing
    assert (no_store.returncode, no_store.stderr) == (
        1,
        f"error: no trajectory store at {tmp_path / 'env_trajs.db'} (run a job first, or pass --db-path)\n",
    )


def test_a_file_that_is_not_sqlite_is_one_line_without_sqlalchemys_link(tmp_path: Path) -> None:
    notes = tmp_path / "notes.db"
    notes.write_text("these are notes\n")
    for cmd in (["report", "--job-id", "j"], ["view", "--port", "0"]):
        p = run(*cmd, "--db-path", str(notes), cwd=tmp_path)
        assert (p.returncode, p.stderr) == (
            1,
            f"error: cannot read {notes}: DatabaseError: file is not a database\n",
        )
    assert notes.read_text() == "these are notes\n"


def test_an_unknown_flag_is_refused_with_the_verbs_own_usage(capsys: pytest.CaptureFixture[str]) -> None:
    from rollout.cli import feed, viewer
    from rollout.cli.verbs import parse_verb

    for build, argv, verb in [
        (viewer.build_parser, ["view", "--bogus"], "view"),
        (viewer.build_parser, ["report", "--job-id", "j", "--bogus", "x"], "report"),
        (feed.build_parser, ["export", "--job-id", "j", "--bogus"], "export"),
    ]:
        with pytest.raises(SystemExit) as e:
            parse_verb(build(), argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"launcher.py {verb}: error: unrecognized arguments: --bogus" in err
        assert f"usage: launcher.py {verb} " in err
    assert parse_verb(viewer.build_parser(), ["report", "--job-id", "j"]).job_id == "j"


def test_the_first_line_is_the_address_even_with_stderr_merged(tmp_path: Path) -> None:
    """A fresh store (the viewer creates its indexes): with ``2>&1`` the first line is still the
    address (scripts using ``--port 0`` read it); the index names go to the INFO log."""
    db = tmp_path / "t.db"
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "import asyncio, sys\nfrom store import Store\n"
            "async def m():\n    s = Store(sys.argv[1]); await s.init(); await s.close()\n"
            "asyncio.run(m())",
            f"sqlite://{db}",
        ],
        env=launcher_env(),
        timeout=120,
    )
    assert made.returncode == 0
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "launcher.py"), "view", "--db-path", f"sqlite://{db}", "--port", "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=launcher_env(),
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("viewer on http://127.0.0.1:"), first
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "created indexes" not in first + out


def _read_only(folder: Path, *argv: str) -> list[str]:
    """``argv`` run with ``folder`` mounted read-only (its own mount namespace; exec'd, so signals reach
    it). Skips (fails under CI=true) where a mount namespace cannot be made."""
    cmd = ["unshare", "-rm", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(folder)]
    probe = subprocess.run([*cmd, "sh", "-c", f"! touch {folder}/probe 2>/dev/null"], capture_output=True)
    if probe.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"a read-only mount cannot be made here: {probe.stderr!r}")
        pytest.skip(f"a read-only mount cannot be made here: {probe.stderr!r}")
    return [*cmd, *argv]


def test_view_export_and_report_read_a_read_only_store(tmp_path: Path) -> None:
    """The store's file and folder read-only (a mount: root ignores file modes): the viewer serves
    its pages and searches (its index in a temporary folder), export and report write their files
    elsewhere; the store's folder is left as it was."""
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / "t.db"
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "import asyncio, sys\nfrom store import Store\n"
            "from tests.feed.helpers import finish, make_job\n"
            "async def m():\n    s = Store(sys.argv[1]); await s.init()\n"
            "    ids = await make_job(s, 'j', {'a': 2})\n"
            "    await finish(s, ids['a'][0], 1.0); await finish(s, ids['a'][1], 0.0)\n"
            "    await s.close()\n"
            "asyncio.run(m())",
            f"sqlite://{db}",
        ],
        cwd=REPO,
        env=launcher_env(),
        timeout=120,
    )
    assert made.returncode == 0
    before = sorted((p.name, p.read_bytes()) for p in folder.iterdir())
    assert [name for name, _ in before] == ["t.db"]
    env = {**launcher_env(), "TMPDIR": str(tmp_path)}
    launcher = [sys.executable, str(REPO / "launcher.py")]
    out = tmp_path / "out"
    exported = subprocess.run(
        _read_only(
            folder,
            *launcher,
            "export",
            "--job-id",
            "j",
            "--db-path",
            f"sqlite://{db}",
            "--out",
            str(out / "e.jsonl"),
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert (exported.returncode, exported.stdout) == (
        0,
        f"2 rows (jsonl, one per session) written to {out}/e.jsonl\n",
    ), exported.stderr
    assert [json.loads(line)["session_id"] for line in (out / "e.jsonl").read_text().splitlines()] == [
        "j-a-0",
        "j-a-1",
    ]
    reported = subprocess.run(
        _read_only(
            folder,
            *launcher,
            "report",
            "--job-id",
            "j",
            "--db-path",
            f"sqlite://{db}",
            "--out",
            str(out / "r.html"),
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert (reported.returncode, reported.stdout) == (
        0,
        f"report written to {out}/r.html; session links to http://127.0.0.1:8765\n",
    ), reported.stderr
    assert "j-a-0" in (out / "r.html").read_text()
    proc = subprocess.Popen(
        _read_only(folder, *launcher, "view", "--db-path", f"sqlite://{db}", "--port", "0"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("viewer on http://127.0.0.1:"), first
        url = first.split()[2].rstrip("/")
        with httpx.Client(base_url=url, timeout=60) as http:
            assert http.get("/").status_code == 200
            assert http.get("/jobs/j").status_code == 200
            for _ in range(100):  # the start's indexing runs beside the first searches
                found = http.get("/search", params={"q": "answer"})
                assert found.status_code == 200, found.text
                if 'id="search-pending"' not in found.text:
                    break
            assert (
                'href="/sessions/j-a-0#step-1"' in found.text
                and 'href="/sessions/j-a-1#step-1"' in found.text
            )
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "the index is built in" in err
    assert (
        "warning: cannot create the viewer's indexes (OperationalError: attempt to write a readonly database); "
        "large jobs will page slowly\n"
    ) in err
    assert sorted((p.name, p.read_bytes()) for p in folder.iterdir()) == before
    assert not list(tmp_path.glob("rollout-search-*"))  # the temporary index is removed
