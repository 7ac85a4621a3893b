"""The sandbox's network made before the sandbox: the launcher listens on the session's loopback port
itself (no relay process inside), the helper that makes the networks, and the forwarder where that
cannot be used."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollout.sandbox import runner
from rollout.sandbox.bridge import MAX_CONNECTIONS
from rollout.sandbox.bwrap import GATEWAY_PORT, Support
from rollout.sandbox.cgroups import SessionCgroup
from rollout.sandbox.netns import NetnsError, NetnsMaker, Spawned, _answer
from rollout.sandbox.runner import run_runtime
from tests.rollout.sandbox_helpers import make_env, request, require_bwrap

VIEW = r"""
import json, os, socket, sys
r = json.loads(sys.stdin.readline())
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
cmds = {}
for p in os.listdir("/proc"):
    if p.isdigit():
        with open(f"/proc/{p}/cmdline", "rb") as f:
            cmds[p] = f.read().split(b"\0")[0].decode()
s = socket.create_connection(("127.0.0.1", 41800), timeout=10)
s.sendall(b"GET /v1/other HTTP/1.1\r\nhost: x\r\n\r\n")
answer = s.recv(100).decode().split("\r\n")[0]
view = {"fds": fds, "cmds": cmds, "answer": answer, "forwarder": os.path.exists("/run/rollout/forwarder.py")}
print(json.dumps({"session_id": r["session_id"], "status": "succeeded", "result": view}))
"""


async def _view(tmp_path: Path) -> dict:
    cfg = make_env(tmp_path / "envs", "view", VIEW)
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await run_runtime(cfg, request(), ws, {})
    assert (out.status, out.setup_failed) == ("succeeded", False), out.error_text
    assert out.result is not None
    return out.result.result


async def test_the_launcher_listens_in_the_sandbox_and_nothing_relays_inside(tmp_path: Path) -> None:
    require_bwrap()
    view = await _view(tmp_path)
    assert runner._NETWORKS.off is None
    # the bridge answered (a path outside the session: 403), with no process of ours in the sandbox
    assert view["answer"] == "HTTP/1.1 403 "
    assert view["forwarder"] is False
    assert sorted(os.path.basename(c) for c in view["cmds"].values()) == ["bwrap", "python"]
    # the status pipe and the namespaces' fds were closed before the runtime started (the one
    # left above 2 is the listing's own)
    assert len(view["fds"]) == 4 and view["fds"][:3] == [0, 1, 2]


async def test_a_network_that_never_worked_leaves_the_sessions_to_the_forwarder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_bwrap()
    monkeypatch.setattr(runner, "_NETWORKS", runner._Networks())
    monkeypatch.setattr(runner, "GATEWAY_PORT", 70000)  # the helper cannot listen there
    view = await _view(tmp_path)
    assert runner._NETWORKS.off is not None and "port must be 0-65535" in runner._NETWORKS.off
    assert view["answer"] == "HTTP/1.1 403 " and view["forwarder"] is True
    runner._NETWORKS.close()


async def test_a_network_that_fails_after_it_worked_fails_that_session_as_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_bwrap()
    networks = runner._Networks()
    networks.worked = True
    networks.maker = NetnsMaker(70000)
    monkeypatch.setattr(runner, "_NETWORKS", networks)
    cfg = make_env(tmp_path / "envs", "view", VIEW)
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await run_runtime(cfg, request(), ws, {})
    assert (out.status, out.setup_failed) == ("error", True)
    assert out.error_text is not None and "cannot make the session's network" in out.error_text
    assert networks.off is None
    networks.close()


async def test_the_helper_makes_a_network_of_its_own_and_comes_back_when_killed() -> None:
    require_bwrap()
    maker = NetnsMaker(GATEWAY_PORT)
    try:
        net = await maker.make()
        try:
            ours = os.stat("/proc/self/ns/net").st_ino
            assert os.fstat(net.netns).st_ino != ours
            assert os.fstat(net.userns).st_ino != os.stat("/proc/self/ns/user").st_ino
            assert net.listener.getsockname() == ("127.0.0.1", GATEWAY_PORT)
        finally:
            net.close()
        assert maker._proc is not None
        maker._proc.kill()
        maker._proc.wait()
        again = await maker.make()
        again.close()
    finally:
        maker.close()


async def test_a_helper_that_cannot_listen_says_why() -> None:
    require_bwrap()
    maker = NetnsMaker(70000)
    try:
        with pytest.raises(NetnsError, match="cannot make the session's network: OverflowError"):
            await maker.make()
    finally:
        maker.close()


@pytest.mark.parametrize("command", [["/usr"], ["{env_dir}/runtime.py"]])
async def test_a_command_that_is_no_executable_file_is_a_setup_failure(
    tmp_path: Path, command: list[str]
) -> None:
    """A folder, or a file without the execute bit: the runtime never started, whatever exit code
    the shell then gives (126 is also what a runtime may exit with)."""
    require_bwrap()
    cfg = make_env(tmp_path / "envs", "noexec", "print('never')\n", runtime_cfg={"command": command})
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await run_runtime(cfg, request(), ws, {})
    assert (out.status, out.setup_failed) == ("error", True)
    assert out.error_text is not None and "no such command in the sandbox" in out.error_text


async def test_no_variable_of_an_env_runs_code_in_a_host_shell(tmp_path: Path) -> None:
    """Bash defines functions from ``BASH_FUNC_<name>%%`` variables and reads ``BASH_ENV``: the
    session's variables reach bwrap through ``--args``, never the host's shells."""
    require_bwrap()
    marker = tmp_path / "ran-on-the-host"
    hook = tmp_path / "hook.sh"
    hook.write_text(f"touch {marker}\n")
    env = {
        "BASH_FUNC_ulimit%%": f'() {{ touch {marker}; builtin ulimit "$@"; }}',
        "BASH_FUNC_echo%%": f'() {{ touch {marker}; builtin echo "$@"; }}',
        "BASH_ENV": str(hook),
        "ENV": str(hook),
    }
    cfg = make_env(tmp_path / "envs", "funcs", VIEW, runtime_cfg={"env": env, "limits": {"disk_mb": 8}})
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await run_runtime(cfg, request(), ws, {})
    assert (out.status, out.setup_failed) == ("succeeded", False), out.error_text
    assert not marker.exists()


async def test_a_session_holds_a_bounded_number_of_the_launchers_connections(tmp_path: Path) -> None:
    """Connections past ``MAX_CONNECTIONS`` at once are closed as they come: a flood of idle ones
    costs the launcher at most that many open files, and its session's own requests still pass."""
    require_bwrap()
    flood = r"""
import json, socket, sys
r = json.loads(sys.stdin.readline())
held, closed = [], 0
for _ in range(MAX + 40):
    s = socket.create_connection(("127.0.0.1", 41800), timeout=10)
    held.append(s)
for s in held:
    s.settimeout(0.5)
    try:
        closed += s.recv(1) == b""
    except socket.timeout:
        pass
print(json.dumps({"session_id": r["session_id"], "status": "succeeded", "result": {"closed": closed}}))
""".replace("MAX", str(MAX_CONNECTIONS))
    cfg = make_env(tmp_path / "envs", "flood", flood)
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await run_runtime(cfg, request(), ws, {})
    assert (out.status, out.setup_failed) == ("succeeded", False), out.error_text
    assert out.result is not None and out.result.result["closed"] == 40


def test_a_workspace_the_launcher_cannot_measure_for_want_of_files_is_not_over_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from rollout.core.envs import LimitsConfig

    def short(*a: object, **k: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(runner, "disk_used", short)
    check = runner._disk_check(tmp_path, LimitsConfig(disk_mb=8))
    assert check is not None and check() is None
    monkeypatch.setattr(
        runner, "disk_used", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "denied"))
    )
    assert check() == ("disk", "disk limit: the workspace cannot be measured (denied)")


def test_a_variable_with_a_nul_byte_never_becomes_bwrap_options(tmp_path: Path) -> None:
    """bwrap reads the environment's options NUL-separated: a NUL in a value would add options of
    its own (``--bind / /hostroot``); such a variable is refused wherever it can come from."""
    from rollout.core.envs import EnvConfigError
    from rollout.sandbox.bwrap import BadVariable, env_args

    for env in ({"X": "a\0--bind\0/\0/hostroot"}, {"A\0--bind": "x"}, {"": "x"}, {"A=B": "x"}):
        with pytest.raises(BadVariable, match="the sandbox's environment: the variable"):
            env_args(env)
    fd = env_args({"A": "x y", "B": ""})
    try:
        assert os.read(fd, 1000) == b"--clearenv\0--setenv\0A\0x y\0--setenv\0B\0\0"
    finally:
        os.close(fd)
    with pytest.raises(EnvConfigError, match="holds a NUL byte"):
        make_env(tmp_path / "envs", "nul", "", runtime_cfg={"env": {"X": "a\0--bind"}})


def test_an_image_whose_env_holds_a_nul_byte_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollout.sandbox import images

    monkeypatch.setattr(
        images,
        "_config",
        lambda ref: ("sha256:" + "e" * 64, {"config": {"Env": ["PATH=/bin", "X=a\0--bind\0/\0/h"]}}),
    )
    with pytest.raises(images.ImageError, match="its config's Env: the variable 'X' holds a NUL byte"):
        images.unpack("localhost/hostile:1", tmp_path / "cache")


@contextlib.asynccontextmanager
async def _spawned(
    argv: list[str],
    tmp_path: Path,
    gated: bool = False,
    rlimits: dict[str, int] | None = None,
    cgroup: SessionCgroup | None = None,
    maker: NetnsMaker | None = None,
) -> AsyncIterator[tuple[Spawned, list[int]]]:
    """``argv`` started by a helper (its own unless ``maker``) with fresh pipes: (the Spawned, our
    ends: stdin, stdout, status); all closed after."""
    own = maker is None
    maker = maker or NetnsMaker(GATEWAY_PORT)
    pipes = [os.pipe() for _ in range(4)]  # stdin, stdout, stderr, status
    env_r, env_w = os.pipe()
    os.close(env_w)
    theirs = [pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1], env_r]
    ours = [pipes[0][1], pipes[1][0], pipes[3][0]]
    os.close(pipes[2][0])
    try:
        try:
            spawned = await maker.spawn(
                argv,
                theirs,
                {"core": 0} if rlimits is None else rlimits,
                cgroup.procs_files if cgroup else [],
                str(tmp_path),
                gated=gated,
            )
        finally:
            for fd in theirs:
                os.close(fd)
        try:
            yield spawned, ours
        finally:
            spawned.close()
    finally:
        for fd in ours:
            os.close(fd)
        if own:
            maker.close()


async def test_a_command_that_cannot_start_says_why_on_its_status_pipe(tmp_path: Path) -> None:
    require_bwrap()
    async with _spawned([str(tmp_path / "missing")], tmp_path) as (spawned, ours):
        assert os.waitstatus_to_exitcode(await spawned.ended()) == 127
        said = os.read(ours[2], 4096).decode()
        assert said.startswith("error: cannot start the sandbox: FileNotFoundError"), said


@pytest.mark.parametrize("gated", [False, True])
async def test_closing_the_answer_kills_the_command_and_its_group(tmp_path: Path, gated: bool) -> None:
    """Started by the helper's child (not gated) or, as root, by the helper itself (gated)."""
    require_bwrap()
    script = "import os, sys, time; os.write(1, str(os.getpid()).encode() + b'\\n'); time.sleep(300)"
    async with _spawned([sys.executable, "-c", script], tmp_path, gated) as (spawned, ours):
        pid = int(os.read(ours[1], 100))
        assert os.getpgid(pid) == spawned.pgid != os.getpgid(0)  # a group of its own
        # no fd of the launcher's or the helper's but those handed over (and the gate) reached it
        assert sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd")) == [
            0,
            1,
            2,
            3,
            *([5] if gated else []),
            6,
        ]
        spawned.close()
        for _ in range(100):
            if not os.path.exists(f"/proc/{pid}"):
                break
            await asyncio.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}")


async def test_a_launcher_that_gives_up_during_the_start_leaves_nothing_running(tmp_path: Path) -> None:
    """The launcher closing its answer socket right after the network's ``ok`` (a cancelled
    session), before or after ``started`` was sent: the command is killed with its group, with no
    cgroup to catch it."""
    require_bwrap()
    maker = NetnsMaker(GATEWAY_PORT)
    marker = f"rollout-test-{os.getpid()}-left"
    script = f"import time; time.sleep(300)  # {marker}"
    try:
        for _ in range(5):
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            pipes = [os.pipe() for _ in range(5)]
            request = {
                "argv": [sys.executable, "-c", script],
                "rlimits": {},
                "procs": [],
                "cwd": str(tmp_path),
            }
            try:
                maker._ask(b"s" + json.dumps(request).encode(), [theirs.fileno(), *(r for r, _ in pipes)])
            finally:
                theirs.close()
                for r, w in pipes:
                    os.close(r)
                    os.close(w)
            msg, fds = await _answer(mine, 1)
            assert msg == b"ok"
            for fd in fds:
                os.close(fd)
            mine.close()  # given up: before or after "started"
        for _ in range(100):
            left = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, marker)]
            if not left:
                break
            await asyncio.sleep(0.05)
        assert not left
    finally:
        maker.close()


def _cmdline_has(pid: str, text: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return text.encode() in f.read()
    except OSError:
        return False


def _as_root() -> Support:
    """The sandbox support, for a test of the helper starting commands itself (only as root)."""
    support = require_bwrap()
    if os.geteuid() != 0:
        pytest.skip("the helper starts commands itself only as root")
    return support


GATED = r"""
import json, os, resource, sys
while os.read(5, 4096):  # the gate, as bwrap reads its first --args before it starts anything
    pass
print(json.dumps({
    "ppid": os.getppid(), "pid": os.getpid(), "pgid": os.getpgid(0), "cwd": os.getcwd(),
    "fsize": resource.getrlimit(resource.RLIMIT_FSIZE), "core": resource.getrlimit(resource.RLIMIT_CORE),
    "cgroup": open("/proc/self/cgroup").read(), "net": os.stat("/proc/self/ns/net").st_ino,
}), flush=True)
sys.stdin.read()
"""


async def test_as_root_the_helper_starts_a_gated_command_itself_with_its_limits_and_groups(
    tmp_path: Path,
) -> None:
    """No process per session on the host but the command: the helper makes the network, joins
    the session's cgroups, starts the command there and returns to its own network and groups
    before it answers; the command gets its limits before the gate opens (bwrap reads it before
    it starts anything)."""
    support = _as_root()
    cg = support.session_cgroup(64 << 20, 16)
    cg.create(f"rollout-test-gated-{os.getpid()}")
    maker = NetnsMaker(GATEWAY_PORT)
    try:
        limits = {"fsize": 12345, "core": 0}
        async with _spawned([sys.executable, "-c", GATED], tmp_path, True, limits, cg, maker) as (s, ours):
            got = json.loads(os.read(ours[1], 65536))
            assert maker._proc is not None
            helper = maker._proc.pid
            assert got["ppid"] == helper and got["pid"] == got["pgid"] == s.pgid
            assert got["fsize"] == [12345, 12345] and got["core"] == [0, 0] and got["cwd"] == str(tmp_path)
            assert got["net"] != os.stat("/proc/self/ns/net").st_ino
            # the helper is back in its own network and groups; the command is in the session's
            assert os.stat(f"/proc/{helper}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
            name = f"rollout-test-gated-{os.getpid()}"
            ours_cg = Path("/proc/self/cgroup").read_text()
            assert Path(f"/proc/{helper}/cgroup").read_text() == ours_cg and name not in ours_cg
            if cg.procs_files:
                assert name in got["cgroup"] and sorted(cg.pids_inside()) == [got["pid"]]
            assert resource.prlimit(helper, resource.RLIMIT_FSIZE) == resource.getrlimit(
                resource.RLIMIT_FSIZE
            )
            os.close(ours[0])  # stdin: it ends
            ours[0] = os.open(os.devnull, os.O_RDONLY)
            assert os.waitstatus_to_exitcode(await s.ended()) == 0
    finally:
        maker.close()
        cg.remove()


async def test_a_gated_command_that_cannot_start_fails_its_start_with_the_reason(tmp_path: Path) -> None:
    _as_root()
    with pytest.raises(NetnsError, match="cannot start the sandbox: FileNotFoundError"):
        async with _spawned([str(tmp_path / "missing")], tmp_path, True):
            pass


async def test_a_cancelled_start_waits_for_the_helpers_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled while the helper starts the command (it is in the session's cgroups until it
    answers, and the caller then kills them), the start first reads the helper's answer."""
    from rollout.sandbox import netns

    read: list[bytes] = []
    real = netns._answer

    async def slow(sock: socket.socket, max_fds: int) -> tuple[bytes, list[int]]:
        got = await real(sock, max_fds)
        read.append(got[0])
        return got

    monkeypatch.setattr(netns, "_answer", slow)
    maker = NetnsMaker(GATEWAY_PORT)
    pipes = [os.pipe() for _ in range(5)]
    try:
        task = asyncio.create_task(
            maker.spawn(["/bin/sleep", "30"], [r for r, _ in pipes], {}, [], "/", gated=True)
        )
        await asyncio.sleep(0)  # the request is sent; the helper has not answered
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert read and read[-1].startswith((b"started ", b"error")), read
    finally:
        maker.close()
        for r, w in pipes:
            os.close(r)
            os.close(w)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


async def test_a_command_that_ends_as_the_launcher_gives_it_up_never_ends_the_helper(tmp_path: Path) -> None:
    """Its end and its closed answer seen by the helper at once: each session's events are its own."""
    _as_root()
    maker = NetnsMaker(GATEWAY_PORT)
    try:
        async with _spawned(["/bin/sleep", "300"], tmp_path, True, maker=maker) as (spawned, _):
            assert maker._proc is not None
            helper = maker._proc.pid
            os.kill(helper, signal.SIGSTOP)  # busy: both events wait for it
            try:
                os.killpg(spawned.pgid, signal.SIGKILL)
                for _ in range(500):
                    if _state(spawned.pgid) in ("Z", "gone"):
                        break
                    await asyncio.sleep(0.01)
                spawned.answer.close()
            finally:
                os.kill(helper, signal.SIGCONT)
        async with _spawned(["/bin/true"], tmp_path, True, maker=maker) as (again, _):
            assert os.waitstatus_to_exitcode(await again.ended()) == 0
        assert maker._proc.poll() is None
    finally:
        maker.close()


async def test_a_forked_start_works_beside_hundreds_of_gated_sessions(tmp_path: Path) -> None:
    """The helper then holds fds numbered past 1024, and so does its forked child."""
    _as_root()
    maker = NetnsMaker(GATEWAY_PORT)
    try:
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(520):
                await stack.enter_async_context(_spawned(["/bin/sleep", "300"], tmp_path, True, maker=maker))
            async with _spawned(["/bin/true"], tmp_path, False, maker=maker) as (forked, _):
                assert os.waitstatus_to_exitcode(await forked.ended()) == 0
    finally:
        maker.close()


@pytest.mark.parametrize(
    ("argv", "rlimits", "why"),
    [
        (["/bin/true"], {"fsize": 1 << 64}, "OverflowError"),
        ([], {}, "ValueError: no command"),
        (["/bin/true"], {"nofile": 1}, "KeyError"),
    ],
)
async def test_a_bad_gated_request_fails_that_start_only(
    tmp_path: Path, argv: list[str], rlimits: dict[str, int], why: str
) -> None:
    """Whatever a request gets wrong fails its own start: the helper, which every sandbox dies
    with, stays (before, an error of an unexpected kind ended it)."""
    _as_root()
    maker = NetnsMaker(GATEWAY_PORT)
    try:
        async with _spawned(["/bin/sleep", "300"], tmp_path, True, maker=maker) as (bystander, _):
            with pytest.raises(
                NetnsError, match=f"(cannot start the sandbox|cannot make the session.s network): {why}"
            ):
                async with _spawned(argv, tmp_path, True, rlimits, maker=maker):
                    pass
            assert maker._proc is not None and maker._proc.poll() is None
            assert _state(bystander.pgid) not in ("Z", "gone")
    finally:
        maker.close()


@pytest.mark.parametrize("gated", [False, True])
async def test_the_command_starts_with_no_signal_ignored(tmp_path: Path, gated: bool) -> None:
    """As a shell would start it: Python ignores SIGPIPE and SIGXFSZ and the helper SIGINT, and
    an ignored signal stays ignored across exec (a pipeline's writer would not end with its reader)."""
    require_bwrap()
    grep = ["/bin/grep", "SigIgn", "/proc/self/status"]  # a C program: it changes none itself
    async with _spawned(grep, tmp_path, gated) as (spawned, ours):
        assert os.waitstatus_to_exitcode(await spawned.ended()) == 0
        line = os.read(ours[1], 1000).decode()
    ignored = int(line.split()[1], 16)
    for sig in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (sig - 1)), (sig, line)
