"""Evaluation: discover an env's ``rule_evaluator.py``, load it, run it under a timeout, and turn
its return value into a score (DESIGN.md section 4, "Evaluator contract"; faults F16, F17, F18).

Flow for one session (``run_evaluation``):

1. ``discover_evaluator(agent_root, env_name)`` gives ``<agent_root>/<env_name>/rule_evaluator.py``
   or None; None means the env has no evaluation and the outcome is ``skipped``.
2. ``load_evaluator(path)`` imports the file under a unique module name and returns the evaluator
   callable (``evaluate``, ``evaluate_rule`` or ``RuleEvaluator().evaluate``), cached per
   (path, mtime, size).
3. A sync evaluator runs in a new daemon thread; its result is handed back to the event loop with
   ``loop.call_soon_threadsafe`` on an ``asyncio.Future`` that the caller awaits under
   ``spec.timeout_s``. An async evaluator (or a sync one that returns an awaitable) runs on the loop
   under the same deadline.
4. The return value goes through ``normalize_score`` (the F18 rule), and the outcome is committed:
   ``scored`` (clamped score), ``invalid_reward`` / ``error`` / ``timeout`` (score 0.0, with a
   reason), or ``skipped`` (score None).

Threads and timeouts (F16): a timeout stops the *wait*, not the work. Python cannot kill a thread,
so a timed-out sync evaluator keeps running in its daemon thread (it never blocks interpreter exit)
and its late result is discarded: the future it would complete is already cancelled, so nothing it
returns can overwrite the committed outcome. Such abandoned threads are counted
(``abandoned_thread_count()``); once ``ABANDONED_THREAD_LIMIT`` of them are still running, new
evaluations that need a thread fail fast with status ``error`` and an ERROR log, so hung evaluators
cannot pile up threads without bound. No ``ThreadPoolExecutor`` is used: its context-manager exit
joins hung threads.

Limits: an ``async def`` evaluator that blocks (CPU loop, ``time.sleep``) blocks the event loop, and
no timeout can interrupt it; write blocking evaluators as plain ``def``. Evaluators run off the main
thread, so ``signal.signal``/``signal.alarm`` raise ``ValueError`` there (F17); it is reported as an
``error`` outcome with the exception type and message, never as a score of 0 that looks real.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import inspect
import itertools
import logging
import math
import numbers
import sys
import threading
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel

from rollout.protocol import EvalRequest, EvalSpec, Trajectory

logger = logging.getLogger(__name__)

EVALUATOR_FILE_NAME = "rule_evaluator.py"
"""The file an env drops into ``<agent_root>/<env_name>/`` to be evaluated."""

EXPORT_NAMES: tuple[str, ...] = ("evaluate", "evaluate_rule", "RuleEvaluator")
"""Names looked up in an evaluator module, in this order."""

DEFAULT_EVAL_TIMEOUT_S = 60.0
"""Default per-session evaluator timeout, in seconds (put into ``EvalSpec.timeout_s``)."""

SCORE_MIN = 0.0
SCORE_MAX = 10.0
SCORE_KEYS: tuple[str, ...] = ("score", "normalized_score_10", "reward")
"""Keys read from a dict result, in this order; the first one present is the raw score."""

ABANDONED_THREAD_LIMIT = 32
"""How many timed-out evaluator threads may still be running before new threaded evaluations fail
fast. Read at call time, so tests may monkeypatch it."""

RAW_REPR_MAX_CHARS = 1000
"""``raw_repr`` and ``reason`` are cut to this many characters (an evaluator may return a huge
string)."""

EvalStatus = Literal["scored", "invalid_reward", "error", "timeout", "skipped"]


class EvaluatorLoadError(Exception):
    """The evaluator file could not be imported, or exports none of ``EXPORT_NAMES`` as a
    callable (or ``RuleEvaluator()`` failed). The message names the file and, for import
    failures, the original exception as ``ExcType: message``."""


class ScoreCheck(BaseModel):
    """Result of ``normalize_score`` on one evaluator return value.

    - ``status``: ``scored`` (``score`` is a float in 0..10) or ``invalid_reward`` (``score`` is
      None: the raw value was not a finite number).
    - ``raw_repr``: ``repr`` of the raw value (the whole return value, dicts included), cut to
      ``RAW_REPR_MAX_CHARS``.
    - ``reason``: for ``scored`` the evaluator's own ``reason`` from a dict result (else None); for
      ``invalid_reward`` why the value was rejected.
    - ``artifacts``: the ``artifacts`` dict of a dict result, else None.
    """

    status: Literal["scored", "invalid_reward"]
    score: float | None
    raw_repr: str
    reason: str | None = None
    artifacts: dict[str, Any] | None = None


class EvalOutcome(BaseModel):
    """What was committed for one session's evaluation.

    - ``status``: ``scored`` | ``invalid_reward`` | ``error`` | ``timeout`` | ``skipped``.
    - ``score``: the value committed as the reward, in 0..10: the clamped score when ``scored``;
      0.0 for ``invalid_reward``, ``error`` and ``timeout`` (the contract commits 0 with a reason,
      so the status, not the 0, tells a failure from a real 0); None only for ``skipped`` (the env
      has no evaluator).
    - ``raw_repr``: ``repr`` of what the evaluator returned (None when it returned nothing usable:
      error, timeout, skipped).
    - ``reason``: ``"ExcType: message"`` for errors, ``"evaluator timed out after 60.0 s"`` for
      timeouts, why a value is invalid for ``invalid_reward``, the evaluator's own reason (if any)
      when ``scored``.
    - ``artifacts``: the evaluator's ``artifacts`` dict, if it returned one.
    - ``duration_s``: wall time of the evaluation in seconds, loading included.
    """

    status: EvalStatus
    score: float | None
    raw_repr: str | None = None
    reason: str | None = None
    artifacts: dict[str, Any] | None = None
    duration_s: float = 0.0


# --------------------------------------------------------------------------------------------
# discovery and loading
# --------------------------------------------------------------------------------------------


def discover_evaluator(agent_root: Path, env_name: str) -> Path | None:
    """Return ``<agent_root>/<env_name>/rule_evaluator.py`` if it is a regular file, else None.

    None means "no evaluation for this env" (not an error). The path is returned as given (not
    resolved); ``load_evaluator`` resolves it.
    """
    candidate = Path(agent_root) / env_name / EVALUATOR_FILE_NAME
    return candidate if candidate.is_file() else None


class _CacheEntry:
    __slots__ = ("key", "fn", "module_name")

    def __init__(self, key: tuple[int, int], fn: Callable[..., Any], module_name: str) -> None:
        self.key = key
        self.fn = fn
        self.module_name = module_name


_cache: dict[Path, _CacheEntry] = {}
_cache_lock = threading.Lock()
_path_locks: dict[Path, threading.Lock] = {}
_module_counter = itertools.count(1)


def _file_key(path: Path) -> tuple[int, int]:
    st = path.stat()
    return (st.st_mtime_ns, st.st_size)


def _cached(path: Path) -> Callable[..., Any] | None:
    """The cached evaluator for ``path`` if the file is unchanged since it was loaded, else None.
    Never imports anything (cheap enough to call on the event loop)."""
    try:
        resolved = Path(path).resolve()
        key = _file_key(resolved)
    except OSError:
        return None
    with _cache_lock:
        entry = _cache.get(resolved)
    return entry.fn if entry is not None and entry.key == key else None


def _module_name_for(path: Path) -> str:
    digest = hashlib.sha1(str(path).encode("utf-8")).hexdigest()[:16]
    env_part = "".join(ch if ch.isalnum() else "_" for ch in path.parent.name)
    return f"_rollout_evaluator_{env_part}_{digest}_{next(_module_counter)}"


def _pick_callable(module: ModuleType, path: Path) -> Callable[..., Any]:
    for name in EXPORT_NAMES:
        if not hasattr(module, name):
            continue
        obj = getattr(module, name)
        if name == "RuleEvaluator":
            if not inspect.isclass(obj):
                raise EvaluatorLoadError(f"{path}: RuleEvaluator is not a class ({type(obj).__name__})")
            try:
                instance = obj()
            except Exception as exc:
                raise EvaluatorLoadError(
                    f"{path}: RuleEvaluator() failed: {type(exc).__name__}: {exc}"
                ) from exc
            method = getattr(instance, "evaluate", None)
            if not callable(method):
                raise EvaluatorLoadError(f"{path}: RuleEvaluator has no callable 'evaluate' method")
            return method
        if not callable(obj):
            raise EvaluatorLoadError(f"{path}: '{name}' is not callable ({type(obj).__name__})")
        return obj
    raise EvaluatorLoadError(
        f"{path}: exports none of {', '.join(EXPORT_NAMES)} "
        "(define evaluate(request, spec, trajectory), evaluate_rule(...), or class RuleEvaluator)"
    )


def load_evaluator(path: Path) -> Callable[..., Any]:
    """Import ``path`` and return its evaluator callable ``fn(request, spec, trajectory)``.

    Looks up, in order, ``evaluate``, ``evaluate_rule``, or class ``RuleEvaluator`` (instantiated
    once per load with no arguments; its bound ``evaluate`` is returned and shared by all the
    sessions of that env, so it must be safe to call from several threads).

    The file is imported with ``importlib`` under a unique module name
    (``_rollout_evaluator_<dir>_<sha1(path)>_<n>``), so two envs' ``rule_evaluator.py`` never
    share a module; ``sys.path`` is not touched (an evaluator cannot import sibling files as
    top-level modules). The module is registered in ``sys.modules`` under that unique name only
    (dataclasses and pickling need it); a reload replaces the old entry. Results are cached per
    (resolved path, mtime_ns, size): editing the file reloads it. Failures are not cached.
    Thread-safe: concurrent first loads of one file import it once.

    Raises:
        EvaluatorLoadError: the file is missing or fails to import (message includes the original
            ``ExcType: message``), or it exports no usable callable.
    """
    resolved = Path(path).resolve()
    with _cache_lock:
        path_lock = _path_locks.setdefault(resolved, threading.Lock())
    with path_lock:
        try:
            key = _file_key(resolved)
        except OSError as exc:
            raise EvaluatorLoadError(
                f"{resolved}: cannot read evaluator: {type(exc).__name__}: {exc}"
            ) from exc
        with _cache_lock:
            entry = _cache.get(resolved)
        if entry is not None and entry.key == key:
            return entry.fn

        module_name = _module_name_for(resolved)
        spec = importlib.util.spec_from_file_location(module_name, resolved)
        if spec is None or spec.loader is None:
            raise EvaluatorLoadError(f"{resolved}: not importable as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
            fn = _pick_callable(module, resolved)
        except EvaluatorLoadError:
            sys.modules.pop(module_name, None)
            raise
        except (Exception, SystemExit) as exc:  # SyntaxError, ImportError, sys.exit() at import, ...
            sys.modules.pop(module_name, None)
            raise EvaluatorLoadError(f"{resolved}: import failed: {type(exc).__name__}: {exc}") from exc

        with _cache_lock:
            old = _cache.get(resolved)
            _cache[resolved] = _CacheEntry(key, fn, module_name)
        if old is not None:
            sys.modules.pop(old.module_name, None)
        logger.debug("loaded evaluator %s as module %s", resolved, module_name)
        return fn


# --------------------------------------------------------------------------------------------
# score normalization (F18)
# --------------------------------------------------------------------------------------------


def _cut(text: str) -> str:
    if len(text) <= RAW_REPR_MAX_CHARS:
        return text
    return text[: RAW_REPR_MAX_CHARS - 3] + "..."


def _safe_repr(value: Any) -> str:
    try:
        return _cut(repr(value))
    except Exception as exc:  # a user object whose __repr__ raises
        return f"<{type(value).__name__} with failing repr: {type(exc).__name__}>"


def _clamp(x: float) -> float:
    # x is known finite here; never called with NaN.
    if x < SCORE_MIN:
        return SCORE_MIN
    if x > SCORE_MAX:
        return SCORE_MAX
    return float(x)


def _number_to_score(value: Any) -> tuple[float | None, str | None]:
    """(score, None) for a finite number, (None, why) otherwise. Never raises."""
    type_name = type(value).__name__
    if value is None:
        return None, "evaluator returned None"
    if isinstance(value, bool) or (getattr(getattr(value, "dtype", None), "kind", None) == "b"):
        return None, f"a boolean ({type_name}) is not a score"
    if isinstance(value, str | bytes | bytearray):
        return None, f"a {type_name} is not a score (strings are never parsed)"
    if isinstance(value, Decimal):
        if not value.is_finite():
            return None, f"Decimal {value} is not finite"
        return _clamp(float(min(max(value, Decimal(0)), Decimal(10)))), None
    if isinstance(value, int):  # exact for ints too large for a float
        return float(min(max(value, 0), 10)), None
    if isinstance(value, Fraction):
        return float(min(max(value, Fraction(0)), Fraction(10))), None
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        return None, f"a complex number ({type_name}) is not a score"
    if getattr(value, "ndim", 0) != 0:
        return None, f"an array ({type_name} with ndim={value.ndim}) is not a score"
    if isinstance(value, numbers.Real) or hasattr(type(value), "__float__"):
        try:
            x = float(value)
        except (TypeError, ValueError, OverflowError) as exc:
            return None, f"{type_name} cannot be converted to float: {type(exc).__name__}: {exc}"
        if math.isnan(x):
            return None, "NaN is not a score"
        if math.isinf(x):
            return None, f"{'+' if x > 0 else '-'}inf is not a score"
        return _clamp(x), None
    return None, f"a {type_name} is not a number"


def normalize_score(value: Any) -> ScoreCheck:
    """Apply the documented score rule (fault F18) to an evaluator's return value.

    Rule:
    - A number that is finite is cast to ``float`` and clamped to 0..10: ``int`` (exact, any size),
      ``float``, ``Fraction``, ``Decimal``, numpy scalars (via ``numbers.Real``, or any non-str,
      non-bool object with ``__float__`` and no array shape). Examples: -3 -> 0.0, 12.5 -> 10.0,
      numpy.float32(11) -> 10.0, 1e308 -> 10.0, Decimal("5") -> 5.0.
    - A dict (any ``Mapping``) uses the value of the first key present among ``score``,
      ``normalized_score_10``, ``reward`` (checked by the rule above; a nested dict is invalid) and
      keeps ``reason`` (as str) and ``artifacts`` (if it is a dict).
    - Invalid (``status="invalid_reward"``, ``score=None``): NaN, +inf, -inf, None, strings and
      bytes (even ``"7"``), booleans (Python and numpy), complex numbers, arrays, a dict with none of
      the keys, anything else.

    Clamping never sees NaN (``min(max(nan, 0), 10)`` would return NaN). ``raw_repr`` always keeps
    ``repr(value)`` (cut to ``RAW_REPR_MAX_CHARS``). Never raises.
    """
    raw_repr = _safe_repr(value)
    try:
        return _normalize(value, raw_repr)
    except Exception as exc:  # a hostile object (e.g. a Mapping whose .get raises)
        return ScoreCheck(
            status="invalid_reward",
            score=None,
            raw_repr=raw_repr,
            reason=f"cannot read the result: {type(exc).__name__}: {exc}",
        )


def _normalize(value: Any, raw_repr: str) -> ScoreCheck:
    if isinstance(value, Mapping):
        present = next((k for k in SCORE_KEYS if k in value), None)
        reason_value = value.get("reason")
        own_reason = None if reason_value is None else _cut(str(reason_value))
        artifacts_value = value.get("artifacts")
        artifacts = (
            {str(k): v for k, v in artifacts_value.items()} if isinstance(artifacts_value, Mapping) else None
        )
        if present is None:
            return ScoreCheck(
                status="invalid_reward",
                score=None,
                raw_repr=raw_repr,
                reason=f"dict result has none of the keys {', '.join(SCORE_KEYS)}",
                artifacts=artifacts,
            )
        inner = value[present]
        if isinstance(inner, Mapping):
            score, why = None, f"a nested dict under {present!r} is not a score"
        else:
            score, why = _number_to_score(inner)
        if score is None:
            return ScoreCheck(
                status="invalid_reward",
                score=None,
                raw_repr=raw_repr,
                reason=f"{present!r}: {why}",
                artifacts=artifacts,
            )
        return ScoreCheck(
            status="scored", score=score, raw_repr=raw_repr, reason=own_reason, artifacts=artifacts
        )

    score, why = _number_to_score(value)
    if score is None:
        return ScoreCheck(status="invalid_reward", score=None, raw_repr=raw_repr, reason=why)
    return ScoreCheck(status="scored", score=score, raw_repr=raw_repr)


# --------------------------------------------------------------------------------------------
# running in a daemon thread, with abandoned-thread accounting (F16)
# --------------------------------------------------------------------------------------------

_abandon_lock = threading.Lock()
_abandoned_count = 0


def abandoned_thread_count() -> int:
    """Number of evaluator threads whose caller timed out (or was cancelled) and that are still
    running. It goes down when such a thread finally returns."""
    with _abandon_lock:
        return _abandoned_count


class _DeadlineExceeded(Exception):
    """Our own timeout, told apart from a ``TimeoutError`` raised inside an evaluator."""


class _ThreadCall:
    """Bookkeeping shared between one evaluator thread and the coroutine awaiting it."""

    __slots__ = ("finished", "abandoned", "abandoned_at", "label")

    def __init__(self, label: str) -> None:
        self.finished = False
        self.abandoned = False
        self.abandoned_at = 0.0
        self.label = label

    def abandon(self) -> None:
        """Called on the loop when the wait is given up; counts the thread if still running."""
        global _abandoned_count
        with _abandon_lock:
            if not self.finished and not self.abandoned:
                self.abandoned = True
                self.abandoned_at = time.monotonic()
                _abandoned_count += 1

    def finish(self) -> bool:
        """Called in the thread when the call returns; True if the caller had already given up."""
        global _abandoned_count
        with _abandon_lock:
            self.finished = True
            if self.abandoned:
                _abandoned_count -= 1
                return True
            return False


def _thread_limit_reason() -> str | None:
    count = abandoned_thread_count()
    if count >= ABANDONED_THREAD_LIMIT:
        return f"evaluator thread limit reached: {count} evaluator threads still running after their timeout"
    return None


def _discard_value(value: Any) -> None:
    if inspect.iscoroutine(value):
        value.close()  # avoid "coroutine was never awaited" for a discarded late result


def _start_thread(
    loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], args: tuple[Any, ...], call: _ThreadCall
) -> asyncio.Future[tuple[bool, Any]]:
    """Run ``fn(*args)`` in a new daemon thread. The returned future resolves on ``loop`` to
    ``(True, value)`` or ``(False, exception)``; if the future was cancelled (timeout) when the
    result arrives, the result is discarded."""
    future: asyncio.Future[tuple[bool, Any]] = loop.create_future()

    def deliver(result: tuple[bool, Any]) -> None:  # runs on the loop
        if future.done():  # cancelled by the timeout: the late result is discarded
            if result[0]:
                _discard_value(result[1])
            return
        future.set_result(result)

    def target() -> None:
        result: tuple[bool, Any]
        try:
            result = (True, fn(*args))
        except BaseException as exc:  # relayed as an error outcome, never swallowed
            result = (False, exc)
        late = call.finish()
        if late:
            logger.info(
                "evaluator thread %s finished %.1f s after its timeout; late result discarded",
                call.label,
                time.monotonic() - call.abandoned_at,
            )
            if result[0]:
                _discard_value(result[1])
            return
        try:
            loop.call_soon_threadsafe(deliver, result)
        except RuntimeError:  # the loop is closed: nobody waits any more
            logger.info(
                "evaluator thread %s finished after its event loop closed; result discarded", call.label
            )

    thread = threading.Thread(target=target, name=f"evaluator-{call.label}", daemon=True)
    thread.start()
    return future


async def _run_sync_in_thread(
    fn: Callable[..., Any], args: tuple[Any, ...], timeout: float, label: str
) -> Any:
    """Run ``fn(*args)`` in a daemon thread and wait at most ``timeout`` seconds.

    Raises ``_DeadlineExceeded`` on timeout (the thread is abandoned and counted) and re-raises the
    function's own exception. On cancellation the thread is abandoned too."""
    loop = asyncio.get_running_loop()
    call = _ThreadCall(label)
    future = _start_thread(loop, fn, args, call)
    try:
        ok, value = await asyncio.wait_for(future, timeout=max(timeout, 0.0))
    except TimeoutError:
        call.abandon()
        future.cancel()
        raise _DeadlineExceeded from None
    except asyncio.CancelledError:
        call.abandon()
        future.cancel()
        raise
    if not ok:
        raise value
    return value


async def _await_with_timeout(awaitable: Any, timeout: float) -> Any:
    """Await ``awaitable`` on the loop for at most ``timeout`` s; on timeout cancel it without
    waiting for it to finish (a coroutine that swallows cancellation cannot block us)."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(timeout, 0.0))
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_consume_task_result)
        raise _DeadlineExceeded
    return task.result()


def _consume_task_result(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.info("async evaluator raised after its timeout: %s", type(task.exception()).__name__)


def _is_async_callable(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    # an instance whose class defines ``async def __call__``
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(vars(type(fn)).get("__call__"))


class _ThreadLimitReached(Exception):
    pass


async def run_evaluation(
    path: Path | None, request: EvalRequest, spec: EvalSpec, trajectory: Trajectory
) -> EvalOutcome:
    """Evaluate one session and return the outcome to commit. Never raises for evaluator faults
    (only ``asyncio.CancelledError`` propagates, if the caller is cancelled).

    Args:
        path: the env's ``rule_evaluator.py`` (from ``discover_evaluator``), or None for no
            evaluation (outcome ``skipped``, score None).
        request, spec, trajectory: handed to the evaluator as ``fn(request, spec, trajectory)``.
            ``spec.timeout_s`` (seconds, ``DEFAULT_EVAL_TIMEOUT_S`` by convention) bounds the whole
            evaluation, loading included; it must be finite and > 0, else the outcome is ``error``.

    Outcomes (see ``EvalOutcome``): ``scored`` with the clamped score; ``invalid_reward`` (score
    0.0, ``raw_repr`` kept) for a non-number result; ``error`` (score 0.0, reason
    ``"ExcType: message"``) for a load failure or an exception in the evaluator; ``timeout`` (score
    0.0, reason ``"evaluator timed out after <timeout_s> s"``); ``error`` with reason
    ``"evaluator thread limit reached: ..."`` when ``ABANDONED_THREAD_LIMIT`` timed-out threads are
    still running. Sync evaluators run in a new daemon thread; a result arriving after the timeout
    is discarded. Logs a WARNING for error/timeout/invalid_reward (ids and reason, never prompts).
    """
    started = time.monotonic()
    label = f"{request.env_name}/{request.session_id}"

    def done(
        status: EvalStatus,
        score: float | None,
        *,
        raw_repr: str | None = None,
        reason: str | None = None,
        artifacts: dict[str, Any] | None = None,
    ) -> EvalOutcome:
        outcome = EvalOutcome(
            status=status,
            score=score,
            raw_repr=raw_repr,
            reason=None if reason is None else _cut(reason),
            artifacts=artifacts,
            duration_s=time.monotonic() - started,
        )
        if status in ("error", "timeout", "invalid_reward"):
            logger.warning(
                "evaluation %s for session %s (env %s, case %s): %s; committed score %s",
                status,
                request.session_id,
                request.env_name,
                request.case_id,
                outcome.reason,
                score,
            )
        return outcome

    if path is None:
        return done("skipped", None)

    timeout = spec.timeout_s
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        return done("error", 0.0, reason=f"ValueError: invalid evaluator timeout_s {timeout!r}")
    deadline = started + timeout

    def remaining() -> float:
        return deadline - time.monotonic()

    def start_thread_or_refuse() -> None:
        reason = _thread_limit_reason()
        if reason is not None:
            logger.error(
                "%s; refusing to start an evaluator for session %s (env %s)",
                reason,
                request.session_id,
                request.env_name,
            )
            raise _ThreadLimitReached(reason)

    try:
        fn = _cached(path)
        if fn is None:  # first load (or the file changed): import in a thread, under the deadline
            start_thread_or_refuse()
            fn = await _run_sync_in_thread(load_evaluator, (path,), remaining(), f"{label}:load")

        if remaining() <= 0:
            raise _DeadlineExceeded
        args = (request, spec, trajectory)
        if _is_async_callable(fn):
            value = await _await_with_timeout(fn(*args), remaining())
        else:
            start_thread_or_refuse()
            value = await _run_sync_in_thread(fn, args, remaining(), label)
            if inspect.isawaitable(value):
                value = await _await_with_timeout(value, remaining())
    except _ThreadLimitReached as exc:
        return done("error", 0.0, reason=str(exc))
    except _DeadlineExceeded:
        return done("timeout", 0.0, reason=f"evaluator timed out after {float(timeout)!r} s")
    except EvaluatorLoadError as exc:
        return done("error", 0.0, reason=f"EvaluatorLoadError: {exc}")
    except asyncio.CancelledError:
        raise
    except (Exception, SystemExit) as exc:
        logger.debug("evaluator for session %s raised", request.session_id, exc_info=True)
        return done("error", 0.0, reason=f"{type(exc).__name__}: {exc}")

    check = normalize_score(value)
    if check.status == "invalid_reward":
        return done(
            "invalid_reward", 0.0, raw_repr=check.raw_repr, reason=check.reason, artifacts=check.artifacts
        )
    return done(
        "scored", check.score, raw_repr=check.raw_repr, reason=check.reason, artifacts=check.artifacts
    )


def build_eval_spec(
    env_name: str, evaluator_path: Path, timeout_s: float = DEFAULT_EVAL_TIMEOUT_S
) -> EvalSpec:
    """The ``EvalSpec`` for an env: ``eval_id="<env_name>/rule"``, the timeout in seconds and the
    evaluator's absolute path."""
    return EvalSpec(
        eval_id=f"{env_name}/rule",
        timeout_s=float(timeout_s),
        evaluator_path=str(Path(evaluator_path).resolve()),
    )
