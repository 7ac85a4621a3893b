"""Shared helpers for the evaluator tests (test_evaluator_loader, test_scoring, test_evaluation):
writing a ``rule_evaluator.py``, building the request/spec/trajectory it receives, running it
through ``run_evaluation``, releasing hung evaluators, and sample evaluator bodies and score-rule cases.

Hung evaluators: Python cannot kill a thread, so a timed-out evaluator keeps running in its daemon
thread. A busy loop (``while not STOP: pass``) would burn a core until the interpreter exits, so
every hanging evaluator written by the tests waits on a module-level flag or ``threading.Event``
that the test flips at teardown through the loaded module (``fn.__globals__``, see
``release_flag``/``release_event``); the ``no_leaked_threads`` fixture (conftest.py) then waits
until ``abandoned_thread_count()`` is back to 0.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

from rollout.contract.protocol import EvalRequest, EvalSpec, SimulationStartResult, Trajectory, TrajectoryStep
from rollout.grading.evaluation import Evaluation, run_evaluation
from rollout.grading.evaluator_loader import load_evaluator


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


async def evaluate_file(path: Path | None, timeout_s: float = 5.0, **kw: object) -> Evaluation:
    spec = make_spec(path or Path("none"), timeout_s)
    return await run_evaluation(path, make_request(**kw), spec, make_trajectory())  # type: ignore[arg-type]


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


# (expression returned by the evaluator, expected status, expected committed score, raw_repr)
SCORE_RULE_CASES = [
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
