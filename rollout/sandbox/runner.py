"""Runs one session's runtime the way its env asks: in a bubblewrap sandbox (default) with the
gateway bridge, the session's cgroups and its limits, or without isolation (``sandbox: none``).

``run_runtime`` never raises for the session's own problems: a sandbox that cannot be set up is an
outcome with ``setup_failed=True``; a limit exceeded is ``status=error`` naming the limit.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import errno
import functools
import json
import logging
import os
import resource
import shutil
import stat
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import rollout.contract.protocol
from rollout.contract.harness import SOLUTION_ENV
from rollout.contract.protocol import SimulationStartRequest, model_json
from rollout.core.envs import EnvConfig, EnvConfigError, LimitsConfig, load_env_config
from rollout.core.trees import reopen
from rollout.sandbox.bridge import BridgeError, GatewayBridge
from rollout.sandbox.bwrap import (
    GATEWAY_PORT,
    HOST_ENV,
    INSTRUCTION,
    BadVariable,
    SandboxSpec,
    SandboxUnavailable,
    Support,
    bwrap_command,
    clean_env,
    env_args,
    file_state,
    image_env,
    inside_url,
    probe,
)
from rollout.sandbox.cgroups import SessionCgroup
from rollout.sandbox.images import ImageError, ImageRoot, bound_at
from rollout.sandbox.netns import ENV_FD, GATE_FD, STATUS_FD, NetnsError, NetnsMaker, Spawned
from rollout.sandbox.overlay import OverlayUnavailable, merged, wrap
from rollout.sandbox.runtime_local import Monitor, RuntimeRun, Started, run_local

MiB = 1024 * 1024
CODE_ROOT = Path(rollout.contract.protocol.__file__).resolve().parents[2]
"""The project folder whose ``env/*.py`` and ``rollout/contract/`` runtimes import."""
CONTRACT = CODE_ROOT / "rollout" / "contract"
"""The in-sandbox contract, bound read-only as one folder."""
PUBLIC_ALIASES = ("__init__.py", "protocol.py", "harness.py", "errors.py")
"""``rollout/`` files bound beside it: the package, the contract's public import paths and the
errors' base the contract imports."""

log = logging.getLogger("rollout.sandbox.runner")


@functools.cache
def sandbox_support() -> Support:
    """This machine's sandbox support, checked once per process; this process's open-files soft
    limit is raised to its hard limit then (each session's bridge may hold ``MAX_CONNECTIONS``).
    Raises SandboxUnavailable."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 20 if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return probe()


def effective_mode(cfg: EnvConfig, job_mode: str) -> str:
    """``none`` when the job or the env opts out of the sandbox, else ``bwrap``."""
    return "none" if "none" in (job_mode, cfg.runtime.sandbox) else "bwrap"


def shared_code() -> list[Path]:
    """The project files every runtime may import: ``env/*.py`` and the contract's public paths
    (``rollout.protocol``, ``rollout.harness``); the contract folder itself is ``CONTRACT``."""
    state = file_state(CODE_ROOT / "env")
    listed = _shared_code(state) if state is not None else ()
    return [*listed, *(CODE_ROOT / "rollout" / f for f in PUBLIC_ALIASES)]


@functools.lru_cache(maxsize=1)
def _shared_code(state: tuple[int, ...]) -> tuple[Path, ...]:
    """``env/*.py`` as the folder is in ``state`` (``file_state``: listed again when it changes)."""
    return tuple(sorted((CODE_ROOT / "env").glob("*.py")))


@dataclass(frozen=True)
class RuntimeCommand:
    """A command run instead of the env's runtime (a harness session): ``argv``, the folders it
    needs read-only at their host paths (``folders``: nothing of the env folder is bound then,
    unless ``env_code``: the env's code folders too, hidden paths hidden, as its own runtime sees
    them), and ``env``: variables given to it instead of the env's ``runtime.env`` /
    ``pass_env``; ``solution``: a task's reference solution folder, bound read-only at
    :data:`SOLUTION_AT` as Harbor's oracle has it (at its own path without the sandbox), its path
    in ``SOLUTION_ENV``. The env's limits, timeout and sandbox mode still apply."""

    argv: list[str]
    folders: list[Path] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    env_code: bool = False
    solution: Path | None = None


SOLUTION_AT = "/solution"


_CODE: dict[
    tuple[object, ...], tuple[tuple[object, ...], tuple[list[tuple[Path, list[Path]]], list[Path]]]
] = {}


def code_folders(cfg: EnvConfig) -> tuple[list[tuple[Path, list[Path]]], list[Path]]:
    """(folders with their hidden paths, single files) a runtime's command needs read-only: its
    env folder, and for each absolute path of an existing *file* in the command (folders never:
    an argument like ``/`` must not bind the host), the env folder holding it
    (``<root>/env/<name>/``) or the file itself (the interpreter's files are bound anyway).
    Looked up once per process and per state of those folders, of the other envs' ``env.yaml``
    and of the command's files (``file_state``: an entry added, removed or renamed, a file
    rewritten)."""
    command = cfg.command()
    key = (
        str(cfg.env_dir),
        cfg.dataset.path,
        *((a, file_state(Path(a)) if a.startswith("/") else None) for a in command),
    )
    kept = _CODE.get(key)
    if kept is None or kept[0] != _states(kept[1][0], cfg.env_dir):
        made = _code_folders(cfg)
        if len(_CODE) >= 64:
            _CODE.clear()
        kept = _CODE[key] = (_states(made[0], cfg.env_dir), made)
    folders, files = kept[1]
    return [(f, list(hidden)) for f, hidden in folders], list(files)


def _states(folders: list[tuple[Path, list[Path]]], env_dir: Path) -> tuple[object, ...]:
    """What ``_code_folders`` read: each folder's state, and another env's ``env.yaml``'s."""
    paths = [f for f, _ in folders]
    paths += [f / "env.yaml" for f in paths if f != env_dir]
    return tuple(file_state(p) for p in paths)


def _code_folders(cfg: EnvConfig) -> tuple[list[tuple[Path, list[Path]]], list[Path]]:
    folders: list[tuple[Path, list[Path]]] = [(cfg.env_dir, cfg.hidden_paths())]
    files: list[Path] = []
    env_root = CODE_ROOT / "env"
    for arg in cfg.command():
        p = Path(arg)
        if not p.is_absolute() or not p.is_file() or p.resolve().is_relative_to(cfg.env_dir.resolve()):
            continue
        p = p.resolve()
        if any(p.is_relative_to(Path(d).resolve()) for d in (sys.prefix, sys.base_prefix)):
            continue  # the interpreter: bound anyway
        if p.is_relative_to(env_root) and p != env_root and len(p.relative_to(env_root).parts) >= 2:
            folder = env_root / p.relative_to(env_root).parts[0]
            hidden = [folder / "data", folder / "tasks"]
            if (folder / "env.yaml").is_file():
                with contextlib.suppress(EnvConfigError):
                    hidden += load_env_config(folder / "env.yaml").hidden_paths()
            folders.append((folder, hidden))
        else:
            files.append(p)
    return folders, files


def session_env(base_url: str, extra_env: dict[str, str]) -> dict[str, str]:
    """The variables pointing a runtime at its session: ``OPENAI_BASE_URL``, ``ANTHROPIC_BASE_URL``,
    ``GATEWAY_BASE_URL`` (= ``base_url``) and the API keys (``OPENAI_API_KEY`` of ``extra_env``,
    default ``sk-rollout-local``, also as ``ANTHROPIC_API_KEY`` and ``GATEWAY_API_KEY``)."""
    key = extra_env.get("OPENAI_API_KEY", "sk-rollout-local")
    return {
        "OPENAI_BASE_URL": base_url,
        "ANTHROPIC_BASE_URL": base_url,
        "GATEWAY_BASE_URL": base_url,
        "OPENAI_API_KEY": key,
        "ANTHROPIC_API_KEY": extra_env.get("ANTHROPIC_API_KEY", key),
        "GATEWAY_API_KEY": key,
    }


def case_instruction(request: SimulationStartRequest) -> str | None:
    """The case's instruction (``instruction`` of the public row, as harnesses read it), None
    when it has none."""
    row = request.env_params.get("dataset")
    text = row.get("instruction") if isinstance(row, dict) else None
    return text if isinstance(text, str) else None


def task_env(request: SimulationStartRequest) -> dict[str, str]:
    """The variables telling a runtime which case it runs: ``ROLLOUT_CASE_ID`` and
    ``ROLLOUT_INSTRUCTION_PATH`` (each only when the request has it)."""
    env = {"ROLLOUT_CASE_ID": request.case_id, "ROLLOUT_INSTRUCTION_PATH": request.instruction_path}
    return {k: v for k, v in env.items() if v is not None and _env_safe(v)}


def _write_instruction(folder: Path, text: str) -> Path:
    """``text`` as ``folder/instruction.md``, read-only."""
    path = folder / "instruction.md"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    path.chmod(0o444)
    return path


SAFACTORY_RESULT_FILE = "safactory_result.json"
"""``SAFACTORY_RESULT_PATH``: this file of the workspace, read for the result when stdout holds
none (as Safactory does)."""
_REQUEST_ENV_MAX = 96 * 1024
"""``SAFACTORY_START_REQUEST_JSON`` is left out over this size (one variable's limit is 128 KiB)."""


def safactory_env(request: SimulationStartRequest, workspace: str) -> dict[str, str]:
    """The variables Safactory's runners read (docs/envs.md, "Coming from Safactory"; given to the
    runtimes of envs with ``runtime.safactory_env``), from the session's own start request: ids, the session URL (``request.gateway_base_url``) and its root,
    the route, the result path in ``workspace`` (as the runtime sees it) and the case's
    ``task_id`` / ``task_path`` / ``category`` when its row has them. No key: the runtime's API key
    is ``OPENAI_API_KEY`` (``session_env``)."""
    url = request.gateway_base_url.rstrip("/")
    root = url.removesuffix(f"/{request.session_id}")
    env = {
        "SAFACTORY_JOB_ID": request.job_id,
        "SAFACTORY_SESSION_ID": request.session_id,
        "SAFACTORY_AGENT_NAME": request.agent_name,
        "SAFACTORY_AGENT_ID": request.agent_id,
        "SAFACTORY_GATEWAY_BASE_URL": root,
        "SAFACTORY_GATEWAY_SESSION_URL": url,
        "SAFACTORY_GATEWAY_SESSION_URL_CONTAINER": url,
        "OPENROUTER_BASE_URL": url,
        "SAFACTORY_ROUTE_MODEL": request.model,
        "SAFACTORY_MODEL_REF": f"safactory/{request.model}",
        "SAFACTORY_RESULT_PATH": f"{workspace.rstrip('/')}/{SAFACTORY_RESULT_FILE}",
    }
    row = request.env_params.get("dataset")
    if isinstance(row, dict):
        for key in ("task_id", "task_path", "category"):
            value = row.get(key)
            if isinstance(value, str | int) and not isinstance(value, bool) and _env_safe(str(value)):
                env[f"SAFACTORY_{key.upper()}"] = str(value)
    text = model_json(request)
    if len(text) <= _REQUEST_ENV_MAX and _env_safe(text):
        env["SAFACTORY_START_REQUEST_JSON"] = text
    return {k: v for k, v in env.items() if _env_safe(v)}


def _env_safe(text: str) -> bool:
    """Whether ``text`` can be an environment variable's value (UTF-8, no NUL)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\0" not in text


ENTRY_BYTES = 4096
"""The least one workspace entry counts (one file-system block): empty files, links and folders
use inodes and blocks too, so a flood of them reaches the disk limit."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


class DiskUse(NamedTuple):
    """What a workspace holds: ``bytes`` (each entry its size or allocated blocks, whichever is
    larger, at least :data:`ENTRY_BYTES`) and ``entries`` (files, folders, links, ...)."""

    bytes: int
    entries: int


class _Over(Exception):
    """The walk went past a limit: it stops there."""


def disk_used(folder: Path, stop_above: int | None = None, max_entries: int | None = None) -> DiskUse:
    """What ``folder`` holds (:class:`DiskUse`; ``folder`` itself not counted). The walk goes
    through directory file descriptors, one name at a time (``openat`` with ``O_NOFOLLOW``): it
    never follows a link and never fails on depth (no path is ever longer than one name), so a
    tree deeper than ``PATH_MAX`` counts in full. It holds one descriptor at a time: up through
    ``..``, checked to be the folder it came from (when a runtime moved it meanwhile, that part
    is reached again from the top, by name). It stops once ``bytes`` is above ``stop_above`` or
    ``entries`` above ``max_entries``. Entries that vanish while it walks are skipped; anything
    else it cannot read (a folder made unreadable) raises OSError: what it holds cannot be told."""
    total = [0, 0]

    def scan(fd: int) -> list[str]:
        subdirs = []
        with os.scandir(fd) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # gone meanwhile
                size = st.st_size if stat.S_ISREG(st.st_mode) else 0
                total[0] += max(size, st.st_blocks * 512, ENTRY_BYTES)
                total[1] += 1
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append(e.name)
                if (stop_above is not None and total[0] > stop_above) or (
                    max_entries is not None and total[1] > max_entries
                ):
                    raise _Over
        return subdirs

    def ident(fd: int) -> tuple[int, int]:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino

    root = os.open(folder, _DIR_FLAGS)
    fd = os.dup(root)
    try:
        levels = [(ident(fd), scan(fd))]  # per level down from the top: (its identity, subfolders left)
        names: list[str] = []  # the path of the current folder, one name per level
        while levels:
            if levels[-1][1]:
                name = levels[-1][1].pop()
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno in _GONE:
                        continue  # gone, or replaced by a link or a file: its entry is counted already
                    raise OSError(e.errno, f"{e.strerror}: folder {'/'.join([*names, name])!r}") from None
                os.close(fd)
                fd = child
                names.append(name)
                levels.append((ident(fd), scan(fd)))
                continue
            levels.pop()
            if not levels:
                break
            names.pop()
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            if ident(fd) != levels[-1][0]:  # moved while walked: reach it again from the top
                os.close(fd)
                fd = reopen(root, names, [lv[0] for lv in levels])
                if fd < 0:  # gone: what is left of it is not counted this time
                    fd = os.dup(root)
                    del levels[1:], names[:]
    except _Over:
        pass
    finally:
        os.close(fd)
        os.close(root)
    return DiskUse(total[0], total[1])


_LAUNCHER_SHORT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})
"""Errors of measuring a workspace that say the launcher ran short (open files, memory): the check
is made again at the next round, never counted against the session."""


def _disk_check(workspace: Path, limits: LimitsConfig) -> Callable[[], tuple[str, str] | None] | None:
    """The workspace's disk and file-count limits as a blocking check (None without either)."""
    if limits.disk_mb is None and limits.max_files is None:
        return None
    cap = limits.disk_mb * MiB if limits.disk_mb is not None else None

    def check() -> tuple[str, str] | None:
        try:
            use = disk_used(workspace, cap, limits.max_files)
        except OSError as e:
            if e.errno in _LAUNCHER_SHORT:  # the launcher's own shortage, not the workspace's
                log.warning("disk limit: the workspace cannot be measured this time (%s)", e.strerror or e)
                return None
            return "disk", f"disk limit: the workspace cannot be measured ({e.strerror or e})"
        if cap is not None and use.bytes > cap:
            return "disk", f"disk limit exceeded: the workspace holds more than {limits.disk_mb} MiB"
        if limits.max_files is not None and use.entries > limits.max_files:
            return "files", (
                f"file limit exceeded: the workspace holds more than {limits.max_files} "
                "files, folders and links"
            )
        return None

    return check


def _disk_monitor(workspace: Path, limits: LimitsConfig) -> Monitor | None:
    """The disk check in a thread, none while the workspace is empty (nothing to add up)."""
    disk = _disk_check(workspace, limits)
    if disk is None:
        return None

    async def monitor() -> tuple[str, str] | None:
        return None if _empty(workspace) else await asyncio.to_thread(disk)

    return monitor


def _limit_monitor(cg: SessionCgroup, workspace: Path, limits: LimitsConfig) -> Monitor:
    """The cgroups' limits (their counters: files of the kernel's, read at once on the event loop)
    and the disk check, in a thread unless the workspace is empty."""
    disk = _disk_check(workspace, limits)

    def groups() -> tuple[str, str] | None:
        hit = cg.exceeded()
        if hit == "memory":
            return "memory", (
                f"memory limit exceeded: the session used more than {limits.memory_mb} MiB "
                "(the kernel killed a process)"
            )
        if hit == "processes":
            return "processes", (
                f"process limit exceeded: the session tried to run more than "
                f"{limits.processes} processes/threads at once"
            )
        return None

    async def monitor() -> tuple[str, str] | None:
        if over := groups():
            return over
        return None if disk is None or _empty(workspace) else await asyncio.to_thread(disk)

    return monitor


class _Networks:
    """How sandboxes reach the bridge in this process: the launcher listening in each sandbox's
    network, the sandbox started there by the helper (``rollout.sandbox.netns``), or, once the
    helper's first network failed (``off`` says why, logged once), the forwarder in each sandbox."""

    def __init__(self) -> None:
        self.maker: NetnsMaker | None = None
        self.off: str | None = None
        self.worked = False

    async def ready(self) -> bool:
        """Whether sandboxes start in a network of the helper's: until one worked, each call makes
        one (and drops it) to check that this works here (the first sessions may check at once)."""
        if self.worked or self.off is not None:
            return self.off is None
        if self.maker is None:
            self.maker = NetnsMaker(GATEWAY_PORT)
            atexit.register(self.maker.close)  # the helper exits at EOF; waited for here
        try:
            (await self.maker.make()).close()
            self.worked = True
        except NetnsError as e:
            if not self.worked and self.off is None:
                self.off = str(e)
                log.warning("sandboxes use the forwarder to reach the gateway bridge: %s", e)
        return self.off is None

    async def spawn(
        self,
        argv: list[str],
        fds: list[int],
        rlimits: dict[str, int],
        procs: list[str],
        cwd: str,
        *,
        gated: bool,
    ) -> Spawned:
        """``NetnsMaker.spawn`` (after ``ready()`` said yes). Raises NetnsError."""
        assert self.maker is not None
        return await self.maker.spawn(argv, fds, rlimits, procs, cwd, gated=gated)

    def close(self) -> None:
        """Stop the helper (a later session starts it again)."""
        if self.maker is not None:
            self.maker.close()


_NETWORKS = _Networks()


def _output_limit(limits: LimitsConfig) -> int | None:
    return limits.output_mb * MiB if limits.output_mb is not None else None


async def run_runtime(
    cfg: EnvConfig,
    request: SimulationStartRequest,
    workspace: Path,
    extra_env: dict[str, str],
    job_mode: str = "bwrap",
    *,
    command: RuntimeCommand | None = None,
    stderr_log: Path | None = None,
    image: ImageRoot | None = None,
    changes: Path | None = None,
) -> RuntimeRun:
    """Run ``cfg``'s runtime for ``request`` in ``workspace`` (sandboxed unless ``job_mode`` or the
    env says ``none``), or ``command`` instead (a harness session) under the same limits. Its
    variables: ``pass_env`` names copied from this process, then the env's ``runtime.env`` (with
    ``command``: its ``env`` instead of both), then ``extra_env`` (the launcher's: the gateway key
    as ``OPENAI_API_KEY``), then the session's (``session_env``). ``stderr_log``: a host file that
    keeps the runtime's whole stderr. ``image``: the session's root file system (docs/images.md:
    the workspace at its WORKDIR, its ENV and USER; it needs the sandbox); ``changes``: an empty
    host folder the session's copy-on-write layer over the image (capped at ``disk_mb``, ``/tmp``
    in it) is copied into when it ends (for a verifier in the same container). The workspace is left
    as the runtime left it: graders only ever read a copy of it as data (``rollout.grading``).
    Never raises except CancelledError."""
    return await _run_runtime(
        cfg, request, workspace, extra_env, job_mode, command, stderr_log, image, changes
    )


async def _run_runtime(
    cfg: EnvConfig,
    request: SimulationStartRequest,
    workspace: Path,
    extra_env: dict[str, str],
    job_mode: str,
    command: RuntimeCommand | None,
    stderr_log: Path | None,
    image: ImageRoot | None = None,
    changes: Path | None = None,
) -> RuntimeRun:
    own = (
        {**command.env, **_solution_env(command, job_mode, cfg)}
        if command is not None
        else {**{k: os.environ[k] for k in cfg.runtime.pass_env if k in os.environ}, **cfg.runtime.env}
    )
    extra = {**own, **extra_env}
    limits = cfg.runtime.limits
    argv = command.argv if command is not None else cfg.command()
    if effective_mode(cfg, job_mode) == "none":
        if image is not None:
            return _setup_failed(
                time.monotonic(),
                "a session in an image runs in the sandbox only (not with "
                "--sandbox none / runtime.sandbox: none)",
            ).model_copy(update={"sandbox": "none"})
        t0 = time.monotonic()
        text = case_instruction(request)
        folder = Path(tempfile.mkdtemp(prefix="rollout-task-")) if text is not None else None
        try:
            if folder is not None and text is not None:
                request = request.model_copy(
                    update={"instruction_path": str(_write_instruction(folder, text))}
                )
            sf = (
                safactory_env(request, str(workspace))
                if command is None and cfg.runtime.safactory_env
                else {}
            )
            env = {**extra, **sf, **session_env(request.gateway_base_url, extra), **task_env(request)}
            out = await run_local(
                argv,
                request,
                workspace,
                cfg.runtime.timeout_s,
                env,
                output_limit=_output_limit(limits),
                monitor=_disk_monitor(workspace, limits),
                stderr_log=stderr_log,
                result_file=SAFACTORY_RESULT_FILE if sf else None,
            )
        except OSError as e:
            out = RuntimeRun(
                status="error",
                duration_s=time.monotonic() - t0,
                setup_failed=True,
                error_text=f"cannot start runtime {argv[:3]}: {e}",
            )
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        return out.model_copy(update={"sandbox": "none"})
    out = await _run_sandboxed(cfg, request, workspace, extra, command, stderr_log, image, changes)
    return out.model_copy(update={"sandbox": "bwrap"})


def _solution_env(command: RuntimeCommand, job_mode: str, cfg: EnvConfig) -> dict[str, str]:
    """``SOLUTION_ENV``: where ``command``'s solution folder is for it (none without one)."""
    if command.solution is None:
        return {}
    return {SOLUTION_ENV: str(command.solution) if effective_mode(cfg, job_mode) == "none" else SOLUTION_AT}


def _empty(folder: Path) -> bool:
    """Whether ``folder`` holds nothing (then no thread is needed to measure it); False when it
    cannot be listed (the check in the thread reports that)."""
    try:
        with os.scandir(folder) as it:
            return next(it, None) is None
    except OSError:
        return False


def _setup_failed(t0: float, why: str) -> RuntimeRun:
    return RuntimeRun(
        status="error",
        setup_failed=True,
        duration_s=time.monotonic() - t0,
        error_text=f"sandbox setup failed: {why}",
    )


async def _run_sandboxed(
    cfg: EnvConfig,
    request: SimulationStartRequest,
    workspace: Path,
    extra: dict[str, str],
    command: RuntimeCommand | None,
    stderr_log: Path | None,
    image: ImageRoot | None,
    changes: Path | None = None,
) -> RuntimeRun:
    t0 = time.monotonic()
    limits = cfg.runtime.limits
    try:
        support = sandbox_support()
    except SandboxUnavailable as e:
        return _setup_failed(t0, str(e))
    sid = request.session_id
    cg = support.session_cgroup(
        limits.memory_mb * MiB if limits.memory_mb is not None else None, limits.processes
    )
    scratch: Path | None = None
    status_r = status_w = -1
    bridge: GatewayBridge | None = None
    spawned: Spawned | None = None
    ours: list[int] = []  # the launcher's ends of the spawned command's pipes, until run_local takes them
    env_fd = -1

    def scratch_dir() -> Path:
        """Made when needed: the forwarder's socket (a short path), the instruction, an image's root."""
        nonlocal scratch
        if scratch is None:
            scratch = Path(tempfile.mkdtemp(prefix="rollout-sbx-"))
        return scratch

    try:
        try:
            status_r, status_w = os.pipe()
            os.set_blocking(status_r, False)
            cg.create(f"rollout-{sid[:24]}-{uuid.uuid4().hex[:6]}")  # a few writes to the cgroup fs
            # the launcher listens in the sandbox's network wherever the helper can make one
            in_net = await _NETWORKS.ready()
            if not in_net:
                bridge = GatewayBridge(scratch_dir() / "gw.sock", request.gateway_base_url)
                await bridge.__aenter__()
            text = case_instruction(request)
            instruction = _write_instruction(scratch_dir(), text) if text is not None else None
        except (OSError, BridgeError) as e:
            return _setup_failed(t0, f"{type(e).__name__}: {e}")
        rlimits = {"core": 0}
        if limits.disk_mb is not None:
            rlimits["fsize"] = limits.disk_mb * MiB + 1  # a file that reached this tried to go past the limit
        if limits.memory_mb is not None and support.memory is None:
            rlimits["as"] = limits.memory_mb * MiB
        folders, files = code_folders(cfg) if command is None or command.env_code else ([], [])
        if command is not None:
            folders = [*folders, *((f, []) for f in command.folders)]
        disk = limits.disk_mb * MiB if limits.disk_mb is not None else None
        spec = SandboxSpec(
            workspace=workspace,
            code=[(CONTRACT, []), *folders],
            files=[*shared_code(), *files],
            bridge_socket=bridge.socket_path if bridge is not None else None,
            status_fd=status_w,
            tmp_bytes=disk,
            rlimits=rlimits if not in_net else {},
            instruction=instruction,
            also_at=cfg.workdir,
            mounts=[(command.solution, SOLUTION_AT)] if command is not None and command.solution else [],
        )
        if image is not None:
            try:
                spec = image_spec(spec, image, scratch_dir() / "root")
            except (ImageError, OSError) as e:
                return _setup_failed(t0, f"{type(e).__name__}: {e}")
            if changes is not None:  # the image's own /tmp, in the layer the verifier gets
                spec = dataclasses.replace(spec, tmp_bytes=None, tmp_in_root=True)
        url = inside_url(request.gateway_base_url)
        inside = request.model_copy(
            update={
                "gateway_base_url": url,
                "instruction_path": INSTRUCTION if instruction is not None else None,
            }
        )
        sf = safactory_env(inside, spec.workdir) if command is None and cfg.runtime.safactory_env else {}
        own = {"PYTHONPATH": str(CODE_ROOT), **extra, **sf, **session_env(url, extra), **task_env(inside)}
        env = clean_env(own) if image is None else image_env(image.env, own, _image_home(image, spec))
        try:  # the session's variables reach bwrap only (docs/sandbox.md, "Environment")
            env_fd = env_args(env)
        except BadVariable as e:
            return _setup_failed(t0, str(e))
        except OSError as e:
            return _setup_failed(t0, f"{type(e).__name__}: {e}")
        spec = dataclasses.replace(  # the fds as bwrap has them: the helper moves them (netns_helper)
            spec,
            env_fd=ENV_FD if in_net else env_fd,
            status_fd=STATUS_FD if in_net else status_w,
            gate_fd=GATE_FD if in_net and image is None else None,  # an image's bwrap runs under a wrapper
        )
        argv = bwrap_command(support, spec, command.argv if command is not None else cfg.command())
        if image is not None:
            try:
                # the copy-on-write root's namespace
                argv = wrap(image.rootfs, scratch_dir() / "root", disk, argv, keep=changes)
            except OverlayUnavailable as e:
                return _setup_failed(t0, str(e))
        adopted: Started | None = None
        if in_net:
            try:
                made: list[int] = []
                try:
                    for _ in range(3):
                        made += os.pipe2(os.O_CLOEXEC)
                except OSError:
                    for fd in made:
                        os.close(fd)
                    raise
                stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w = made
                ours += [stdin_w, stdout_r, stderr_r]
                theirs = [stdin_r, stdout_w, stderr_w]
                try:
                    spawned = await _NETWORKS.spawn(
                        argv,
                        [*theirs, status_w, env_fd],
                        rlimits,
                        cg.procs_files,
                        str(workspace),
                        gated=spec.gate_fd is not None,
                    )
                finally:
                    for fd in theirs:
                        os.close(fd)
                bridge = GatewayBridge(None, request.gateway_base_url, listener=spawned.listener)
                await bridge.__aenter__()
            except NetnsError as e:
                return _setup_failed(t0, str(e))
            except (OSError, BridgeError) as e:
                return _setup_failed(t0, f"{type(e).__name__}: {e}")
            adopted = Started(spawned.pgid, stdin_w, stdout_r, stderr_r, spawned.ended)
            ours = []  # run_local's now
        else:
            argv = cg.joined(argv)  # join the session's cgroups before bwrap starts anything
        assert bridge is not None
        try:
            out = await run_local(
                argv,
                inside,
                workspace,
                cfg.runtime.timeout_s,
                env=HOST_ENV,
                pass_fds=(status_w, env_fd),
                output_limit=_output_limit(limits),
                monitor=_limit_monitor(cg, workspace, limits),
                stderr_log=stderr_log,
                result_file=SAFACTORY_RESULT_FILE if sf else None,
                started=adopted,
            )
        except OSError as e:
            return _setup_failed(t0, f"cannot start bwrap: {e}")
        if bridge.refused > 1 or bridge.over_cap:
            log.warning(
                "session %s: the gateway bridge refused %d request(s) and closed %d connection(s) over its cap",
                sid,
                bridge.refused,
                bridge.over_cap,
            )
        started = _read_status(status_r)
        # not started and not stopped by the launcher (killed, bwrap reports no exit code): setup failed
        if started != "started" and out.status != "timeout" and out.limit_exceeded is None:
            argv0 = command.argv if command is not None else cfg.command()
            why = started.removeprefix("error: ") if started else _setup_error(out, argv0)
            return out.model_copy(
                update={
                    "status": "error",
                    "setup_failed": True,
                    "result": None,
                    "limit_exceeded": None,
                    "error_text": f"sandbox setup failed: {why}",
                }
            )
        if bridge.unreachable is not None:
            return out.model_copy(
                update={
                    "gateway_unreachable": (
                        f"the gateway bridge could not reach the gateway ({bridge.connect_failures} failed "
                        f"connection(s), the last: {bridge.unreachable})"
                    )
                }
            )
        return out
    finally:
        if bridge is not None:
            await bridge.__aexit__(None, None, None)
        if spawned is not None:
            spawned.close()  # a command still running is killed with its group
        for fd in ours:
            os.close(fd)
        await cg.aremove()
        for fd in (status_r, status_w, env_fd):
            if fd >= 0:
                os.close(fd)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def image_spec(spec: SandboxSpec, image: ImageRoot, folder: Path) -> SandboxSpec:
    """``spec`` in ``image``: the merged root (its overlay mounted at ``folder``, made here), the
    WORKDIR (``/workspace`` for an image whose WORKDIR is ``/``), the USER. Raises ImageError
    for a USER the image does not know, OSError when ``folder`` cannot be made."""
    uid = image.uid_gid()
    folder.mkdir()
    return dataclasses.replace(spec, root=merged(folder), workdir=image_workdir(image), uid=uid)


def image_workdir(image: ImageRoot) -> str:
    """Where the workspace is in ``image``: its WORKDIR, ``/workspace`` when that is ``/``."""
    return bound_at(image)


def _image_home(image: ImageRoot, spec: SandboxSpec) -> str:
    """HOME in an image: its ENV's, else ``/root`` for root, else the WORKDIR."""
    return image.env.get("HOME") or ("/root" if spec.uid[0] == 0 else spec.workdir)


def _read_status(fd: int) -> str:
    """What the status pipe says: ``started`` once bwrap started the runtime (its
    ``--json-status-fd`` has an ``exit-code`` only for a command it exec'd; nothing in the sandbox
    holds the pipe), else the first line the forwarder or the helper wrote (``started`` or
    ``error: ...``: anything after it is not theirs), else ""."""
    try:
        text = os.read(fd, 65536).decode("utf-8", "replace")
    except BlockingIOError:
        return ""
    if text.startswith("{"):
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                said = json.loads(line)
                if isinstance(said, dict) and "exit-code" in said:
                    return "started"
        return ""
    return text.strip().split("\n", 1)[0].strip()


def _setup_error(out: RuntimeRun, argv: list[str]) -> str:
    """Why a runtime bwrap did not start failed: bwrap's last words (its stderr), the command not
    found (or not executable) said as such."""
    said = [line for line in out.stderr_tail.strip().splitlines() if line.startswith("bwrap: ")]
    if said and said[-1].startswith("bwrap: execvp "):
        return f"cannot start runtime {argv[:3]}: no such command in the sandbox ({said[-1]})"
    return said[-1] if said else (out.stderr_tail.strip()[-500:] or f"exit code {out.returncode}")
