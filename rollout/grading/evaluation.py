"""Running evaluation: call an env's evaluator under a timeout and commit an outcome.

``run_evaluation(path, request, spec, trajectory)`` loads the evaluator (``rollout.grading.evaluator_loader``),
runs a sync one in a daemon thread (an async one on the loop) under ``spec.timeout_s``, applies the
score rule (``rollout.grading.scoring``) and returns the ``Evaluation`` to commit. A timeout stops the
wait, not the work: a late result is discarded, and abandoned threads are capped. The full rules
are in docs/evaluation.md.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from rollout.contract.protocol import EvalRequest, EvalSpec, Trajectory
from rollout.grading import evaluator_loader, scoring
from rollout.grading.views import Record, request_view, trajectory_view
from rollout.sandbox.runtime_local import check_storable

logger = logging.getLogger(__name__)

DEFAULT_EVAL_TIMEOUT_S = 60.0
"""Default per-session evaluator timeout, in seconds (put into ``EvalSpec.timeout_s``)."""

ABANDONED_THREAD_LIMIT = 32
"""How many timed-out evaluator threads may still be running before new threaded evaluations fail
fast. Read at call time, so tests may monkeypatch it."""

EvalStatus = Literal["scored", "invalid_reward", "error", "timeout", "skipped", "grader_broken"]


class Evaluation(BaseModel):
    """What was committed for one session's evaluation.

    - ``status``: ``scored`` | ``invalid_reward`` | ``error`` | ``timeout`` | ``skipped`` |
      ``grader_broken`` (the grader failed on the session and on the case's control too:
      ``rollout.grading.attribution``).
    - ``score``: the value committed as the reward, in 0..10: the clamped score when ``scored``;
      0.0 for ``invalid_reward``, ``error`` and ``timeout`` (the contract commits 0 with a reason:
      a grading failure the control shows the agent caused, counted as its 0); None for
      ``skipped`` (the env has no evaluator) and ``grader_broken``.
    - ``raw_repr``: ``repr`` of what the evaluator returned (None when it returned nothing usable:
      error, timeout, skipped).
    - ``reason``: ``"ExcType: message"`` for errors, ``"evaluator timed out after 60.0 s"`` for
      timeouts, why a value is invalid for ``invalid_reward``, the evaluator's own reason (if any)
      when ``scored``.
    - ``artifacts``: the evaluator's ``artifacts`` dict, if it returned one that can be kept
      (``check_storable``: it may hold the agent's bytes); else None and the reason says why.
    - ``duration_s``: wall time of the evaluation in seconds, loading included.
    - ``isolation``: where the evaluator ran: ``bwrap`` (the grader sandbox) or ``none`` (a thread
      of the launcher); None when nothing ran.
    - ``control``: the control a grading failure was judged by (status, score, reason), if any.
    - ``score_keys``: the score keys a dict result carried (``scoring.SCORE_KEYS``; more than one:
      the first won, and the grader warns once per env).
    """

    status: EvalStatus
    score: float | None
    raw_repr: str | None = None
    reason: str | None = None
    artifacts: dict[str, Any] | None = None
    duration_s: float = 0.0
    isolation: Literal["bwrap", "none"] | None = None
    control: dict[str, Any] | None = None
    score_keys: list[str] = Field(default_factory=list, exclude=True)  # for the warning only: not stored

    @model_validator(mode="after")
    def _storable(self) -> Evaluation:
        if self.artifacts is not None:
            try:
                check_storable(self.artifacts)
            except (ValueError, TypeError) as e:
                self.artifacts = None
                note = f"artifacts left out: they cannot be kept ({e})"
                self.reason = f"{self.reason}; {note}" if self.reason else note
        return self

    def detail(self) -> dict[str, Any]:
        """What the session row keeps of it in ``eval_detail``."""
        detail = {"raw_repr": self.raw_repr, "artifacts": self.artifacts, "isolation": self.isolation}
        return {**detail, "control": self.control} if self.control is not None else detail


# --------------------------------------------------------------------------------------------
# running in a daemon thread, with abandoned-thread accounting
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


IDLE_THREAD_S = 30.0
"""An evaluator thread with nothing to run exits after this many seconds."""
_idle_lock = threading.Lock()
_idle: list[_EvaluatorThread] = []


class _EvaluatorThread:
    """A daemon thread that runs evaluator calls one after the other; between calls it waits in
    ``_idle`` (so a session's grading does not pay a thread start), and exits after
    ``IDLE_THREAD_S`` without work. While it runs a call it is named ``evaluator-<label>``. A call
    abandoned at its timeout keeps its thread until it returns; only then is the thread idle again."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[str, Callable[[], None]]] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="evaluator-idle", daemon=True).start()

    def _loop(self) -> None:
        me = threading.current_thread()
        while True:
            try:
                label, job = self.jobs.get(timeout=IDLE_THREAD_S)
            except queue.Empty:
                with _idle_lock:
                    if self in _idle:
                        _idle.remove(self)
                        return
                label, job = self.jobs.get()  # taken from _idle just now: its call is on the way
            me.name = f"evaluator-{label}"
            job()
            me.name = "evaluator-idle"
            with _idle_lock:
                _idle.append(self)


def _run_in_evaluator_thread(label: str, job: Callable[[], None]) -> None:
    with _idle_lock:
        worker = _idle.pop() if _idle else None
    (worker or _EvaluatorThread()).jobs.put((label, job))


def _start_thread(
    loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], args: tuple[Any, ...], call: _ThreadCall
) -> asyncio.Future[tuple[bool, Any]]:
    """Run ``fn(*args)`` in an evaluator daemon thread (an idle one, else a new one, see
    ``_EvaluatorThread``). The returned future resolves on ``loop`` to
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

    _run_in_evaluator_thread(call.label, target)
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
) -> Evaluation:
    """Evaluate one session and return the outcome to commit. Never raises for evaluator faults
    (only ``asyncio.CancelledError`` propagates, if the caller is cancelled).

    Args:
        path: the env's ``rule_evaluator.py`` (from ``evaluator_loader.discover_evaluator``), or
            None for no evaluation (outcome ``skipped``, score None).
        request, spec, trajectory: handed to the evaluator as ``fn(request, spec, trajectory)``, as
            ``rollout.grading.views.Record`` views of their JSON form.
            ``spec.timeout_s`` (seconds, ``DEFAULT_EVAL_TIMEOUT_S`` by convention) bounds the whole
            evaluation, loading included; it must be finite and > 0, else the outcome is ``error``.

    Outcomes (see ``Evaluation``): ``scored`` with the clamped score; ``invalid_reward`` (score
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
        score_keys: tuple[str, ...] = (),
    ) -> Evaluation:
        outcome = Evaluation(
            status=status,
            score=score,
            raw_repr=raw_repr,
            reason=None if reason is None else scoring.cut_text(reason),
            artifacts=artifacts,
            score_keys=list(score_keys),
            duration_s=time.monotonic() - started,
            isolation=None if status == "skipped" else "none",
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
        fn = evaluator_loader.cached_evaluator(path)
        if fn is None:  # first load (or the file changed): import in a thread, under the deadline
            start_thread_or_refuse()
            fn = await _run_sync_in_thread(
                evaluator_loader.load_evaluator, (path,), remaining(), f"{label}:load"
            )

        if remaining() <= 0:
            raise _DeadlineExceeded
        args, kwargs = evaluator_loader.call_arguments(
            fn,
            request_view(request.model_dump(mode="json")),
            Record(spec.model_dump(mode="json")),
            trajectory_view(trajectory.model_dump(mode="json")),
        )
        if _is_async_callable(fn):
            value = await _await_with_timeout(fn(*args, **kwargs), remaining())
        else:
            start_thread_or_refuse()
            value = await _run_sync_in_thread(
                functools.partial(fn, **kwargs) if kwargs else fn, args, remaining(), label
            )
            if inspect.isawaitable(value):
                value = await _await_with_timeout(value, remaining())
    except _ThreadLimitReached as exc:
        return done("error", 0.0, reason=str(exc))
    except _DeadlineExceeded:
        return done("timeout", 0.0, reason=f"evaluator timed out after {float(timeout)!r} s")
    except evaluator_loader.EvaluatorLoadError as exc:
        return done("error", 0.0, reason=f"EvaluatorLoadError: {exc}")
    except asyncio.CancelledError:
        raise
    except (Exception, SystemExit) as exc:
        logger.debug("evaluator for session %s raised", request.session_id, exc_info=True)
        return done("error", 0.0, reason=f"{type(exc).__name__}: {exc}")

    check = scoring.normalize_score(value)
    if check.status == "invalid_reward":
        return done(
            "invalid_reward",
            0.0,
            raw_repr=check.raw_repr,
            reason=check.reason,
            artifacts=check.artifacts,
            score_keys=check.keys,
        )
    return done(
        "scored",
        check.score,
        raw_repr=check.raw_repr,
        reason=check.reason,
        artifacts=check.artifacts,
        score_keys=check.keys,
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
