"""Verifiers: a task's own tests (Harbor's ``tests/test.sh``) run on a copy of the final workspace.

``run_verifier`` runs ``bash /tests/test.sh`` in a fresh bubblewrap sandbox of its own, after the
agent ended: no network, a clean environment, the session's memory/process/output/disk limits, a
CPU-time limit per process and its own timeout (the process group and the sandbox are killed at
it; its cgroups and scratch folder are removed afterwards). It sees a copy of the final workspace
(``copy_workspace``: files and folders only) at ``/workspace`` (its cwd), the TASK's tests
read-only at ``/tests`` and a writable ``/logs/verifier``, where the script writes ``reward.txt``
(a number) or ``reward.json``. Its tools come from the read-only host (PATH holds host folders
only; ``PYTHONNOUSERSITE``, HOME on the private ``/tmp``), and what of the copy would run before
or instead of the tests (a ``conftest.py``, a ``sitecustomize.py``, a ``pytest.py`` or a module
shadowing one the tools import, a ``python`` or ``pytest`` executable) is removed from the copy
(``rollout.grading.hooks``): the cwd stays on ``sys.path``, so tests import the agent's modules. The script's bash (an execute-only copy: ``SHELL``) and
the forwarder that reports its exit status are not dumpable, so the code under test cannot trace
them. The rules are in docs/verifiers.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import stat
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from rollout.contract.protocol import SimulationStartRequest
from rollout.core.envs import Case, EnvConfig, LimitsConfig
from rollout.core.harbor import DEFAULT_VERIFIER_TIMEOUT_S
from rollout.core.trees import remove_tree
from rollout.grading.evaluation import Evaluation
from rollout.grading.hooks import strip_hooks
from rollout.grading.scoring import cut_text
from rollout.grading.workspace_copy import CopyCaps, WorkspaceCopy, copy_workspace
from rollout.sandbox.bwrap import (
    FORWARDER,
    FORWARDER_SOURCE,
    GATEWAY_PORT,
    HOST_ENV,
    NAMESPACE_FLAGS,
    WORKSPACE,
    BadVariable,
    Binds,
    SandboxUnavailable,
    clean_env,
    env_args,
    image_env,
    namespace_flags,
    proc_args,
)
from rollout.sandbox.cgroups import SessionCgroup
from rollout.sandbox.images import ImageError, ImageRoot
from rollout.sandbox.overlay import OverlayUnavailable, kept, merged, upper, wrap
from rollout.sandbox.runner import disk_used, image_workdir, sandbox_support
from rollout.sandbox.runtime_local import run_local

log = logging.getLogger(__name__)

MiB = 1024 * 1024
TESTS = "/tests"
LOGS = "/logs/verifier"
TEST_SCRIPT = "test.sh"
REWARD_TXT, REWARD_JSON = "reward.txt", "reward.json"
MAX_REWARD_FILE = 64 * 1024
HOST_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
"""The verifier's PATH after the interpreter's folder: host folders only, never the workspace."""
_NO_GATEWAY = "/run/rollout/no-gateway.sock"  # the forwarder's socket: a verifier has no gateway
SHELL = "/run/rollout/bash"
"""Where the script's bash is: a copy of the host's, execute-only (mode 0111), so the bash running
``test.sh`` is not dumpable (the kernel makes a process that execs a file it cannot read so): the
code under test can neither trace it nor open its ``/proc/<pid>/mem`` or fds."""

VerifierStatus = Literal["rewarded", "no_reward", "timeout", "setup_failed"]


class VerifierResult(BaseModel):
    """What a verifier run gave. ``status``: ``rewarded`` (a reward was read), ``no_reward`` (the
    script ended without a valid reward file, was killed by a signal (exit code 128 + N: what it
    left is not trusted), or went over a limit: ``limit_exceeded``),
    ``timeout`` (killed at its timeout), ``setup_failed`` (the sandbox or the copy could not be
    made: an infrastructure failure). ``reward``: the number read; ``reward_json``: the parsed
    ``reward.json`` if any; ``exit_code`` of the script; the last 4000 characters of its stdout
    and stderr; ``reason``: why there is no reward (or how it was read); ``workspace_copy``: the
    copy's manifest (what was left out of it); ``container``: ``same`` when the tests ran on the
    agent's own copy-on-write layer of the image (``dataset.same_container``), else ``fresh``."""

    status: VerifierStatus
    reward: float | None = None
    reward_json: dict[str, Any] | None = None
    exit_code: int | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    duration_s: float = 0.0
    reason: str | None = None
    limit_exceeded: str | None = None
    workspace_copy: dict[str, Any] = Field(default_factory=dict)
    container: Literal["fresh", "same"] = "fresh"

    def for_evaluator(self) -> dict[str, Any]:
        """What an env's evaluator is handed (``EvalRequest.verifier``)."""
        return self.model_dump(
            mode="json",
            include={
                "status",
                "reward",
                "reward_json",
                "exit_code",
                "stdout_tail",
                "stderr_tail",
                "reason",
                "limit_exceeded",
                "container",
                "workspace_copy",
            },
        )


_PY_ENV = {
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}


def _host_env(image: ImageRoot | None = None) -> dict[str, str]:
    if image is not None:  # the image's ENV (its PATH: its own tools run the tests)
        return image_env(image.env, _PY_ENV, "/tmp")
    env = clean_env(_PY_ENV)
    env["PATH"] = os.pathsep.join(dict.fromkeys([os.path.dirname(sys.executable), *HOST_PATH]))
    return env


def _bash() -> str:
    return next((p for p in ("/bin/bash", "/usr/bin/bash") if os.path.isfile(p)), "bash")


def _command(
    bwrap: str,
    workspace: Path,
    tests: Path,
    logs: Path,
    shell: Path,
    limits: LimitsConfig,
    status_fd: int,
    rlimits: dict[str, int],
    image: ImageRoot | None = None,
    root: Path | None = None,
    also_at: str | None = None,
    tmp_in_root: bool = False,
    env_fd: int | None = None,
) -> list[str]:
    b = Binds()
    if image is not None and root is not None:  # the image's copy-on-write tree is /
        b.args += ["--bind", str(root), "/"]
    if not tmp_in_root:  # else the agent's /tmp, carried in its layer
        b.args += (
            ["--size", str(limits.disk_mb * MiB), "--tmpfs", "/tmp"]
            if limits.disk_mb
            else ["--tmpfs", "/tmp"]
        )
    if image is None:
        b.system()
    b.interpreter()
    workdir = image_workdir(image) if image is not None else WORKSPACE
    b.args += ["--bind", str(workspace), workdir]
    if image is None and also_at is not None:
        b.also(workspace, also_at)
    b.ro(tests, TESTS)
    b.args += ["--bind", str(logs), LOGS]
    b.ro(FORWARDER_SOURCE, FORWARDER)
    b.ro(shell, SHELL)
    flags = namespace_flags(*image.uid_gid()) if image is not None else NAMESPACE_FLAGS
    return [
        bwrap,
        *(["--args", str(env_fd)] if env_fd is not None else []),  # its variables (bwrap.env_args)
        *flags,
        *b.args,
        *proc_args(),
        "--dev",
        "/dev",
        "--chdir",
        workdir,
        "--",
        sys.executable,
        "-I",
        "-S",
        FORWARDER,
        "--undumpable",
        str(GATEWAY_PORT),
        _NO_GATEWAY,
        str(status_fd),
        ",".join(f"{k}={v}" for k, v in rlimits.items()),
        "--",
        SHELL,
        f"{TESTS}/{TEST_SCRIPT}",
    ]


_DEST_LAST = {
    "--bind": 2,
    "--ro-bind": 2,
    "--dev-bind": 2,
    "--symlink": 2,
    "--dir": 1,
    "--tmpfs": 1,
    "--proc": 1,
    "--dev": 1,
}
_VALUED = {"--uid", "--gid", "--size", "--hostname", "--cap-drop", "--chdir", "--perms", "--args"}


def mount_points(argv: list[str]) -> list[str]:
    """The paths a bwrap command line mounts or makes (``/`` aside), in order."""
    out, i = [], 1
    while i < len(argv) and argv[i] != "--":
        n = _DEST_LAST.get(argv[i])
        if n is not None:
            if argv[i + n] != "/":
                out.append(argv[i + n])
            i += n + 1
        else:
            i += 2 if argv[i] in _VALUED else 1
    return out


def clear_mount_points(layer: Path, points: list[str]) -> list[str]:
    """Remove from a kept ``layer`` what is not a folder on the way to one of ``points`` (a file, a
    link, a whiteout where the verifier mounts ``/tests`` or ``/logs``): the image's own shows
    through and bwrap makes its folders. ``"<path>: <why>"`` for each removed."""
    out: list[str] = []
    for point in points:
        at = layer
        for part in Path(point).relative_to("/").parts:
            at = at / part
            try:
                st = at.lstat()
            except FileNotFoundError:
                break
            if stat.S_ISDIR(st.st_mode):
                continue
            kind = (
                "a link"
                if stat.S_ISLNK(st.st_mode)
                else "a file"
                if stat.S_ISREG(st.st_mode)
                else "not a folder"
            )
            with contextlib.suppress(PermissionError):  # a folder the agent made unwritable: made writable
                at.parent.chmod(0o700)
            at.unlink()
            out.append(
                f"/{at.relative_to(layer).as_posix()}: {kind} in the agent's layer where the verifier mounts {point}"
            )
            break
    return out


def _read_small(folder: Path, name: str) -> str | None:
    """The text of ``folder/name`` when it is a regular file (never a link, FIFO or device) of at
    most ``MAX_REWARD_FILE`` bytes; None when absent. Raises ValueError for anything else."""
    try:
        fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ValueError(f"{name} cannot be read: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{name} is not a regular file")
        data = os.read(fd, MAX_REWARD_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_REWARD_FILE:
        raise ValueError(f"{name} is over {MAX_REWARD_FILE} bytes")
    return data.decode("utf-8", "replace")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


MAX_REWARD_JSON_DEPTH = 32
"""How deep a ``reward.json`` may nest (the code under test can write it): deeper is not a JSON
object the launcher keeps (no reward from it), never an error of the launcher's."""


def _shallow(value: Any, limit: int = MAX_REWARD_JSON_DEPTH) -> bool:
    """Whether ``value`` (parsed JSON) nests at most ``limit`` levels (no recursion)."""
    level: list[Any] = [value]
    for _ in range(limit):
        level = [
            v for c in level for v in (c.values() if isinstance(c, dict) else c) if isinstance(v, dict | list)
        ]
        if not level:
            return True
    return False


def read_reward(logs: Path) -> tuple[float | None, dict[str, Any] | None, str]:
    """``(reward, parsed reward.json, how or why not)`` from a verifier's log folder:
    ``reward.txt`` (one finite number) first, else ``reward.json``'s ``reward`` (or its only
    numeric value)."""
    try:
        text, raw_json = _read_small(logs, REWARD_TXT), _read_small(logs, REWARD_JSON)
    except ValueError as e:
        return None, None, str(e)
    parsed: dict[str, Any] | None = None
    if raw_json is not None:
        try:
            loaded = json.loads(raw_json)
        except (ValueError, RecursionError):  # deeper than the parser recurses: as any malformed file
            loaded = None
        parsed = loaded if isinstance(loaded, dict) and _shallow(loaded) else None
    if text is not None:
        try:
            value = _number(float(text.strip()))
        except ValueError:
            value = None
        if value is None:
            return None, parsed, f"{REWARD_TXT} does not hold a finite number: {text.strip()[:80]!r}"
        return value, parsed, f"read from {REWARD_TXT}"
    if raw_json is None:
        return None, None, f"the verifier wrote neither {REWARD_TXT} nor {REWARD_JSON}"
    if parsed is None:
        return None, None, f"{REWARD_JSON} is not a JSON object (of at most {MAX_REWARD_JSON_DEPTH} levels)"
    if "reward" in parsed:
        value = _number(parsed["reward"])
        return (
            (value, parsed, f"read from {REWARD_JSON}")
            if value is not None
            else (None, parsed, f"{REWARD_JSON}: reward is not a finite number")
        )
    numbers = [v for v in parsed.values() if _number(v) is not None]
    if len(numbers) == 1:
        return float(numbers[0]), parsed, f"the only number of {REWARD_JSON}"
    return None, parsed, f"{REWARD_JSON} has no 'reward' and not exactly one number"


def _copy(
    workspace: Path,
    dest: Path,
    caps: CopyCaps,
    baseline: Path | None = None,
    strip: bool = True,
    root: Path = Path("/"),
) -> WorkspaceCopy:
    """The workspace copied, its hooks removed unless ``strip`` is false (``strip_hooks``;
    ``baseline``: the files the session started with, kept as they were; ``root``: the root
    filesystem the tests run on); a workspace root the agent made unreadable gives
    an empty copy (its own doing: graded on nothing, never an infrastructure failure). Raises
    OSError when ``dest`` cannot be made."""
    try:
        out = copy_workspace(workspace, dest, caps)
    except OSError as e:
        if not dest.is_dir():
            raise
        out = WorkspaceCopy()
        out.skip(".", f"the workspace cannot be read: {e.strerror}", incomplete=True)
    out.stripped = strip_hooks(dest, baseline, root) if strip else []
    return out


def _remove(folder: Path) -> None:
    """Remove ``folder`` whatever the code under test did to it (a folder made unreadable, a tree
    deeper than ``shutil.rmtree`` can recurse): never raises, logs what is left."""
    left = remove_tree(folder)
    if left is not None:
        log.warning("the verifier's scratch folder %s was not removed: %s", folder, left)


def _monitor(cg: SessionCgroup, workspace: Path, limits: LimitsConfig) -> Any:
    cap = limits.disk_mb * MiB if limits.disk_mb is not None else None

    def check() -> tuple[str, str] | None:
        hit = cg.exceeded()
        if hit == "memory":
            return "memory", f"memory limit exceeded: the verifier used more than {limits.memory_mb} MiB"
        if hit == "processes":
            return (
                "processes",
                f"process limit exceeded: the verifier ran more than {limits.processes} at once",
            )
        if cap is None:
            return None
        try:
            used = disk_used(workspace, cap).bytes
        except OSError as e:  # a folder the code under test made unreadable: its doing, as in a session
            return "disk", f"disk limit: the verifier's workspace cannot be measured ({e.strerror or e})"
        if used > cap:
            return (
                "disk",
                f"disk limit exceeded: the verifier's workspace holds more than {limits.disk_mb} MiB",
            )
        return None

    async def monitor() -> tuple[str, str] | None:
        return await asyncio.to_thread(check)

    return monitor


async def run_verifier(
    workspace: Path,
    tests_dir: Path,
    *,
    timeout_s: float,
    limits: LimitsConfig | None = None,
    cpu_s: int | None = None,
    caps: CopyCaps | None = None,
    label: str = "verifier",
    image: ImageRoot | None = None,
    also_at: str | None = None,
    baseline: Path | None = None,
    under: Path | None = None,
) -> VerifierResult:
    """Run ``tests_dir/test.sh`` on a copy of ``workspace`` (module docstring) and read its reward.
    ``limits``: memory, processes, output and disk as a session's (default ``LimitsConfig()``);
    ``cpu_s``: CPU seconds per process (default: ``timeout_s``); ``caps``: of the workspace copy;
    ``label``: names the run (its cgroup); ``image``: the session's image, whose fresh
    copy-on-write root the tests run in (the copy at its WORKDIR, its ENV and USER); ``also_at``:
    no image, the copy is bound there too (a host-toolchain task's WORKDIR); ``baseline``: the
    files the session started with (``strip_hooks`` keeps those unchanged); ``under``: the folder
    that kept the agent's copy-on-write layer over ``image`` (same-container verification: that
    layer under the verifier's own, no hook removed). Never raises except CancelledError."""
    t0 = time.monotonic()
    limits = limits or LimitsConfig()
    container: Literal["fresh", "same"] = "same" if image is not None and under is not None else "fresh"

    def failed(why: str) -> VerifierResult:
        return VerifierResult(
            status="setup_failed",
            reason=f"verifier setup failed: {why}",
            duration_s=time.monotonic() - t0,
            container=container,
        )

    if not (tests_dir / TEST_SCRIPT).is_file():
        return failed(f"{tests_dir / TEST_SCRIPT} is missing")
    try:
        support = sandbox_support()
    except SandboxUnavailable as e:
        return failed(str(e))
    cg = support.session_cgroup(
        limits.memory_mb * MiB if limits.memory_mb is not None else None, limits.processes
    )
    scratch: Path | None = None
    status_r = status_w = env_fd = -1
    try:
        try:
            scratch = Path(tempfile.mkdtemp(prefix="rollout-verify-"))
            copy_dest, logs, shell = scratch / "workspace", scratch / "logs", scratch / "bash"
            logs.mkdir()
            shutil.copyfile(_bash(), shell)
            shell.chmod(0o111)
            copied = await asyncio.to_thread(
                _copy,
                workspace,
                copy_dest,
                caps or CopyCaps(max_bytes=(limits.disk_mb or 4096) * MiB),
                baseline,
                under is None,
                image.rootfs if image is not None else Path("/"),
            )
            status_r, status_w = os.pipe()
            os.set_blocking(status_r, False)
            env_fd = env_args(_host_env(image))  # the verifier's variables reach bwrap only
            cg.create(f"rollout-verify-{label[:24]}-{uuid.uuid4().hex[:6]}")
        except BadVariable as e:
            return failed(str(e))
        except OSError as e:
            return failed(f"{type(e).__name__}: {e}")
        rlimits = {"core": 0, "cpu": max(1, math.ceil(cpu_s if cpu_s is not None else timeout_s))}
        if limits.disk_mb is not None:
            rlimits["fsize"] = limits.disk_mb * MiB + 1
        if limits.memory_mb is not None and support.memory is None:
            rlimits["as"] = limits.memory_mb * MiB
        try:
            root = None
            if image is not None:
                (scratch / "root").mkdir()
                root = merged(scratch / "root")
            argv = _command(
                support.bwrap,
                copy_dest,
                tests_dir.resolve(),
                logs,
                shell,
                limits,
                status_w,
                rlimits,
                image,
                root,
                also_at,
                tmp_in_root=under is not None,
                env_fd=env_fd,
            )
            if under is not None:
                if not kept(under):
                    return VerifierResult(
                        status="no_reward",
                        container=container,
                        duration_s=time.monotonic() - t0,
                        reason="the agent's layer was not kept (its sandbox was killed, or the layer could not "
                        "be copied): the tests did not run",
                    )
                cleared = await asyncio.to_thread(clear_mount_points, upper(under), mount_points(argv))
                copied.stripped = [*(copied.stripped or []), *cleared]
            if image is not None:
                argv = wrap(
                    image.rootfs,
                    scratch / "root",
                    limits.disk_mb * MiB if limits.disk_mb else None,
                    argv,
                    under=under,
                )
        except (ImageError, OverlayUnavailable, OSError) as e:
            return failed(f"{type(e).__name__}: {e}")
        argv = cg.joined(argv)  # join the cgroups before bwrap starts anything
        request = SimulationStartRequest(
            job_id="verifier",
            session_id=label,
            agent_name="verifier",
            agent_id="verifier",
            group_id="verifier",
            gateway_base_url="",
            model="",
        )
        try:
            out = await run_local(
                argv,
                request,
                copy_dest,
                timeout_s,
                env=HOST_ENV,
                pass_fds=(status_w, env_fd),
                output_limit=limits.output_mb * MiB if limits.output_mb is not None else None,
                monitor=_monitor(cg, copy_dest, limits),
            )
        except OSError as e:
            return failed(f"cannot start bwrap: {e}")
        try:
            started = os.read(status_r, 4096).decode("utf-8", "replace").strip()
        except BlockingIOError:
            started = ""
        base = VerifierResult(
            status="no_reward",
            container=container,
            exit_code=out.returncode,
            stdout_tail=out.stdout_tail,
            stderr_tail=out.stderr_tail,
            workspace_copy=copied.manifest(),
        )
        if out.status == "timeout":
            return base.model_copy(
                update={
                    "status": "timeout",
                    "duration_s": time.monotonic() - t0,
                    "reason": f"verifier timed out after {timeout_s:g} s (killed)",
                }
            )
        if started != "started":
            why = (
                started.removeprefix("error: ")
                or out.stderr_tail.strip()[-500:]
                or f"exit code {out.returncode}"
            )
            return failed(why).model_copy(
                update={"exit_code": out.returncode, "stderr_tail": out.stderr_tail}
            )
        if out.limit_exceeded:
            return base.model_copy(
                update={
                    "limit_exceeded": out.limit_exceeded,
                    "reason": out.error_text,
                    "duration_s": time.monotonic() - t0,
                }
            )
        if out.returncode is None or out.returncode < 0 or out.returncode >= 128:
            why = f"the test script was killed (exit code {out.returncode}): its reward files are not trusted"
            return base.model_copy(update={"reason": why, "duration_s": time.monotonic() - t0})
        reward, parsed, how = await asyncio.to_thread(read_reward, logs)
        said = last_line(out.stderr_tail) or last_line(out.stdout_tail)
        told = f"; the tests' output ends: {said}" if said and (reward is None or reward < 1) else ""
        return base.model_copy(
            update={
                "status": "rewarded" if reward is not None else "no_reward",
                "reward": reward,
                "reward_json": parsed,
                "reason": f"{how} (exit code {out.returncode}){told}",
                "duration_s": time.monotonic() - t0,
            }
        )
    finally:
        await cg.aremove()
        for fd in (status_r, status_w, env_fd):
            if fd >= 0:
                os.close(fd)
        if scratch is not None:
            await asyncio.shield(asyncio.to_thread(_remove, scratch))


def last_line(text: str, limit: int = 200) -> str:
    """The last non-empty line of ``text``, at most ``limit`` characters (its end): what a reward
    under 1 most likely says about itself (``curl: command not found``, a failed assertion)."""
    line = next((x.strip() for x in reversed(text.splitlines()) if x.strip()), "")
    return line if len(line) <= limit else "..." + line[-limit:]


async def verify_session(
    cfg: EnvConfig,
    case: Case,
    workspace: Path,
    label: str,
    image: ImageRoot | None = None,
    changes: Path | None = None,
) -> VerifierResult | None:
    """The verifier of ``case`` on its session's final ``workspace`` (None: the case has no
    tests), with the env's session limits and the task's verifier timeout, in the session's
    ``image`` when it ran in one, over the layer it kept in ``changes`` (same-container: a verifier
    that cannot start there but starts on a fresh copy of the image is the agent's ``no_reward``)."""
    if case.tests_dir is None:
        return None
    timeout = _number(case.row.get("verifier_timeout_s"))
    timeout_s = timeout if timeout is not None and timeout > 0 else DEFAULT_VERIFIER_TIMEOUT_S
    workdir = case.row.get("workdir") if cfg.dataset.format == "harbor" else None
    baseline = (
        image.rootfs / image.workdir.lstrip("/")
        if image is not None
        else Path(case.files_dir)
        if case.files_dir
        else None
    )
    tests = Path(case.tests_dir)

    async def run(under: Path | None) -> VerifierResult:
        return await run_verifier(
            workspace,
            tests,
            timeout_s=timeout_s,
            limits=cfg.runtime.limits,
            label=label,
            image=image,
            also_at=workdir if isinstance(workdir, str) else cfg.workdir,
            baseline=baseline,
            under=under,
        )

    got = await run(changes if image is not None else None)
    if changes is None or image is None or got.status != "setup_failed":
        return got
    # on the agent's layer the verifier could not start: whose failure it is, a fresh copy of the image says
    if (await run(None)).status == "setup_failed":
        return got
    return got.model_copy(
        update={
            "status": "no_reward",
            "reason": f"{got.reason}; on a fresh copy of the image it starts: the agent's layer stopped it",
        }
    )


def verifier_outcome(result: VerifierResult) -> Evaluation:
    """The evaluation committed from a verifier alone (an env without ``rule_evaluator.py``):
    ``scored`` with reward x 10 clamped to 0..10, or 0 when it wrote no reward; ``timeout`` (0,
    a grading failure) when it timed out; ``error`` when it could not start."""
    detail = {"verifier": result.for_evaluator()}
    if result.status == "rewarded" and result.reward is not None:
        return Evaluation(
            status="scored",
            score=min(10.0, max(0.0, result.reward * 10)),
            raw_repr=repr(result.reward),
            reason=cut_text(f"verifier reward {result.reward:g}: {result.reason}"),
            artifacts=detail,
            duration_s=result.duration_s,
            isolation="bwrap",
        )
    status: Literal["scored", "timeout", "error"] = {"no_reward": "scored", "timeout": "timeout"}.get(
        result.status, "error"
    )  # type: ignore[assignment]
    why = result.reason or result.status
    if result.status == "no_reward":
        why = f"no reward: {why}"
    return Evaluation(
        status=status,
        score=0.0,
        reason=cut_text(why),
        artifacts=detail,
        duration_s=result.duration_s,
        isolation="bwrap",
    )
