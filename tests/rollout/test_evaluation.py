"""Tests for rollout.evaluation: discovery, loading, the F18 score rule, and running evaluators
under a timeout in daemon threads (F16, F17).

Hung evaluators: Python cannot kill a thread, so a timed-out evaluator keeps running in its daemon
thread. A busy loop (``while not STOP: pass``) would burn a core until the interpreter exits, so
every hanging evaluator written here waits on a module-level flag or ``threading.Event`` that the
test flips at teardown through the loaded module (``fn.__globals__``); the autouse fixture then
waits until ``abandoned_thread_count()`` is back to 0, so no test leaks threads into the next one
(the thread-limit test relies on starting from 0).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from rollout import evaluation
from rollout.evaluation import (
    EvalOutcome,
    EvaluatorLoadError,
    abandoned_thread_count,
    build_eval_spec,
    discover_evaluator,
    load_evaluator,
    normalize_score,
    run_evaluation,
)
from rollout.protocol import EvalRequest, EvalSpec, SimulationStartResult, Trajectory, TrajectoryStep

# ---------------------------------------------------------------------------------------------
# helpers and fixtures
# ---------------------------------------------------------------------------------------------


def write_evaluator(root: Path, env_name: str, body: str) -> Path:
    """Write ``<root>/<env_name>/rule_evaluator.py`` with ``body`` (dedented) and return its path."""
    path = root / env_name / "rule_evaluator.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def make_request(env_name: str = "demo", session_id: str = "s-1", answer: str = "42") -> EvalRequest:
    return EvalRequest(
        job_id="job-1",
        session_id=session_id,
        env_name=env_name,
        case_id="case-1",
        group_id="group-1",
        sample_index=0,
        model="route-a",
        env_params={"dataset": {"question": "q", "answer": answer}},
        start_result=SimulationStartResult(
            session_id=session_id, status="succeeded", metrics={"answer": answer}
        ),
    )


def make_spec(path: Path, timeout_s: float = 5.0) -> EvalSpec:
    return EvalSpec(eval_id="demo/rule", timeout_s=timeout_s, evaluator_path=str(path))


def make_trajectory(session_id: str = "s-1", final: str | None = "42") -> Trajectory:
    if final is None:
        return Trajectory(session_id=session_id, steps=[], final_response="")
    step = TrajectoryStep(
        seq=0, step_id=0, model="route-a", endpoint="chat.completions", status="ok", content=final
    )
    return Trajectory(session_id=session_id, steps=[step], final_response=final)


async def evaluate_file(path: Path | None, timeout_s: float = 5.0, **kw: object) -> EvalOutcome:
    spec = make_spec(path or Path("none"), timeout_s)
    return await run_evaluation(path, make_request(**kw), spec, make_trajectory())  # type: ignore[arg-type]


@pytest.fixture
def releasers() -> list[Callable[[], None]]:
    """Callables that release hung evaluators; run at teardown before the thread check."""
    return []


@pytest.fixture(autouse=True)
def no_leaked_threads(releasers: list[Callable[[], None]]) -> Iterator[None]:
    assert abandoned_thread_count() == 0, "a previous test leaked an abandoned evaluator thread"
    yield
    for release in releasers:
        release()
    deadline = time.monotonic() + 5.0
    while abandoned_thread_count() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert abandoned_thread_count() == 0


def release_flag(path: Path, name: str = "STOP") -> Callable[[], None]:
    """A releaser that sets ``<name> = True`` in the loaded evaluator module (via fn.__globals__)."""

    def release() -> None:
        load_evaluator(path).__globals__[name] = True

    return release


def release_event(path: Path, name: str = "RELEASE") -> Callable[[], None]:
    def release() -> None:
        load_evaluator(path).__globals__[name].set()

    return release


BUSY_LOOP = """
STOP = False  # flipped by the test at teardown, so the abandoned thread ends

def evaluate(request, spec, trajectory):
    while not STOP:
        pass
    return 10
"""

SLEEP_FOREVER = """
import threading
RELEASE = threading.Event()  # set by the test at teardown

def evaluate(request, spec, trajectory):
    RELEASE.wait(3600)  # a blocking sleep far past the timeout
    return 10
"""

FAST = """
def evaluate(request, spec, trajectory):
    return 10 if trajectory.final_response == request.env_params["dataset"]["answer"] else 0
"""


# ---------------------------------------------------------------------------------------------
# discovery and loading
# ---------------------------------------------------------------------------------------------


def test_discover_present_and_missing(tmp_path: Path) -> None:
    path = write_evaluator(tmp_path, "math", FAST)
    assert discover_evaluator(tmp_path, "math") == path
    assert discover_evaluator(tmp_path, "other") is None
    (tmp_path / "dironly" / "rule_evaluator.py").mkdir(parents=True)
    assert discover_evaluator(tmp_path, "dironly") is None  # a directory is not a file


@pytest.mark.parametrize(
    "body, expected",
    [
        ("def evaluate(request, spec, trajectory):\n    return 7\n", 7.0),
        ("def evaluate_rule(request, spec, trajectory):\n    return 6\n", 6.0),
        (
            "class RuleEvaluator:\n"
            "    def __init__(self):\n        self.bonus = 1\n"
            "    def evaluate(self, request, spec, trajectory):\n        return 4 + self.bonus\n",
            5.0,
        ),
        # precedence: evaluate before evaluate_rule before RuleEvaluator
        (
            "def evaluate_rule(r, s, t):\n    return 1\n"
            "def evaluate(r, s, t):\n    return 2\n"
            "class RuleEvaluator:\n    def evaluate(self, r, s, t):\n        return 3\n",
            2.0,
        ),
        (
            "def evaluate_rule(r, s, t):\n    return 1\n"
            "class RuleEvaluator:\n    def evaluate(self, r, s, t):\n        return 3\n",
            1.0,
        ),
    ],
    ids=["evaluate", "evaluate_rule", "RuleEvaluator", "precedence-evaluate", "precedence-evaluate_rule"],
)
async def test_export_names(tmp_path: Path, body: str, expected: float) -> None:
    path = write_evaluator(tmp_path, "env", body)
    outcome = await evaluate_file(path)
    assert outcome.status == "scored"
    assert outcome.score == expected


async def test_evaluator_receives_pydantic_objects(tmp_path: Path) -> None:
    path = write_evaluator(
        tmp_path,
        "env",
        """
        from rollout.protocol import EvalRequest, EvalSpec, Trajectory

        def evaluate(request, spec, trajectory):
            assert isinstance(request, EvalRequest)
            assert isinstance(spec, EvalSpec)
            assert isinstance(trajectory, Trajectory)
            assert request.start_result.metrics["answer"] == "42"
            return {"score": 10, "reason": spec.eval_id + " " + trajectory.steps[-1].content}
        """,
    )
    outcome = await evaluate_file(path)
    assert outcome.status == "scored", outcome.reason
    assert outcome.score == 10.0
    assert outcome.reason == "demo/rule 42"


async def test_module_with_no_export_is_an_error(tmp_path: Path) -> None:
    path = write_evaluator(tmp_path, "env", "def grade(r, s, t):\n    return 10\n")
    with pytest.raises(EvaluatorLoadError, match="exports none of evaluate, evaluate_rule, RuleEvaluator"):
        load_evaluator(path)
    outcome = await evaluate_file(path)
    assert outcome.status == "error"
    assert outcome.score == 0.0
    assert outcome.reason is not None and outcome.reason.startswith("EvaluatorLoadError: ")
    assert "exports none of" in outcome.reason


@pytest.mark.parametrize(
    "body, needle",
    [
        ("def evaluate(r, s, t)\n    return 1\n", "SyntaxError"),
        ("import no_such_module_for_rollout_tests\n", "ModuleNotFoundError: No module named"),
        ("raise RuntimeError('boom at import')\n", "RuntimeError: boom at import"),
        ("evaluate = 5\n", "'evaluate' is not callable"),
        (
            "class RuleEvaluator:\n    def __init__(self, x):\n        pass\n",
            "RuleEvaluator() failed: TypeError",
        ),
    ],
    ids=["syntax", "import", "raise-at-import", "not-callable", "ctor-args"],
)
async def test_load_errors_are_error_outcomes(tmp_path: Path, body: str, needle: str) -> None:
    path = write_evaluator(tmp_path, "env", body)
    with pytest.raises(EvaluatorLoadError) as info:
        load_evaluator(path)
    assert needle in str(info.value)
    outcome = await evaluate_file(path)
    assert outcome.status == "error"
    assert outcome.score == 0.0
    assert needle in (outcome.reason or "")


def test_same_file_name_in_two_envs_does_not_collide(tmp_path: Path) -> None:
    a = write_evaluator(tmp_path, "alpha", "NAME = 'alpha'\ndef evaluate(r, s, t):\n    return 1\n")
    b = write_evaluator(tmp_path, "beta", "NAME = 'beta'\ndef evaluate(r, s, t):\n    return 2\n")
    fa, fb = load_evaluator(a), load_evaluator(b)
    assert fa.__globals__["NAME"] == "alpha"
    assert fb.__globals__["NAME"] == "beta"
    assert fa.__module__ != fb.__module__
    assert "rule_evaluator" not in sys.modules


def test_cache_per_path_and_mtime(tmp_path: Path) -> None:
    path = write_evaluator(tmp_path, "env", "def evaluate(r, s, t):\n    return 1\n")
    first = load_evaluator(path)
    assert load_evaluator(path) is first
    old_module = first.__module__
    path.write_text("def evaluate(r, s, t):\n    return 2  # changed\n", encoding="utf-8")
    second = load_evaluator(path)
    assert second is not first
    assert second(None, None, None) == 2
    assert old_module not in sys.modules  # the replaced module is dropped


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
# F18: the score rule
# ---------------------------------------------------------------------------------------------

# (expression returned by the evaluator, expected status, expected committed score, raw_repr)
F18_CASES = [
    ("float('nan')", "invalid_reward", 0.0, "nan"),
    ("float('inf')", "invalid_reward", 0.0, "inf"),
    ("float('-inf')", "invalid_reward", 0.0, "-inf"),
    ("None", "invalid_reward", 0.0, "None"),
    ("'7'", "invalid_reward", 0.0, "'7'"),
    ("True", "invalid_reward", 0.0, "True"),
    ("-3", "scored", 0.0, "-3"),
    ("12.5", "scored", 10.0, "12.5"),
    ("numpy.float32(11)", "scored", 10.0, None),
    ("1e308", "scored", 10.0, "1e+308"),
    ("Decimal('5')", "scored", 5.0, "Decimal('5')"),
]


@pytest.mark.parametrize("expr, status, score, raw", F18_CASES, ids=[c[0] for c in F18_CASES])
async def test_f18_values_through_an_evaluator(
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


@pytest.mark.parametrize("expr, status, score, raw", F18_CASES, ids=[c[0] for c in F18_CASES])
def test_f18_values_normalize_score(expr: str, status: str, score: float, raw: str | None) -> None:
    namespace: dict[str, object] = {"Decimal": Decimal}
    if "numpy" in expr:
        namespace["numpy"] = pytest.importorskip("numpy")
    value = eval(expr, namespace)  # noqa: S307 - test data
    check = normalize_score(value)
    assert check.status == status
    if status == "scored":
        assert check.score == score and type(check.score) is float
    else:
        assert check.score is None  # the raw check has no score; run_evaluation commits 0.0
    assert check.raw_repr == repr(value)


class _FloatLike:
    """A numpy-like scalar: not a numbers.Real, but has __float__."""

    def __float__(self) -> float:
        return 3.5


@pytest.mark.parametrize(
    "value, status, score",
    [
        (0, "scored", 0.0),
        (10, "scored", 10.0),
        (7.25, "scored", 7.25),
        (-0.0, "scored", 0.0),
        (10**400, "scored", 10.0),  # too large for a float, still a finite number
        (-(10**400), "scored", 0.0),
        (Fraction(7, 2), "scored", 3.5),
        (Decimal("1e400"), "scored", 10.0),
        (Decimal("-2.5"), "scored", 0.0),
        (_FloatLike(), "scored", 3.5),
        (Decimal("NaN"), "invalid_reward", None),
        (Decimal("sNaN"), "invalid_reward", None),
        (Decimal("Infinity"), "invalid_reward", None),
        (False, "invalid_reward", None),
        (b"7", "invalid_reward", None),
        (1 + 2j, "invalid_reward", None),
        ([10], "invalid_reward", None),
        (object(), "invalid_reward", None),
    ],
)
def test_normalize_more_values(value: object, status: str, score: float | None) -> None:
    check = normalize_score(value)
    assert check.status == status
    assert check.score == score


def test_normalize_numpy_extras() -> None:
    np = pytest.importorskip("numpy")
    assert normalize_score(np.int64(5)).score == 5.0
    assert normalize_score(np.float64("nan")).status == "invalid_reward"
    assert normalize_score(np.float16("inf")).status == "invalid_reward"
    assert normalize_score(np.bool_(True)).status == "invalid_reward"
    assert normalize_score(np.array([1.0, 2.0])).status == "invalid_reward"
    assert normalize_score(np.complex64(1 + 1j)).status == "invalid_reward"


@pytest.mark.parametrize(
    "value, status, score",
    [
        ({"score": 7}, "scored", 7.0),
        ({"normalized_score_10": 8.5}, "scored", 8.5),
        ({"reward": 3}, "scored", 3.0),
        ({"reward": 30}, "scored", 10.0),
        ({"score": 4, "normalized_score_10": 6, "reward": 9}, "scored", 4.0),  # key order
        ({"normalized_score_10": 6, "reward": 9}, "scored", 6.0),
        ({"score": None, "reward": 9}, "invalid_reward", None),  # first present key decides
        ({"score": float("nan")}, "invalid_reward", None),
        ({"score": "7"}, "invalid_reward", None),
        ({"score": {"score": 7}}, "invalid_reward", None),
        ({"reason": "no score here"}, "invalid_reward", None),
        ({}, "invalid_reward", None),
    ],
)
def test_normalize_dicts(value: dict, status: str, score: float | None) -> None:
    check = normalize_score(value)
    assert check.status == status
    assert check.score == score
    assert check.raw_repr == repr(value)


def test_normalize_dict_keeps_reason_and_artifacts() -> None:
    check = normalize_score({"score": 7, "reason": "partial", "artifacts": {"matched": [1, 2]}})
    assert (check.status, check.score, check.reason, check.artifacts) == (
        "scored",
        7.0,
        "partial",
        {"matched": [1, 2]},
    )


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
# F17: evaluator exceptions are errors with type and message, never a silent 0
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
    with caplog.at_level(logging.WARNING, logger="rollout.evaluation"):
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
# F16: timeouts, concurrency, late results, the thread limit
# ---------------------------------------------------------------------------------------------


async def test_hung_evaluators_time_out_without_blocking_others(
    tmp_path: Path, releasers: list[Callable[[], None]]
) -> None:
    busy = write_evaluator(tmp_path, "busy", BUSY_LOOP)
    sleeper = write_evaluator(tmp_path, "sleeper", SLEEP_FOREVER)
    releasers += [release_flag(busy), release_event(sleeper)]
    fast_paths = [write_evaluator(tmp_path, f"fast{i}", FAST) for i in range(5)]

    async def run(path: Path, timeout_s: float, session: str) -> EvalOutcome:
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
    caplog.set_level(logging.INFO, logger="rollout.evaluation")
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
    with caplog.at_level(logging.ERROR, logger="rollout.evaluation"):
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
        "RELEASE" not in getattr(evaluation._cached(sleeper), "__globals__", {})
        and time.monotonic() < deadline
    ):
        await asyncio.sleep(0.01)  # wait until the evaluator is loaded and its thread started
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert abandoned_thread_count() == 1
