"""A runtime that plants links in its workspace to host files (its own case's expected.json, found
by the env folder's host path) must not get them graded: the links that leave the workspace are
deleted before the evaluator, which runs on the host, reads the workspace."""

from __future__ import annotations

import json
from pathlib import Path

from env.workspace.rule_evaluator import load_answer
from rollout.runner import run_runtime
from rollout.workspace_archive import drop_unsafe_entries
from tests.rollout.sandbox_helpers import make_env, request, require_bwrap

PLANT = r'''
import json, os, sys
req = json.loads(sys.stdin.read())
expected = req["env_params"]["expected_path"]
os.makedirs("outputs", exist_ok=True)
os.symlink(expected, "outputs/answer.json")              # absolute, to a host file the sandbox hides
os.symlink("../../../../../../../../" + expected.lstrip("/"), "rel_escape")  # relative, leaving it
with open("kept.txt", "w") as f:
    f.write("mine")
os.symlink("kept.txt", "inside_link")                     # stays inside: kept
print(json.dumps({"session_id": req["session_id"], "status": "succeeded"}))
'''


async def test_links_leaving_the_workspace_are_removed_before_grading(tmp_path: Path) -> None:
    require_bwrap()
    secret = tmp_path / "tasks" / "t1" / "expected.json"
    secret.parent.mkdir(parents=True)
    secret.write_text(json.dumps({"answer": 42}))
    cfg = make_env(tmp_path / "envs", "plant", PLANT)
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await run_runtime(cfg, request(expected_path=str(secret)), ws, {})
    assert out.status == "succeeded", out.stderr_tail
    assert sorted(p.name for p in ws.iterdir()) == ["inside_link", "kept.txt", "outputs"]
    assert (ws / "inside_link").read_text() == "mine"
    assert load_answer(str(ws)) == (None, "outputs/answer.json is missing")


def test_drop_unsafe_entries_names_what_it_removed(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "up").symlink_to("../..")
    (tmp_path / "abs").symlink_to(tmp_path / "d")  # absolute, even to inside: a sandbox path, not this host's
    (tmp_path / "ok").symlink_to("d")
    assert sorted(drop_unsafe_entries(tmp_path)) == ["abs: link to " + str(tmp_path / "d"), "d/up: link to ../.."]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "ok"]


FIFO = r'''
import json, os, sys
req = json.loads(sys.stdin.read())
os.makedirs("outputs", exist_ok=True)
os.mkfifo("outputs/answer.json")   # the evaluator's read would block until its timeout
print(json.dumps({"session_id": req["session_id"], "status": "succeeded"}))
'''


async def test_a_fifo_left_in_the_workspace_is_removed_before_grading(tmp_path: Path) -> None:
    require_bwrap()
    cfg = make_env(tmp_path / "envs", "fifo", FIFO)
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await run_runtime(cfg, request(), ws, {})
    assert out.status == "succeeded", out.stderr_tail
    assert list((ws / "outputs").iterdir()) == []
    assert load_answer(str(ws)) == (None, "outputs/answer.json is missing")


def test_drop_unsafe_entries_walks_folders_nested_deeper_than_recursion(tmp_path: Path) -> None:
    deep = tmp_path
    for _ in range(1100):  # deeper than Python's default recursion limit (1000)
        deep = deep / "a"
        deep.mkdir()
    (deep / "l").symlink_to("/etc/passwd")
    try:
        assert drop_unsafe_entries(tmp_path) == ["a/" * 1100 + "l: link to /etc/passwd"]
        assert not (deep / "l").is_symlink()
    finally:  # bottom-up: pytest's own clean-up of tmp_path recurses and would fail on this depth
        (deep / "l").unlink(missing_ok=True)
        while deep != tmp_path:
            deep.rmdir()
            deep = deep.parent
