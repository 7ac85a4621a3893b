"""The grader sandbox holds against hostile answers and hostile graders: the evaluator reads a copy
of the final workspace as data (no links, no FIFOs, capped), from a snapshot of its env root,
in its own bubblewrap child with limits; whatever it does fails that session's evaluation only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from rollout.contract.protocol import EvalRequest, EvalSpec, Trajectory
from rollout.grading.grader import Grader
from rollout.grading.sandbox import CHILD, ForkServer, GraderLimits
from tests.rollout.sandbox_helpers import process_parents, require_bwrap, workspace_tool_call_run

REPO = Path(__file__).resolve().parents[2]
WORKSPACE_EVALUATOR = REPO / "env" / "workspace" / "rule_evaluator.py"


def request(sid: str, expected: object = None) -> EvalRequest:
    return EvalRequest(
        job_id="j",
        session_id=sid,
        env_name="t",
        case_id="c",
        group_id="g",
        sample_index=0,
        model="m",
        env_params={"dataset": {"expected": expected}},
    )


def spec(path: Path, timeout_s: float = 60.0) -> EvalSpec:
    return EvalSpec(eval_id="t/rule", timeout_s=timeout_s, evaluator_path=str(path))


def env_root(tmp_path: Path, code: str, name: str = "t") -> Path:
    """``<tmp>/envs/<name>/rule_evaluator.py`` holding ``code``; returns the evaluator's path."""
    path = tmp_path / "envs" / name / "rule_evaluator.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code)
    return path


def grader_children() -> list[int]:
    """Pids of this test process's descendants still running that are a grader's bwrap or child."""
    parent = process_parents()
    found: list[int] = []
    me = os.getpid()
    for pid in parent:
        p = pid
        while p > 1 and p in parent:
            p = parent[p]
            if p == me:
                found.append(pid)
                break
    return [pid for pid in found if _is_grader(pid)]


def _is_grader(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(CHILD).encode() in cmdline or b"bwrap" in cmdline


async def test_links_fifos_and_huge_files_in_the_workspace_are_never_followed(tmp_path: Path) -> None:
    require_bwrap()
    secret = tmp_path / "tasks" / "t1" / "expected.json"
    secret.parent.mkdir(parents=True)
    secret.write_text(json.dumps({"answer": 42}))
    ws = tmp_path / "ws"
    (ws / "outputs").mkdir(parents=True)
    (ws / "outputs" / "answer.json").symlink_to(secret)  # absolute, to the host's expected answer
    (ws / "rel").symlink_to("../tasks/t1/expected.json")  # relative, leaving the workspace
    os.mkfifo(ws / "fifo.json")  # a read would block for ever
    with open(ws / "huge.json", "wb") as f:  # sparse: 600 MB that take no disk
        f.truncate(600 * 1024 * 1024)
    fd = os.open(ws, os.O_RDONLY)  # nested past PATH_MAX
    for _ in range(120):
        os.mkdir("d" * 60, dir_fd=fd)
        fd, old = os.open("d" * 60, os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)
    async with Grader("bwrap", work_dir=tmp_path) as grader:
        await grader.start([WORKSPACE_EVALUATOR.parent.parent])
        out = await grader.evaluate(
            WORKSPACE_EVALUATOR,
            request("s1", {"answer": 42}),
            spec(WORKSPACE_EVALUATOR),
            Trajectory(session_id="s1"),
            ws,
        )
    assert (out.status, out.score, out.reason, out.isolation) == (
        "scored",
        0.0,
        "outputs/answer.json is missing",
        "bwrap",
    )


async def test_the_bundled_grader_scores_a_real_answer_in_the_sandbox(tmp_path: Path) -> None:
    require_bwrap()
    ws = tmp_path / "ws"
    (ws / "outputs").mkdir(parents=True)
    (ws / "outputs" / "answer.json").write_text(json.dumps({"answer": 42}))
    async with Grader("bwrap", work_dir=tmp_path) as grader:
        await grader.start([WORKSPACE_EVALUATOR.parent.parent])
        out = await grader.evaluate(
            WORKSPACE_EVALUATOR,
            request("s1", {"answer": 42}),
            spec(WORKSPACE_EVALUATOR),
            Trajectory(session_id="s1"),
            ws,
        )
    assert (out.status, out.score, out.isolation) == ("scored", 10.0, "bwrap")
    assert out.artifacts == {"answer": {"answer": 42}}


HOSTILE = """
import os
def evaluate(request, spec, trajectory):
    # what graders of code tasks do: run the agent's code; here the answer is hostile
    exec(open(os.path.join(request.workspace, "solution.py")).read(), {"__name__": "answer"})
    return 0
"""

ANSWER = """
import os
tried = []
for target in (OTHER_EXPECTED, EVALUATOR, os.path.join(os.environ.get("HOME", "/"), "x")):
    try:
        with open(target, "w") as f:
            f.write('{"answer": "pwned"}')
        tried.append("wrote " + target)
    except OSError as e:
        tried.append(type(e).__name__)
raise RuntimeError(";".join(tried) + "|" + os.environ.get("LAUNCHER_SECRET", "no secret"))
"""


async def test_a_hostile_answer_run_by_the_grader_cannot_touch_envs_secrets_or_the_grader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_bwrap()
    monkeypatch.setenv("LAUNCHER_SECRET", "s3cr3t")
    path = env_root(tmp_path, HOSTILE)
    other = (
        env_root(tmp_path, "def evaluate(r, s, t):\n    return 1\n", name="other").parent / "expected.json"
    )
    other.write_text('{"answer": 1}')
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "solution.py").write_text(
        ANSWER.replace("OTHER_EXPECTED", repr(str(other))).replace("EVALUATOR", repr(str(path)))
    )
    async with Grader("bwrap", work_dir=tmp_path) as grader:
        await grader.start([path.parent.parent])
        out = await grader.evaluate(path, request("s1"), spec(path), Trajectory(session_id="s1"), ws)
    assert out.status == "error" and out.reason is not None
    assert out.reason.startswith("RuntimeError: OSError;OSError;") and out.reason.endswith("|no secret"), (
        out.reason
    )
    assert other.read_text() == '{"answer": 1}'
    assert path.read_text() == HOSTILE


async def test_an_evaluator_changed_during_the_job_is_not_reloaded(tmp_path: Path) -> None:
    require_bwrap()
    path = env_root(tmp_path, "def evaluate(r, s, t):\n    return 3\n")
    async with Grader("bwrap", work_dir=tmp_path) as grader:
        await grader.start([path.parent.parent])
        first = await grader.evaluate(path, request("s1"), spec(path), Trajectory(session_id="s1"), None)
        path.write_text("def evaluate(r, s, t):\n    return 10\n")
        second = await grader.evaluate(path, request("s2"), spec(path), Trajectory(session_id="s2"), None)
    assert (first.score, second.score) == (3.0, 3.0)


@pytest.mark.parametrize(
    ("code", "status", "reason"),
    [
        (
            'import os\ndef evaluate(r, s, t):\n    print(\'{"status": "scored", "score": 10}\')\n    os._exit(0)\n',
            "error",
            'the grader exited with code 0 without a result: {"status": "scored", "score": 10}',
        ),
        ("import sys\ndef evaluate(r, s, t):\n    sys.exit(0)\n", "error", "SystemExit: 0"),
        (
            "import os, signal\ndef evaluate(r, s, t):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
            "error",
            "the grader exited with code 137 without a result: no output",
        ),  # 128 + SIGKILL, from bwrap
        ("def evaluate(r, s, t):\n    x = bytearray(6 * 1024 ** 3)\n    return 10\n", "error", None),
        (
            "import socket\ndef evaluate(r, s, t):\n    socket.create_connection(('1.1.1.1', 80), timeout=5)\n    return 10\n",
            "error",
            "OSError: [Errno 101] Network is unreachable",
        ),
        (
            "import time\ndef evaluate(r, s, t):\n    time.sleep(600)\n",
            "timeout",
            "evaluator timed out after 3.0 s",
        ),
        (
            "def evaluate(r, s, t):\n    while True:\n        print('x' * 65536)\n",
            "error",
            "the grader printed more than 1 MiB",
        ),
    ],
)
async def test_a_hostile_grader_fails_its_session_only_and_leaves_nothing_behind(
    tmp_path: Path, code: str, status: str, reason: str | None
) -> None:
    require_bwrap()
    path = env_root(tmp_path, code)
    limits = GraderLimits(memory_mb=512, output_bytes=1024 * 1024)
    async with Grader("bwrap", work_dir=tmp_path, limits=limits) as grader:
        await grader.start([path.parent.parent])
        out = await grader.evaluate(
            path,
            request("s1"),
            spec(path, timeout_s=3.0 if "sleep" in code else 60.0),
            Trajectory(session_id="s1"),
            None,
        )
    assert (out.status, out.score) == (status, 0.0), out.reason
    if reason is not None:
        assert out.reason == reason
    else:  # the memory cap: the kernel's OOM killer (cgroup) or a MemoryError (RLIMIT_AS)
        assert out.reason in ("the grader exceeded its memory limit (512 MiB)", "MemoryError: "), out.reason
    assert grader_children() == []
    # no thread ran it (idle ones of in-process evaluations of other tests are named evaluator-idle)
    assert [t.name for t in threading.enumerate() if t.name.startswith("evaluator-t/")] == []


async def test_isolation_none_runs_in_the_launcher_on_the_same_copy(tmp_path: Path) -> None:
    path = env_root(
        tmp_path,
        "import os\ndef evaluate(r, s, t):\n"
        "    return {'score': 4, 'reason': ' '.join(sorted(os.listdir(r.workspace)))}\n",
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a")
    (ws / "link").symlink_to("/etc/passwd")
    async with Grader("none", work_dir=tmp_path) as grader:
        await grader.start([path.parent.parent])
        out = await grader.evaluate(path, request("s1"), spec(path), Trajectory(session_id="s1"), ws)
    assert (out.status, out.score, out.reason, out.isolation) == ("scored", 4.0, "a.txt", "none")


async def test_a_model_answer_linking_the_expected_answer_through_the_bash_tool_scores_0(
    tmp_path: Path,
) -> None:
    """End to end: the real launcher, gateway, sandbox and bash tool; the model's one command links
    the task's expected.json (its host path is in the env's folder, known to the model) as the answer
    and nests folders past PATH_MAX (which made the old pre-grading sweep give up)."""
    require_bwrap()
    task = sorted((REPO / "env" / "workspace" / "tasks").iterdir())[0]
    deep = (
        'import os\\nfd = os.open(".", os.O_RDONLY)\\nfor _ in range(100):\\n'
        '    os.mkdir("d" * 60, dir_fd=fd); fd = os.open("d" * 60, os.O_RDONLY, dir_fd=fd)'
    )
    command = (
        f"mkdir -p outputs && ln -s {task}/expected.json outputs/answer.json && "
        f"printf '{deep}' > deep.py && python3 deep.py && ls -la outputs"
    )
    run = await workspace_tool_call_run(tmp_path, command, "links")
    assert run.code == 0, run.stderr
    r = run.record
    assert f"answer.json -> {task}/expected.json" in r["trajectory"][1]["messages"][-1]["content"]  # made
    assert (r["sandbox"], r["grader_isolation"], r["eval_status"], r["score"], r["reason"]) == (
        "bwrap",
        "bwrap",
        "scored",
        0.0,
        "outputs/answer.json is missing",
    )


async def test_an_env_root_too_large_to_snapshot_is_refused_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollout.grading import grader as grader_module

    path = env_root(tmp_path, "def evaluate(r, s, t):\n    return 1\n")
    for i in range(5):
        (path.parent / f"data{i}.txt").write_text("x")
    monkeypatch.setattr(grader_module, "SNAPSHOT_MAX_FILES", 3)
    async with Grader("none", work_dir=tmp_path) as grader:
        with pytest.raises(
            grader_module.GraderSetupError, match="holds more than .* 3 files: the grader snapshots"
        ):
            await grader.start([path.parent.parent])


async def test_a_grader_outside_the_project_may_import_the_bundled_env_package(tmp_path: Path) -> None:
    require_bwrap()
    path = env_root(tmp_path, "from env.workspace.rule_evaluator import evaluate\n", name="copy_of_basics")
    ws = tmp_path / "ws"
    (ws / "outputs").mkdir(parents=True)
    (ws / "outputs" / "answer.json").write_text(json.dumps({"answer": 42}))
    async with Grader("bwrap", work_dir=tmp_path) as grader:
        await grader.start([path.parent.parent])
        out = await grader.evaluate(
            path, request("s1", {"answer": 42}), spec(path), Trajectory(session_id="s1"), ws
        )
    assert (out.status, out.score) == ("scored", 10.0), out.reason


def sandboxed(tmp_path: Path, helpers: bool) -> Grader:
    """A grader sandbox's Grader whose fork server runs each evaluation itself (as root) or through
    a helper forked for it (``helpers``, the way without root)."""
    grader = Grader("bwrap", work_dir=tmp_path)
    grader._forks = ForkServer(helpers=helpers)
    return grader


BOTH_WAYS = pytest.mark.parametrize("helpers", [False, True], ids=["server", "helpers"])


async def forked_artifacts(
    tmp_path: Path, code: str, ws: Path | None, helpers: bool = False
) -> dict[str, Any]:
    """The artifacts of one scored evaluation of ``code`` through the fork server (asserted used)."""
    path = env_root(tmp_path, code)
    async with sandboxed(tmp_path, helpers) as grader:
        await grader.start([path.parent.parent])
        out = await grader.evaluate(path, request("s1"), spec(path), Trajectory(session_id="s1"), ws)
        assert grader._forks is not None and grader._forks.unavailable is None  # the fork server was used
    assert out.status == "scored", out.reason
    return out.artifacts or {}


PROBE = r"""
import ctypes, os

def evaluate(request, spec, trajectory):
    libc = ctypes.CDLL(None, use_errno=True)
    caps = {l.split(":")[0]: l.split()[1] for l in open("/proc/self/status") if l.startswith("Cap")}
    tried = {}
    for name, call in (
        ("remount", lambda: libc.mount(None, b"/workspace", None, 0x20 | 0x1000 | 0x21, None)),  # MS_REMOUNT|MS_BIND, rw
        ("umount", lambda: libc.umount2(b"/workspace", 2)),  # MNT_DETACH: what is under it
        ("unshare_user", lambda: libc.unshare(0x10000000)),
        ("setuid_root", lambda: libc.setuid(0)),
    ):
        rc = call()
        tried[name] = rc if rc == 0 else os.strerror(ctypes.get_errno())
    try:
        open("/workspace/planted", "w").write("x")
        tried["write"] = "written"
    except OSError as e:
        tried["write"] = e.strerror
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    mine = {os.readlink(f"/proc/self/fd/{fd}") for fd in range(4)}
    fds = {"own": sorted(int(fd) for fd in os.listdir("/proc/self/fd"))}
    kinds = {}
    for pid in (1, 2):
        try:
            theirs = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            fds[pid] = sorted(mine & theirs)
            kinds[pid] = sorted({t.split(":")[0] for t in theirs})
        except OSError as e:
            fds[pid] = kinds[pid] = e.strerror
    return {"score": 1, "artifacts": {"caps": caps, "tried": tried, "uid": os.getuid(), "ppid": os.getppid(),
                                      "pids": pids, "me": os.getpid(), "cwd": os.getcwd(), "fds": fds,
                                      "kinds": kinds}}
"""


@BOTH_WAYS
async def test_an_evaluation_forked_into_its_sandbox_has_no_capability_and_sees_only_the_sandbox(
    tmp_path: Path, helpers: bool
) -> None:
    """Through the fork server the evaluation enters the sandbox from outside (setns): it must hold
    no capability there (it cannot remount its read-only workspace, unmount what hides the host,
    make a user namespace or become root), run as the sandbox's uid, see only the sandbox's
    processes, and its parent (the helper, outside) not at all."""
    require_bwrap()
    ws = tmp_path / "ws"
    ws.mkdir()
    got = await forked_artifacts(tmp_path, PROBE, ws, helpers)
    assert set(got["caps"].values()) == {"0000000000000000"}, got["caps"]
    assert got["tried"] == {
        "remount": "Operation not permitted",
        "umount": "Operation not permitted",
        "unshare_user": "No space left on device",  # bwrap's --disable-userns: no user namespace at all
        "setuid_root": "Invalid argument",  # root is not mapped in the sandbox's user namespace
        "write": "Read-only file system",
    }, got["tried"]
    assert (got["uid"], got["ppid"], got["cwd"]) == (65534, 0, "/workspace"), got
    assert got["pids"] == [1, 2, got["me"]], got["pids"]  # bwrap's init, the sandbox's holder, itself
    # bwrap's init and the holder share none of the evaluation's pipes (a program of the sandbox
    # could write to them through /proc); the evaluation has its job (0), output (1, 2) and result
    # (3; the listing's own fd is 4)
    assert got["fds"] == {"1": [], "2": [], "own": [0, 1, 2, 3, 4]}, got["fds"]
    # nor anything of the fork server's (its socket to the launcher carries every evaluation's
    # pipes): bwrap's init holds its own pipes and signal fds, the holder its three pipes
    assert got["kinds"] == {"1": ["anon_inode", "pipe"], "2": ["pipe"]}, got["kinds"]
    assert not (ws / "planted").exists()


FORKED_PYTHON = """
import random, signal, subprocess, sys, threading

def evaluate(request, spec, trajectory):
    got = {}
    signal.signal(signal.SIGUSR1, lambda *_: got.setdefault("signal", "handled"))
    signal.raise_signal(signal.SIGUSR1)
    worker = threading.Thread(target=lambda: got.setdefault("thread", threading.current_thread().name))
    worker.start()
    worker.join()
    got["main"] = threading.current_thread() is threading.main_thread()
    got["child"] = subprocess.run([sys.executable, "-S", "-c", "print(7)"], capture_output=True).stdout.decode()
    got["random"] = random.random()
    return {"score": 1, "artifacts": got}
"""


@BOTH_WAYS
async def test_evaluations_forked_by_the_server_draw_their_own_random_numbers_and_run_threads(
    tmp_path: Path, helpers: bool
) -> None:
    """The fork server forks without Python's at-fork hooks: each evaluation must still reseed
    ``random`` (not replay the server's state), and threads, signal handlers and subprocesses work."""
    require_bwrap()
    path = env_root(tmp_path, FORKED_PYTHON)
    async with sandboxed(tmp_path, helpers) as grader:
        await grader.start([path.parent.parent])
        outs = [
            await grader.evaluate(path, request(f"s{i}"), spec(path), Trajectory(session_id=f"s{i}"), None)
            for i in range(3)
        ]
        assert grader._forks is not None and grader._forks.unavailable is None  # the fork server was used
    assert [o.status for o in outs] == ["scored"] * 3, [o.reason for o in outs]
    got = [o.artifacts or {} for o in outs]
    assert [{k: v for k, v in g.items() if k != "random"} for g in got] == [
        {"signal": "handled", "thread": "Thread-1 (<lambda>)", "main": True, "child": "7\n"}
    ] * 3, got
    assert len({g["random"] for g in got}) == 3, got


@BOTH_WAYS
async def test_an_evaluation_signalling_its_process_group_reaches_neither_the_server_nor_others(
    tmp_path: Path, helpers: bool
) -> None:
    """``kill(0, ...)`` hits the caller's process group whatever its pid namespace: a forked
    evaluation must lead a group of its own, or it kills the fork server, the helpers and every other
    session's evaluation running then (each of them a 0 it did not earn)."""
    require_bwrap()
    killer = env_root(tmp_path, "import os, signal\ndef evaluate(r, s, t):\n    os.kill(0, signal.SIGKILL)\n")
    fine = env_root(tmp_path, "def evaluate(r, s, t):\n    return 7\n", name="u")
    async with sandboxed(tmp_path, helpers) as grader:
        await grader.start([killer.parent.parent])
        first = await grader.evaluate(fine, request("s0"), spec(fine), Trajectory(session_id="s0"), None)
        assert grader._forks is not None and grader._forks._proc is not None
        server = grader._forks._proc
        killed = await grader.evaluate(killer, request("s1"), spec(killer), Trajectory(session_id="s1"), None)
        after = await grader.evaluate(fine, request("s2"), spec(fine), Trajectory(session_id="s2"), None)
        assert grader._forks._proc is server and server.returncode is None  # never killed, never restarted
    assert (first.score, killed.status, after.score) == (7.0, "error", 7.0), killed.reason


CGROUPS_OF_ALL = """
import os

def evaluate(request, spec, trajectory):
    return {"score": 1, "artifacts": {p: open(f"/proc/{p}/cgroup").read() for p in ("1", "2", "self")}}
"""


@BOTH_WAYS
async def test_every_process_of_a_forked_evaluations_sandbox_is_in_its_cgroups(
    tmp_path: Path, helpers: bool
) -> None:
    """bwrap's init and the holder (pids 1 and 2 of the sandbox, traceable by the evaluation: same
    uid) start in the evaluation's cgroups: taken over, they stay under its process and memory caps
    and die with its groups."""
    support = require_bwrap()
    if support.memory is None and support.pids is None:
        pytest.skip("no cgroup controller here")
    got = await forked_artifacts(tmp_path, CGROUPS_OF_ALL, None, helpers)
    # the sandbox's cgroup namespace starts where bwrap started: in the evaluation's groups, so
    # every process of it is at their root (before, pids 1 and 2 were in the launcher's)
    assert got["1"] == got["2"] == got["self"], got
    assert all(
        line.endswith(":/") for line in got["self"].splitlines() if ":pids:" in line or ":memory:" in line
    )


HOG = """
import os, time

def evaluate(request, spec, trajectory):
    end = time.monotonic() + 2.5
    kids = []
    for _ in range(16):
        pid = os.fork()
        if pid == 0:
            os.setsid()  # a session of its own: with autogroup, a scheduling group of its own too
            while time.monotonic() < end:
                pass
            os._exit(0)
        kids.append(pid)
    for pid in kids:
        os.waitpid(pid, 0)
    t = os.times()
    return {"score": 0, "artifacts": {"cpu": t.user + t.system + t.children_user + t.children_system, "wall": 2.5}}
"""

HONEST = """
import time

def evaluate(request, spec, trajectory):
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        pass
    return {"score": 10, "artifacts": {"cpu": time.process_time(), "wall": 2.0}}
"""


async def test_an_answer_with_many_busy_processes_leaves_a_concurrent_evaluation_its_cpu_share(
    tmp_path: Path,
) -> None:
    """Sixteen busy processes in one evaluation, each in a session of its own, and one in another,
    on one CPU: the lone one runs at about the hog's rate (an evaluation's processes weigh as one
    whatever sessions they make), not a seventeenth of it, so a graded answer cannot make a
    sibling's evaluation time out. (The kernel's autogroup alone gives each session a share.)"""
    support = require_bwrap()
    if support.cpu is None:
        pytest.skip("no cgroup cpu controller here")
    hog, honest = env_root(tmp_path, HOG, "hog"), env_root(tmp_path, HONEST, "honest")
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(mask)})  # the fork server and every sandbox inherit it
    try:
        async with Grader("bwrap", work_dir=tmp_path) as grader:
            await grader.start([tmp_path / "envs"])
            a, b = await asyncio.gather(
                grader.evaluate(hog, request("s1"), spec(hog), Trajectory(session_id="s1"), None),
                grader.evaluate(honest, request("s2"), spec(honest), Trajectory(session_id="s2"), None),
            )
    finally:
        os.sched_setaffinity(0, mask)
    assert a.status == b.status == "scored", (a.reason, b.reason)
    rates = [out.artifacts["cpu"] / out.artifacts["wall"] for out in (a, b)]  # type: ignore[index]
    # equal weights: ~0.7 with nothing else on the CPU (the hog runs alone for its last 0.5 s),
    # whatever else runs there; seventeen sessions: ~0.06
    assert rates[1] / rates[0] > 0.3, rates


async def test_a_fork_server_that_died_is_started_again_and_the_evaluation_scores(tmp_path: Path) -> None:
    require_bwrap()
    path = env_root(tmp_path, "def evaluate(r, s, t):\n    return 6\n")
    async with Grader("bwrap", work_dir=tmp_path) as grader:
        await grader.start([path.parent.parent])
        first = await grader.evaluate(path, request("s1"), spec(path), Trajectory(session_id="s1"), None)
        assert grader._forks is not None and grader._forks._proc is not None
        grader._forks._proc.kill()
        await grader._forks._proc.wait()
        second = await grader.evaluate(path, request("s2"), spec(path), Trajectory(session_id="s2"), None)
        assert grader._forks._proc.returncode is None  # a new one
    assert (first.status, first.score, second.status, second.score) == ("scored", 6.0, "scored", 6.0), second


WAITS_FOR_GO = """
import os, time

def evaluate(r, s, t):
    while not os.path.exists(os.path.join(os.path.dirname(__file__), "go")):
        time.sleep(0.01)
    return 5
"""


def _forked_evaluations(server: int) -> list[int]:
    """The fork server's children that are processes of a sandbox's PID namespace (evaluations)."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if int(stat.rsplit(")", 1)[1].split()[1]) == server and len(nspid) > 1:
            found.append(int(name))
    return found


async def test_evaluations_running_when_the_fork_server_dies_are_evaluated_again_not_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The fork server is the launcher's: when it dies under running evaluations (their sandboxes
    die with it), each is evaluated again in a sandbox of its own, never a grading failure (the
    agent's 0), and the server is started again once for the next ones, by one of them."""
    require_bwrap()
    if os.geteuid() != 0:
        pytest.skip("the evaluations are found as the server's children: as root")
    path = env_root(tmp_path, WAITS_FOR_GO)
    warm = env_root(tmp_path, "def evaluate(r, s, t):\n    return 1\n", name="warm")
    async with Grader("bwrap", work_dir=tmp_path) as grader:
        await grader.start([path.parent.parent])
        forks = grader._forks
        assert forks is not None
        assert (
            await grader.evaluate(warm, request("w"), spec(warm), Trajectory(session_id="w"), None)
        ).score == 1
        assert forks._proc is not None
        server = forks._proc
        running = [
            asyncio.ensure_future(
                grader.evaluate(path, request(f"s{i}"), spec(path), Trajectory(session_id=f"s{i}"), None)
            )
            for i in range(3)
        ]
        for _ in range(3000):
            if len(_forked_evaluations(server.pid)) == 3:
                break
            await asyncio.sleep(0.01)
        assert len(_forked_evaluations(server.pid)) == 3
        server.kill()
        await server.wait()
        for snapshot in grader._roots.values():  # the evaluations (run again) may end now
            (snapshot / "t" / "go").write_text("")
        outs = await asyncio.gather(*running)
        assert [(o.status, o.score) for o in outs] == [("scored", 5.0)] * 3, [o.reason for o in outs]
        caplog.clear()
        after = await asyncio.gather(
            *(
                grader.evaluate(path, request(f"a{i}"), spec(path), Trajectory(session_id=f"a{i}"), None)
                for i in range(8)
            )
        )
        assert [(o.status, o.score) for o in after] == [("scored", 5.0)] * 8, [o.reason for o in after]
        restarts = [r for r in caplog.records if "starting it again" in r.getMessage()]
        assert len(restarts) == 1 and forks.unavailable is None, [r.getMessage() for r in caplog.records]


async def test_a_fork_server_that_cannot_be_started_again_leaves_the_old_way_not_a_failed_grading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork server is the launcher's: when it is gone and cannot start again, the evaluation
    (and the next ones) start the child in the sandbox instead, never a grading failure."""
    require_bwrap()
    path = env_root(tmp_path, "def evaluate(r, s, t):\n    return 4\n")
    async with Grader("bwrap", work_dir=tmp_path) as grader:
        await grader.start([path.parent.parent])
        first = await grader.evaluate(path, request("s1"), spec(path), Trajectory(session_id="s1"), None)
        forks = grader._forks
        assert forks is not None and forks._proc is not None
        forks._proc.kill()
        await forks._proc.wait()

        async def cannot_start() -> None:
            raise OSError("no more processes")

        monkeypatch.setattr(forks, "_start", cannot_start)
        second = await grader.evaluate(path, request("s2"), spec(path), Trajectory(session_id="s2"), None)
        third = await grader.evaluate(path, request("s3"), spec(path), Trajectory(session_id="s3"), None)
        assert forks.unavailable == "OSError: no more processes"
    assert [(e.status, e.score) for e in (first, second, third)] == [("scored", 4.0)] * 3, second.reason


CODE_GRADER = """
import subprocess, sys

def evaluate(request, spec, trajectory):
    run = subprocess.run([sys.executable, "/workspace/solution.py"], capture_output=True, text=True, timeout=10)
    return {"score": 10 if run.stdout.strip() == "42" else 0}
"""

# a wrong answer that floods the stdout and stderr of the process holding the sandbox (found by its
# command line), from detached children that keep none of its own pipes
FLOODER = r"""
import os, time
for p in os.listdir("/proc"):
    try:
        holder = p.isdigit() and b"read x" in open(f"/proc/{p}/cmdline", "rb").read()
    except OSError:
        holder = False
    for n in (1, 2) if holder else ():
        if os.fork() == 0:
            os.setsid()
            for fd in (0, 1, 2):
                os.close(fd)
            try:
                fd = os.open(f"/proc/{p}/fd/{n}", os.O_WRONLY)
                while True:
                    os.write(fd, b"x" * 65536)
            except OSError:
                os._exit(0)
time.sleep(1)
print(41)
"""


async def test_an_answer_flooding_the_sandboxs_other_processes_is_graded_in_time(tmp_path: Path) -> None:
    require_bwrap()
    path = env_root(tmp_path, CODE_GRADER)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "solution.py").write_text(FLOODER)
    async with Grader("bwrap", work_dir=tmp_path) as grader:
        await grader.start([path.parent.parent])
        out = await asyncio.wait_for(
            grader.evaluate(path, request("s1"), spec(path, 20.0), Trajectory(session_id="s1"), ws), 60
        )
    assert (out.status, out.score) == ("scored", 0.0), out.reason
    assert out.duration_s < 20.0


async def test_cancelled_evaluations_leave_no_descriptor_open(tmp_path: Path) -> None:
    require_bwrap()
    path = env_root(tmp_path, "def evaluate(r, s, t):\n    return 7\n")

    def fds() -> set[str]:
        return set(os.listdir("/proc/self/fd"))

    async with Grader("bwrap", work_dir=tmp_path) as grader:
        await grader.start([path.parent.parent])
        await grader.evaluate(
            path, request("w"), spec(path), Trajectory(session_id="w"), None
        )  # server started
        before = fds()
        for delay in [0.0, 0.002, 0.005, 0.01, 0.02, 0.04, 0.07, 0.1] * 2:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    grader.evaluate(path, request("c"), spec(path), Trajectory(session_id="c"), None), delay
                )
        after = await grader.evaluate(path, request("n"), spec(path), Trajectory(session_id="n"), None)
        for _ in range(300):  # what a cancelled evaluation still waits for (a sandbox's exit) ends soon
            if not (left := fds() - before):
                break
            await asyncio.sleep(0.1)
    assert (after.status, after.score) == ("scored", 7.0)
    assert left == set(), {
        fd: os.readlink(f"/proc/self/fd/{fd}") for fd in left if os.path.exists(f"/proc/self/fd/{fd}")
    }
