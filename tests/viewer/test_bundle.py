"""``report --bundle`` without a browser: session file names that cannot leave the folder, the
folders it refuses, the flags that do not apply, and a bundle of a small store's job (relative
links, every session a page and a JSON). The bundle opened from disk in Chromium:
tests/viewer/test_browser_reading.py."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from rollout.cli.viewer import main
from rollout.servers.viewer.bundle import KEYS_SHA256, MARKER, session_file, write_bundle
from rollout.servers.viewer.db import ViewerError
from rollout.servers.viewer.stats import HiddenFields
from store import JobEnvironment, Store, step_record


def test_session_file_names_stay_in_the_folder() -> None:
    assert session_file("0123abcdef") == "0123abcdef"
    for bad in ("../x", "a/b", ".hidden", "", "x" * 200, "é", "a\\b"):
        name = session_file(bad)
        assert re.fullmatch(r"s-[0-9a-f]{32}", name), bad
    assert session_file("../x") != session_file("a/b")


async def _store(db: Path) -> None:
    store = Store(f"sqlite://{db}")
    await store.init()
    await store.add_job_sessions(
        [
            JobEnvironment(
                session_id=sid,
                job_id="j",
                env_name="e",
                case_id="c",
                llm_model="m",
                group_id="g",
                sample_index=i,
                env_params={"dataset": {"q": "<b>q</b>", "answer": "HIDDEN-7"}},
            )
            for i, sid in enumerate(("s1", "../evil"))
        ]
    )
    await store.write_batch(
        [
            step_record(
                session_id="s1",
                seq=1,
                step_id=1,
                llm_model="m",
                endpoint="chat.completions",
                job_id="j",
                messages=[{"role": "user", "content": "<script>x</script>"}],
                response={"choices": [{"message": {"role": "assistant", "content": "hi"}}]},
            )
        ],
        [],
    )
    await store.update_job_session("s1", finished=True, status="succeeded", reward=10.0, eval_status="scored")
    await store.close()


def test_a_bundle_of_a_small_job(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    asyncio.run(_store(db))
    envs = tmp_path / "envs"
    (envs / "e").mkdir(
        parents=True
    )  # no env.yaml: hidden fields unknown, so no case row in the start request
    out = tmp_path / "b"
    index = asyncio.run(write_bundle(f"sqlite://{db}", "j", out, HiddenFields(envs)))
    assert index == out / "index.html" and (out / MARKER).is_file() and (out / "viewer.css").is_file()
    evil = session_file("../evil")
    assert sorted(p.name for p in (out / "sessions").iterdir()) == sorted(
        ["s1.html", "s1.json", f"{evil}.html", f"{evil}.json"]
    )
    assert not (tmp_path / "evil.html").exists()
    page = (out / "sessions" / "s1.html").read_text()
    assert "&lt;script&gt;x&lt;/script&gt;" in page and "<script>x</script>" not in page
    assert f'href="{evil}.html"' in page and 'href="../index.html"' in page
    assert (
        f"script-src 'sha256-{KEYS_SHA256}'" in page
        and "unsafe-inline" not in page
        and page.count("<script>") == 1
    )
    start = page.split('id="start-request">', 1)[1].split("</pre>", 1)[0]
    assert "HIDDEN-7" not in start
    transcript = json.loads((out / "sessions" / "s1.json").read_text())
    assert transcript["session"]["session_id"] == "s1" and transcript["steps"][0]["new_messages"] == [
        {"role": "user", "content": "<script>x</script>"}
    ]
    html = index.read_text()
    links = re.findall(r'(?:href|src)="([^"]*)"', html)
    assert "sessions/s1.html" in links and f"sessions/{evil}.html" in links
    assert all("://" not in u and not u.startswith("/") for u in links), links
    with pytest.raises(ViewerError, match="no job 'nope'"):
        asyncio.run(write_bundle(f"sqlite://{db}", "nope", tmp_path / "c", HiddenFields(envs)))


def test_folders_a_bundle_refuses(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("x")
    for folder, problem in (
        (tmp_path / "file", "is a file, not a folder"),
        (tmp_path / "file" / "b", "is a file, not a folder"),
        (tmp_path / "full", "is not empty and holds no earlier bundle"),
    ):
        with pytest.raises(ViewerError, match=problem):
            asyncio.run(write_bundle("sqlite:///nowhere.db", "j", folder, HiddenFields(tmp_path)))
    assert (tmp_path / "full" / "mine.txt").read_text() == "x"


def test_flags_that_do_not_apply_to_a_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (["--out", str(tmp_path / "r.html")], ["--self-contained"], ["--viewer-url", "http://h:1"]):
        assert main(["report", "--job-id", "j", "--bundle", str(tmp_path / "b"), *extra]) == 2
        assert "--bundle writes a folder of its own" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
