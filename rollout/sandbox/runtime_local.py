"""The ``local`` runtime backend: one subprocess per session, in its own temporary workspace.

The runtime gets the ``SimulationStartRequest`` JSON on stdin and must print a
``SimulationStartResult`` JSON object (last, or in one of Safactory's forms: ``parse_result``) and
exit 0 (a runtime that exits otherwise printed no result, whatever its output says). It runs in a new process group (``start_new_session``)
so that a timeout or Ctrl-C kills it and every child it started (``killpg(SIGKILL)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import stat
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from pydantic import BaseModel, ValidationError

from rollout.contract.protocol import SimulationStartRequest, SimulationStartResult, model_json
from wire.text import json_text

log = logging.getLogger(__name__)
WITHHELD_ENV = frozenset({"GATEWAY_ADMIN_KEY"})
"""Variables of the launcher's environment a runtime never inherits: the gateway's admin key
(``rollout.jobs.processes.GATEWAY_ADMIN_KEY_ENV``) is the launcher's alone."""
_TAIL = 4000
_STDOUT_KEEP = 8 * 1024 * 1024
_STDERR_KEEP = 64 * 1024
_PIPE_GRACE_S = 2.0
_WATCH_EVERY_S = 0.25
_WATCH_IDLE = 9  # after a check that took t seconds, the next comes no sooner than 9 t later
_WATCH_MAX_S = 2.0  # what a session can write past the disk limit before it is seen: 2 s of writes

Monitor = Callable[[], Awaitable[tuple[str, str] | None]]
"""Awaited while a runtime runs and once after it exits (its file or cgroup reads in a thread
when it has any to do): ``(limit, reason)`` when the session went over one of its limits (e.g.
``("disk", "disk limit exceeded: ...")``), else None."""


class RuntimeRun(BaseModel):
    """What running a runtime gave. ``status``: the result's status, ``timeout`` when the session
    timeout killed it, or ``error`` when it printed no valid result (crash, bad JSON, no status,
    an exit code other than 0, killed by a signal not the launcher's).
    ``duration_s`` is wall-clock seconds; the ``*_tail`` fields hold the last 4000 characters.
    ``setup_failed``: the runtime never started (command not found, sandbox setup failed): an
    infrastructure failure, not something the agent did. ``limit_exceeded``: the limit that ended
    the session (memory | processes | output | disk | files), status ``error``. ``sandbox``: ``bwrap`` or
    ``none`` (None when unknown). ``node_lost``: the Ray node running it died or left the cluster
    (``--mode ray``): an infrastructure failure. ``gateway_unreachable``: why the gateway bridge's
    last connection to the gateway failed (None when it did not). ``setup_failed``, ``node_lost``,
    ``limit_exceeded``, ``gateway_unreachable`` and a ``timeout`` status are the launcher's own
    observations; ``result`` is the runtime's words (docs/trust-model.md)."""

    status: Literal["succeeded", "failed", "truncated", "timeout", "error"]
    result: SimulationStartResult | None = None
    error_text: str | None = None
    returncode: int | None = None
    duration_s: float
    setup_failed: bool = False
    limit_exceeded: str | None = None
    sandbox: str | None = None
    node_lost: bool = False
    gateway_unreachable: str | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""


@contextlib.contextmanager
def pidfd_child_watcher() -> Iterator[None]:
    """On Python 3.11 (Linux), wait for the runtimes' exits with pid file descriptors on the
    running loop instead of the default watcher's one thread per subprocess (Python 3.12 does
    this by itself); the previous watcher is back afterwards. Elsewhere a no-op."""
    if (
        sys.version_info >= (3, 12)
        or not hasattr(os, "pidfd_open")
        or not hasattr(asyncio, "PidfdChildWatcher")
    ):
        yield
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # a kernel without pidfds (before 5.3)
        yield
        return
    old = asyncio.get_child_watcher()
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.set_child_watcher(watcher)
    try:
        yield
    finally:
        asyncio.set_child_watcher(old)
        watcher.close()


RESULT_PREFIX = "SAFACTORY_RESULT_JSON "
"""A stdout line starting so holds the result after it (Safactory's runners print it so)."""
_SCAN_CHARS = 64 * 1024
"""How much of stdout's end is searched for a result that is not on its last line."""
_SCAN_TRIES = 500
"""At most this many lines of that end are tried as the start of a JSON object."""


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


def _loads(text: str) -> object:
    """JSON, refusing the ``NaN`` / ``Infinity`` tokens Python's json reads by default and
    numbers too large for a float (``1e999``)."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite)


RESULT_MAX_BYTES = 1024 * 1024
"""A result larger than this as UTF-8 JSON is no result."""
RESULT_MAX_DEPTH = 64
"""A result nested deeper than this (objects and arrays) is no result."""
_INT_MAX = 2**63 - 1


def check_storable(obj: object) -> None:
    """Raise ValueError unless ``obj`` (a parsed result) can be kept, serialized and stored
    everywhere the launcher writes it: nested at most ``RESULT_MAX_DEPTH`` levels, integers within
    64 bits, finite numbers, at most ``RESULT_MAX_BYTES`` as JSON (a lone surrogate or NUL is
    kept, as its escape: docs/storage.md). TypeError for a value that is not JSON."""
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > RESULT_MAX_DEPTH:
                raise ValueError(f"nested deeper than {RESULT_MAX_DEPTH} levels")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
        elif (
            isinstance(value, int) and not isinstance(value, bool) and not -_INT_MAX - 1 <= value <= _INT_MAX
        ):
            raise ValueError("an integer beyond 64 bits")
    try:
        size = len(json_text(obj, allow_nan=False).encode("utf-8"))
    except ValueError:
        raise ValueError("a number that is not finite") from None
    if size > RESULT_MAX_BYTES:
        raise ValueError(f"larger than {RESULT_MAX_BYTES} bytes as JSON")


def _last_object(stdout: str) -> tuple[str, dict[str, object]] | None:
    """The last JSON object of stdout's last ``_SCAN_CHARS`` that starts a line (at its first
    column: a pretty-printed object's inner objects are indented) and has a ``status`` key, else
    the last such object without one, else None. Found from the end, ``_SCAN_TRIES`` lines at most."""
    tail = stdout[-_SCAN_CHARS:]
    decoder = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)
    starts = [0] if tail.startswith("{") else []
    at = tail.find("\n{")
    while at >= 0:
        starts.append(at + 1)
        at = tail.find("\n{", at + 1)
    fallback: tuple[str, dict[str, object]] | None = None
    for start in reversed(starts[-_SCAN_TRIES:]):
        try:
            value, end = decoder.raw_decode(tail, start)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            if "status" in value:
                return tail[start:end], value
            fallback = fallback or (tail[start:end], value)
    return fallback


def parse_result(stdout: str) -> SimulationStartResult:
    """The runtime's result in its stdout, as a SimulationStartResult. Lines end at ``\n`` only:
    JSON may hold U+2028, U+2029 or U+0085 unescaped (pydantic's ``model_dump_json`` does), which
    ``str.splitlines`` would take for line ends. Where the result is:

    - the last line starting with ``SAFACTORY_RESULT_JSON `` (``RESULT_PREFIX``): the JSON after it;
    - else the last JSON object of stdout that has a ``status`` key, on one line or over several
      (pretty-printed, starting at a line's first column), lines after it being log; else the
      last one (its missing ``status`` is then the error);
    - nothing else: a line that is not JSON is never a result.

    Raises ValueError when there is no such object, its JSON holds ``NaN`` or ``Infinity``, it
    cannot be kept (``check_storable``: too deep, too large, a huge integer), or
    it lacks a valid ``status`` (such output is a failed session, never a success)."""
    lines = [ln for ln in stdout.split("\n") if ln.strip()]
    if not lines:
        raise ValueError("runtime printed nothing on stdout")
    prefixed = [ln for ln in lines if ln.lstrip().startswith(RESULT_PREFIX)]
    if prefixed:
        text = prefixed[-1].lstrip()[len(RESULT_PREFIX) :].strip()
        where = f"the last {RESULT_PREFIX.strip()} line"
        try:
            obj = _loads(text)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"{where} is not JSON ({e}): {text[:200]!r}") from None
    else:
        last = lines[-1].strip()
        try:
            single = _loads(last) if last.startswith("{") else None
        except (ValueError, RecursionError):
            single = None
        found = (
            (last, single)
            if isinstance(single, dict) and "status" in single
            else (_last_object(stdout) or ((last, single) if isinstance(single, dict) else None))
        )
        if found is None:
            try:
                _loads(last)
                why = "is not a JSON object"
            except (ValueError, RecursionError) as e:
                why = f"is not JSON ({e})" if "number" in str(e) else "is not JSON"
            raise ValueError(f"last stdout line {why}: {last[:200]!r}")
        text, obj = found
        where = "the result object"
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is not a JSON object: {text[:200]!r}")
    try:
        check_storable(obj)
    except ValueError as e:
        raise ValueError(f"{where} cannot be kept: {e}") from None
    try:
        return SimulationStartResult.model_validate(obj)
    except ValidationError as e:
        raise ValueError(
            f"{where} is not a SimulationStartResult: {e.errors()[0]['msg']} "
            f"at {'.'.join(map(str, e.errors()[0]['loc']))}"
        ) from None


def exit_reason(returncode: int | None) -> str:
    """How a runtime process ended, in words: a signal for a negative code (a direct child) or
    128 + N (the sandbox's forwarder reports a runtime killed by signal N so)."""
    if returncode is not None and returncode < 0:
        return f"the runtime was killed by signal {-returncode} (not by the launcher)"
    if returncode is not None and 128 < returncode < 128 + 65:
        return f"the runtime exited with code {returncode} (killed by signal {returncode - 128}, not by the launcher)"
    return f"the runtime exited with code {returncode}"


@dataclass
class Started:
    """A process started elsewhere (``rollout.sandbox.netns``): ``pgid`` its process group (killed
    whole), the launcher's ends of its stdin, stdout and stderr pipes (``run_local`` takes them)
    and ``ended()``, its wait status once it ends."""

    pgid: int
    stdin: int
    stdout: int
    stderr: int
    ended: Callable[[], Awaitable[int]]


class _Adopted:
    """A ``Started`` process as ``_run`` uses one: ``pid`` (its group), ``returncode`` (None
    while it runs) and its three streams."""

    def __init__(
        self,
        started: Started,
        stdin: asyncio.StreamWriter,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
        transports: list[asyncio.BaseTransport],
    ) -> None:
        self.pid = started.pgid
        self.returncode: int | None = None
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.transports = transports

    def close(self) -> None:
        """Close the launcher's ends of the pipes (a background child may hold the others)."""
        for t in self.transports:
            t.close()


async def _adopt(
    started: Started, loop: asyncio.AbstractEventLoop
) -> tuple[_Adopted, asyncio.Event, asyncio.Task[None]]:
    """``started`` with its pipes as streams; the event is set when it ends (the task sets it)."""
    fds = [started.stdin, started.stdout, started.stderr]
    try:
        files = [os.fdopen(fds[0], "wb", buffering=0)]
        fds[0] = -1
        for i in (1, 2):
            files.append(os.fdopen(fds[i], "rb", buffering=0))
            fds[i] = -1
    except BaseException:
        for fd in fds:
            if fd >= 0:
                os.close(fd)
        raise
    transports: list[asyncio.BaseTransport] = []
    try:
        w_transport, w_protocol = await loop.connect_write_pipe(
            lambda: asyncio.streams.FlowControlMixin(loop), files[0]
        )
        transports.append(w_transport)
        stdin = asyncio.StreamWriter(w_transport, w_protocol, None, loop)
        readers = []
        for f in files[1:]:
            reader = asyncio.StreamReader(limit=2**16, loop=loop)
            r_transport, _ = await loop.connect_read_pipe(
                lambda r=reader: asyncio.StreamReaderProtocol(r, loop=loop),  # type: ignore[misc]
                f,
            )
            transports.append(r_transport)
            readers.append(reader)
    except BaseException:
        for t in transports:
            t.close()
        for f in files[len(transports) :]:
            f.close()
        raise
    proc, wake = _Adopted(started, stdin, readers[0], readers[1], transports), asyncio.Event()

    async def ended() -> None:
        try:
            proc.returncode = os.waitstatus_to_exitcode(await started.ended())
        except (OSError, ValueError):
            proc.returncode = -signal.SIGKILL
        wake.set()

    return proc, wake, asyncio.ensure_future(ended())


def _kill_group(proc: asyncio.subprocess.Process | _Adopted) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def _feed(stdin: asyncio.StreamWriter, payload: bytes) -> None:
    try:
        stdin.write(payload)
        await stdin.drain()
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the runtime did not read its request: its result will say so


async def _tail(
    stream: asyncio.StreamReader,
    keep: bytearray,
    limit: int,
    total: list[int],
    copy: BinaryIO | None = None,
    read: Callable[[], None] | None = None,
) -> None:
    """Read ``stream`` to EOF into ``keep``, keeping only its last ``limit`` bytes (and all of it
    in ``copy`` when given); adds the bytes read to ``total[0]`` and calls ``read()`` after each chunk."""
    while chunk := await stream.read(65536):
        total[0] += len(chunk)
        if copy is not None:
            copy.write(chunk)
        keep += chunk
        if len(keep) > 2 * limit:
            del keep[:-limit]
        if read is not None:
            read()


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's protocol of a ``Process``, plus ``wake``: set when the process exits (its pipes
    may stay open: a background child can hold them) and by whoever else needs ``_exited`` to
    look again."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=2**16, loop=loop)  # asyncio's default stream limit
        self.wake = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.wake.set()


async def _exited(
    proc: asyncio.subprocess.Process | _Adopted,
    wake: asyncio.Event,
    output: list[int],
    output_limit: int | None,
    monitor: Monitor | None,
) -> tuple[str, str] | None:
    """Wait until the process has exited (None), or a limit is exceeded (``(limit, reason)``),
    woken by ``wake`` (the exit, more output) and every 0.25 s for ``monitor``, or 9 times as long
    as its last check took when that is longer (at most 2 s): a workspace of many files to add up
    costs the launcher about a tenth of a core per session. (On Python 3.11,
    ``Process.wait()`` also waits until every pipe is closed, which a background child holding
    stdout can delay for ever.)"""
    next_check = time.monotonic() + _WATCH_EVERY_S
    while proc.returncode is None:
        if output_limit is not None and output[0] > output_limit:
            return "output", f"output limit exceeded: more than {output_limit} bytes of stdout + stderr"
        if monitor is not None and time.monotonic() >= next_check:
            began = time.monotonic()
            if over := await monitor():
                return over
            took = time.monotonic() - began
            next_check = began + took + min(_WATCH_MAX_S, max(_WATCH_EVERY_S, _WATCH_IDLE * took))
            continue  # the process may have exited meanwhile
        wake.clear()
        try:
            async with asyncio.timeout(
                max(0.0, next_check - time.monotonic()) if monitor is not None else None
            ):
                await wake.wait()
        except TimeoutError:
            pass
    return None


RESULT_FILE_MAX = 1024 * 1024
"""A result file over this size is not read."""


def read_result_file(path: Path) -> str:
    """The text of a runtime's result file (``SAFACTORY_RESULT_PATH``): a regular file, never
    through a link, at most ``RESULT_FILE_MAX`` bytes. Raises ValueError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"no result file ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > RESULT_FILE_MAX:
            raise ValueError("the result file is not a regular file of at most 1 MiB")
        return f.read(RESULT_FILE_MAX).decode("utf-8", "replace")


def _from_file(workspace: Path, result_file: str | None) -> SimulationStartResult | None:
    """The result in the workspace's ``result_file``, None when there is none or it is not one."""
    if result_file is None:
        return None
    try:
        return parse_result(read_result_file(workspace / result_file))
    except ValueError:
        return None


async def run_local(
    command: list[str],
    request: SimulationStartRequest,
    workspace: Path,
    timeout_s: float,
    extra_env: dict[str, str] | None = None,
    *,
    env: dict[str, str] | None = None,
    pass_fds: tuple[int, ...] = (),
    output_limit: int | None = None,
    monitor: Monitor | None = None,
    stderr_log: Path | None = None,
    result_file: str | None = None,
    started: Started | None = None,
) -> RuntimeRun:
    """Run one session's runtime in ``workspace`` with a wall-clock ``timeout_s`` (seconds).

    The session ends when the runtime process exits (not when its pipes close: a background
    child it left behind does not hold the session open); its process group is then killed.
    Only the last 8 MiB of stdout and 64 KiB of stderr are kept in memory.
    ``env`` given: the process's whole environment; else this process's (less
    :data:`WITHHELD_ENV`) plus ``extra_env``.
    ``output_limit`` (bytes of stdout + stderr) and ``monitor`` (see ``Monitor``) end the session
    as ``error`` with ``limit_exceeded`` set when exceeded. ``stderr_log``: a file that gets the
    whole of stderr (folders created; appended to). ``result_file``: a file of ``workspace`` (a
    relative path) read for the result when stdout holds none (Safactory's ``SAFACTORY_RESULT_PATH``).
    ``started``: the process was started already (``command`` is then only its description).
    Never raises for runtime failures (they are outcomes); re-raises CancelledError after killing
    the process group. Raises OSError when the command cannot be started at all.
    """
    if env is None:
        env = {
            **{k: v for k, v in os.environ.items() if k not in WITHHELD_ENV},
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        env.setdefault("OPENAI_API_KEY", "sk-rollout-local")
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        copy: BinaryIO | None = None
        if stderr_log is not None:
            stderr_log.parent.mkdir(parents=True, exist_ok=True)
            copy = stack.enter_context(stderr_log.open("ab", buffering=0))  # a live log: tail -f works
        return await _run(
            command,
            request,
            workspace,
            timeout_s,
            env,
            pass_fds,
            output_limit,
            monitor,
            copy,
            t0,
            result_file,
            started,
        )


async def _run(
    command: list[str],
    request: SimulationStartRequest,
    workspace: Path,
    timeout_s: float,
    env: dict[str, str],
    pass_fds: tuple[int, ...],
    output_limit: int | None,
    monitor: Monitor | None,
    copy: BinaryIO | None,
    t0: float,
    result_file: str | None = None,
    started: Started | None = None,
) -> RuntimeRun:
    loop = asyncio.get_running_loop()
    proc: asyncio.subprocess.Process | _Adopted
    watcher: asyncio.Task[None] | None = None
    if started is None:
        transport, protocol = await loop.subprocess_exec(
            lambda: _Protocol(loop),
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=str(workspace),
            env=env,
            start_new_session=True,
            pass_fds=pass_fds,
        )
        proc = asyncio.subprocess.Process(transport, protocol, loop)  # what create_subprocess_exec makes
        wake = protocol.wake
    else:
        proc, wake, watcher = await _adopt(started, loop)
    try:
        return await _watch(
            proc, wake, request, timeout_s, output_limit, monitor, copy, t0, workspace, result_file
        )
    finally:
        if watcher is not None:
            assert isinstance(proc, _Adopted)
            if not watcher.done():
                _kill_group(proc)
                await asyncio.wait({watcher}, timeout=_PIPE_GRACE_S)  # its end, once killed
            watcher.cancel()
            proc.close()


async def _watch(
    proc: asyncio.subprocess.Process | _Adopted,
    wake: asyncio.Event,
    request: SimulationStartRequest,
    timeout_s: float,
    output_limit: int | None,
    monitor: Monitor | None,
    copy: BinaryIO | None,
    t0: float,
    workspace: Path,
    result_file: str | None,
) -> RuntimeRun:
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out_b, err_b, total = bytearray(), bytearray(), [0]

    def read() -> None:
        if output_limit is not None and total[0] > output_limit:
            wake.set()

    tasks = [
        asyncio.create_task(_feed(proc.stdin, model_json(request).encode() + b"\n")),
        asyncio.create_task(_tail(proc.stdout, out_b, _STDOUT_KEEP, total, read=read)),
        asyncio.create_task(_tail(proc.stderr, err_b, _STDERR_KEEP, total, copy, read=read)),
    ]
    over: tuple[str, str] | None = None
    try:
        over = await asyncio.wait_for(_exited(proc, wake, total, output_limit, monitor), timeout=timeout_s)
        if over is None and monitor is not None:
            over = await monitor()  # a limit hit just before the exit
    except TimeoutError:
        _kill_group(proc)
        await _exited(proc, wake, total, None, None)
        return RuntimeRun(
            status="timeout",
            error_text=f"runtime timed out after {timeout_s:g} s (killed)",
            returncode=proc.returncode,
            duration_s=time.monotonic() - t0,
        )
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        _kill_group(proc)  # the runtime if still running, and children it left behind (pipes close)
        _, pending = await asyncio.wait(tasks, timeout=_PIPE_GRACE_S)
        for t in pending:  # a child that left the process group may still hold a pipe
            t.cancel()
    dt = time.monotonic() - t0
    out = out_b[-_STDOUT_KEEP:].decode("utf-8", "replace")
    err = err_b[-_STDERR_KEEP:].decode("utf-8", "replace")
    done = RuntimeRun(
        status="error",
        duration_s=dt,
        stdout_tail=out[-_TAIL:],
        stderr_tail=err[-_TAIL:],
        returncode=proc.returncode,
    )
    if over is not None:
        if proc.returncode is None:
            await _exited(proc, wake, total, None, None)
        return done.model_copy(
            update={"limit_exceeded": over[0], "error_text": over[1], "returncode": proc.returncode}
        )
    if proc.returncode != 0:
        why = exit_reason(proc.returncode) + ": its output is not a result"
        if err.strip():
            why += f"; stderr: {err.strip()[-500:]}"
        return done.model_copy(update={"error_text": why})
    why = ""
    result: SimulationStartResult | None
    try:
        result = parse_result(out)
    except ValueError as e:
        why = f"{e} (exit code {proc.returncode})"
        result = _from_file(workspace, result_file)
    if result is None:
        if err.strip():
            why += f"; stderr: {err.strip()[-500:]}"
        return done.model_copy(update={"error_text": why})
    if result.session_id != request.session_id:
        why = f"result is for session {result.session_id}, not {request.session_id}"
        return done.model_copy(update={"result": result, "error_text": why})
    return done.model_copy(
        update={"status": result.status, "result": result, "error_text": result.error_text}
    )
