"""Tests for rollout.grading.evaluation: running evaluators under a timeout in daemon threads,
evaluator exceptions as errors, the score rule as committed outcomes, async evaluators, and
``build_eval_spec``.

Hung evaluators are released at teardown (see ``evaluator_helpers``); the ``no_leaked_threads``
fixture (conftest.py) then waits until ``abandoned_thread_count()`` is back to 0, so no test leaks
threads into the next one (the thread-limit test relies on starting from 0).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rollout.contract.protocol import Trajectory
from rollout.grading import evaluation, evaluator_loader
from rollout.grading.evaluation import Evaluation, abandoned_thread_count, build_eval_spec, run_evaluation
from tests.rollout.evaluator_helpers import (
    BUSY_LOOP,
    FAST,
    SCORE_RULE_CASES,
    SLEEP_FOREVER,
    evaluate_file,
    make_request,
    make_spec,
    make_trajectory,
    release_event,
    release_flag,
    write_evaluator,
)

pytestmark = pytest.mark.usefixtures("no_leaked_threads")


# ---------------------------------------------------------------------------------------------
# running, skipping, the spec
# ---------------------------------------------------------------------------------------------


async def test_evaluator_receives_records_read_as_attributes_and_as_mappings(tmp_path: Path) -> None:
    path = write_evaluator(
        tmp_path,
        "env",
        """
        def evaluate(request, spec, trajectory):
            assert request.start_result.metrics["answer"] == "42"
            assert request["start_result"]["metrics"] == request.start_result.model_dump()["metrics"]
            assert trajectory.steps[-1]["content"] == trajectory.steps[-1].content
            assert isinstance(spec.model_dump_json(), str)
            return {"score": 10, "reason": spec.eval_id + " " + trajectory.steps[-1].content}
        """,
    )
    outcome = await evaluate_file(path)
    assert outcome.status == "scored", outcome.reason
    assert outcome.score == 10.0
    assert outcome.reason == "demo/rule 42"


async def test_missing_path_is_skipped() -> None:
    outcome = await evaluate_file(None)
    assert outcome.status == "skipped"
    assert outcome.score is None


def test_build_eval_spec(tmp_path: Path) -> None:
    spec = build_eval_spec("math", tmp_path / "math" / "rule_evaluator.py")
    assert spec.eval_id == "math/rule"
    assert spec.timeout_s == 60.0
    assert Path(spec.evaluator_path).is_absolute()


# ---------------------------------------------------------------------------------------------
# the score rule, as committed outcomes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("expr, status, score, raw", SCORE_RULE_CASES, ids=[c[0] for c in SCORE_RULE_CASES])
async def test_score_rule_values_through_an_evaluator(
    tmp_path: Path, expr: str, status: str, score: float, raw: str | None
) -> None:
    if "numpy" in expr:
        pytest.importorskip("numpy")
    path = write_evaluator(
        tmp_path,
        "env",
        f"""
        import numpy  # noqa: F401  (only some cases use it)
        from decimal import Decimal

        def evaluate(request, spec, trajectory):
            return {expr}
        """
        if "numpy" in expr
        else f"""
        from decimal import Decimal

        def evaluate(request, spec, trajectory):
            return {expr}
        """,
    )
    outcome = await evaluate_file(path)
    assert outcome.status == status
    assert outcome.score == score
    assert type(outcome.score) is float
    if raw is not None:
        assert outcome.raw_repr == raw
    if status == "invalid_reward":
        assert outcome.reason


async def test_dict_result_through_evaluator(tmp_path: Path) -> None:
    path = write_evaluator(
        tmp_path,
        "env",
        """
        def evaluate(request, spec, trajectory):
            return {"reward": 12, "reason": "over the top", "artifacts": {"k": 1}}
        """,
    )
    outcome = await evaluate_file(path)
    assert (outcome.status, outcome.score, outcome.reason, outcome.artifacts) == (
        "scored",
        10.0,
        "over the top",
        {"k": 1},
    )
    missing = write_evaluator(tmp_path, "env2", "def evaluate(r, s, t):\n    return {'points': 9}\n")
    outcome = await evaluate_file(missing)
    assert outcome.status == "invalid_reward"
    assert outcome.score == 0.0
    assert outcome.raw_repr == "{'points': 9}"


# ---------------------------------------------------------------------------------------------
# evaluator exceptions are errors with type and message, never a silent 0
# ---------------------------------------------------------------------------------------------


async def test_signal_alarm_off_main_thread_is_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_evaluator(
        tmp_path,
        "env",
        """
        import signal

        def evaluate(request, spec, trajectory):
            signal.signal(signal.SIGALRM, lambda *a: None)  # raises off the main thread
            signal.alarm(5)
            return 10
        """,
    )
    with caplog.at_level(logging.WARNING, logger="rollout.grading.evaluation"):
        outcome = await evaluate_file(path)
    assert outcome.status == "error"
    assert outcome.score == 0.0
    assert outcome.reason is not None and outcome.reason.startswith("ValueError: ")
    assert "main thread" in outcome.reason
    assert any(r.levelno == logging.WARNING and "error" in r.getMessage() for r in caplog.records)


async def test_key_error_in_rule(tmp_path: Path) -> None:
    path = write_evaluator(tmp_path, "env", "def evaluate(r, s, t):\n    raise KeyError('expected_answer')\n")
    outcome = await evaluate_file(path)
    assert (outcome.status, outcome.score, outcome.reason) == ("error", 0.0, "KeyError: 'expected_answer'")


async def test_index_error_on_empty_trajectory(tmp_path: Path) -> None:
    path = write_evaluator(
        tmp_path, "env", "def evaluate(r, s, trajectory):\n    return len(trajectory.steps[-1].content)\n"
    )
    empty = Trajectory(session_id="s-1", steps=[], final_response="")
    outcome = await run_evaluation(path, make_request(), make_spec(path), empty)
    assert outcome.status == "error"
    assert outcome.score == 0.0
    assert outcome.reason == "IndexError: list index out of range"


async def test_timeout_error_raised_inside_rule_is_an_error_not_a_timeout(tmp_path: Path) -> None:
    path = write_evaluator(
        tmp_path, "env", "def evaluate(r, s, t):\n    raise TimeoutError('sympy gave up')\n"
    )
    outcome = await evaluate_file(path)
    assert (outcome.status, outcome.reason) == ("error", "TimeoutError: sympy gave up")


async def test_sys_exit_in_rule_is_an_error(tmp_path: Path) -> None:
    path = write_evaluator(tmp_path, "env", "import sys\ndef evaluate(r, s, t):\n    sys.exit(3)\n")
    outcome = await evaluate_file(path)
    assert (outcome.status, outcome.reason) == ("error", "SystemExit: 3")


# ---------------------------------------------------------------------------------------------
# timeouts, concurrency, late results, the thread limit
# ---------------------------------------------------------------------------------------------


async def test_hung_evaluators_time_out_without_blocking_others(
    tmp_path: Path, releasers: list[Callable[[], None]]
) -> None:
    busy = write_evaluator(tmp_path, "busy", BUSY_LOOP)
    sleeper = write_evaluator(tmp_path, "sleeper", SLEEP_FOREVER)
    releasers += [release_flag(busy), release_event(sleeper)]
    fast_paths = [write_evaluator(tmp_path, f"fast{i}", FAST) for i in range(5)]

    async def run(path: Path, timeout_s: float, session: str) -> Evaluation:
        return await run_evaluation(
            path, make_request(session_id=session), make_spec(path, timeout_s), make_trajectory(session)
        )

    started = time.monotonic()
    outcomes = await asyncio.gather(
        run(busy, 0.3, "busy"),
        run(sleeper, 0.3, "sleeper"),
        *(run(p, 5.0, f"fast{i}") for i, p in enumerate(fast_paths)),
    )
    elapsed = time.monotonic() - started
    assert elapsed < 2.0

    for hung in outcomes[:2]:
        assert hung.status == "timeout"
        assert hung.score == 0.0
        assert hung.reason == "evaluator timed out after 0.3 s"
        assert 0.25 <= hung.duration_s < 2.0
    for fast in outcomes[2:]:
        assert fast.status == "scored"
        assert fast.score == 10.0
    assert abandoned_thread_count() == 2


async def test_late_result_is_discarded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    marker = tmp_path / "returned.txt"
    path = write_evaluator(
        tmp_path,
        "env",
        f"""
        import time
        from pathlib import Path

        def evaluate(request, spec, trajectory):
            time.sleep(0.85)  # 70 % past a 0.5 s timeout
            Path({str(marker)!r}).write_text("returned")
            return 10
        """,
    )
    caplog.set_level(logging.INFO, logger="rollout.grading.evaluation")
    outcome = await evaluate_file(path, timeout_s=0.5)
    assert (outcome.status, outcome.score) == ("timeout", 0.0)
    assert outcome.reason == "evaluator timed out after 0.5 s"
    assert abandoned_thread_count() == 1
    snapshot = outcome.model_dump()

    deadline = time.monotonic() + 3.0
    while (not marker.exists() or abandoned_thread_count()) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)  # let any callback the thread might have scheduled run
    assert marker.exists(), "the slow evaluator should have returned by now"
    assert abandoned_thread_count() == 0
    assert outcome.model_dump() == snapshot  # nothing overwrote the committed timeout
    assert any("late result discarded" in r.getMessage() for r in caplog.records)


async def test_thread_limit_fails_fast(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    releasers: list[Callable[[], None]],
) -> None:
    monkeypatch.setattr(evaluation, "ABANDONED_THREAD_LIMIT", 2)
    sleeper = write_evaluator(tmp_path, "sleeper", SLEEP_FOREVER)
    releasers.append(release_event(sleeper))
    fast = write_evaluator(tmp_path, "fast", FAST)

    hung = await asyncio.gather(
        *(evaluate_file(sleeper, timeout_s=0.2, session_id=f"h{i}") for i in range(2))
    )
    assert [o.status for o in hung] == ["timeout", "timeout"]
    assert abandoned_thread_count() == 2

    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="rollout.grading.evaluation"):
        refused = await evaluate_file(fast, timeout_s=5.0)
    assert time.monotonic() - started < 0.2
    assert refused.status == "error"
    assert refused.score == 0.0
    assert refused.reason == (
        "evaluator thread limit reached: 2 evaluator threads still running after their timeout"
    )
    assert any(r.levelno == logging.ERROR and "thread limit" in r.getMessage() for r in caplog.records)

    release_event(sleeper)()
    deadline = time.monotonic() + 3.0
    while abandoned_thread_count() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert abandoned_thread_count() == 0
    again = await evaluate_file(fast, timeout_s=5.0)
    assert again.status == "scored"


async def test_load_that_hangs_times_out(tmp_path: Path, releasers: list[Callable[[], None]]) -> None:
    # module-level code that blocks: the load itself runs in a daemon thread under the deadline
    path = write_evaluator(
        tmp_path,
        "env",
        """
        import threading
        RELEASE = threading.Event()
        RELEASE.wait(3600)  # blocks the import

        def evaluate(r, s, t):
            return 1
        """,
    )

    def release() -> None:
        # the module being imported is registered (under its unique name) before it runs
        for module in list(sys.modules.values()):
            if getattr(module, "__file__", None) == str(path.resolve()):
                module.RELEASE.set()

    releasers.append(release)
    started = time.monotonic()
    outcome = await evaluate_file(path, timeout_s=0.3)
    assert (outcome.status, outcome.reason) == ("timeout", "evaluator timed out after 0.3 s")
    assert time.monotonic() - started < 2.0


async def test_invalid_timeout_is_an_error(tmp_path: Path) -> None:
    path = write_evaluator(tmp_path, "env", FAST)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        outcome = await evaluate_file(path, timeout_s=bad)
        assert outcome.status == "error"
        assert outcome.score == 0.0


# ---------------------------------------------------------------------------------------------
# async evaluators
# ---------------------------------------------------------------------------------------------


async def test_async_evaluator(tmp_path: Path) -> None:
    path = write_evaluator(
        tmp_path,
        "env",
        """
        import asyncio
        import threading

        async def evaluate(request, spec, trajectory):
            await asyncio.sleep(0.01)
            return {"score": 8, "reason": threading.current_thread().name}
        """,
    )
    outcome = await evaluate_file(path)
    assert (outcome.status, outcome.score) == ("scored", 8.0)
    assert outcome.reason == "MainThread"  # ran on the loop, not in a worker thread


async def test_async_rule_evaluator_class_and_awaitable_return(tmp_path: Path) -> None:
    cls = write_evaluator(
        tmp_path,
        "cls",
        """
        class RuleEvaluator:
            async def evaluate(self, request, spec, trajectory):
                return 9
        """,
    )
    assert (await evaluate_file(cls)).score == 9.0
    returns_coro = write_evaluator(
        tmp_path,
        "coro",
        """
        import asyncio

        async def _grade():
            await asyncio.sleep(0)
            return 4

        def evaluate(request, spec, trajectory):
            return _grade()  # a sync function returning an awaitable
        """,
    )
    outcome = await evaluate_file(returns_coro)
    assert (outcome.status, outcome.score) == ("scored", 4.0)


async def test_async_evaluator_timeout_and_error(tmp_path: Path) -> None:
    slow = write_evaluator(
        tmp_path,
        "slow",
        "import asyncio\nasync def evaluate(r, s, t):\n    await asyncio.sleep(30)\n    return 10\n",
    )
    started = time.monotonic()
    outcome = await evaluate_file(slow, timeout_s=0.2)
    assert (outcome.status, outcome.score, outcome.reason) == (
        "timeout",
        0.0,
        "evaluator timed out after 0.2 s",
    )
    assert time.monotonic() - started < 1.0

    stubborn = write_evaluator(
        tmp_path,
        "stubborn",
        """
        import asyncio

        async def evaluate(r, s, t):
            for _ in range(2):
                try:
                    await asyncio.sleep(0.3)
                except asyncio.CancelledError:
                    pass  # swallows cancellation: must not block the caller
            return 10
        """,
    )
    started = time.monotonic()
    outcome = await evaluate_file(stubborn, timeout_s=0.2)
    assert outcome.status == "timeout"
    assert time.monotonic() - started < 0.5
    await asyncio.sleep(0.6)  # let the stubborn task end before the loop closes

    failing = write_evaluator(
        tmp_path, "failing", "async def evaluate(r, s, t):\n    raise ValueError('bad')\n"
    )
    outcome = await evaluate_file(failing)
    assert (outcome.status, outcome.reason) == ("error", "ValueError: bad")


async def test_cancelled_caller_abandons_the_thread(
    tmp_path: Path, releasers: list[Callable[[], None]]
) -> None:
    sleeper = write_evaluator(tmp_path, "sleeper", SLEEP_FOREVER)
    releasers.append(release_event(sleeper))
    task = asyncio.ensure_future(evaluate_file(sleeper, timeout_s=30.0))
    deadline = time.monotonic() + 2.0
    while (
        "RELEASE" not in getattr(evaluator_loader.cached_evaluator(sleeper), "__globals__", {})
        and time.monotonic() < deadline
    ):
        await asyncio.sleep(0.01)  # wait until the evaluator is loaded and its thread started
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert abandoned_thread_count() == 1
