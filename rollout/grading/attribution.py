"""Failure attribution for grading: whose is a grading that failed (docs/trust-model.md).

A grader or verifier that raises, times out or returns no valid score on a session's final state
may have been broken by the agent (a deep answer, a huge one, a stalled checker) or may be broken
by itself. ``Controls`` grades a **control** once per case and job: the same grader, in the same
isolation, on the case's untouched starting workspace with no model call and no runtime result.
``attribute`` decides from it: a control that grades shows the grader works, so the failure was
the agent's (its committed 0 counts, valid for training); a control that fails too shows the
grader is broken (``grader_broken``: no reward, excluded, the env named).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from rollout.core.envs import Case
from rollout.grading.evaluation import Evaluation
from store import GRADING_FAILURES

ControlGrader = Callable[[Path], Awaitable[Evaluation]]
"""Grades a control: called with the untouched starting workspace (a folder the caller may not keep)."""


def control_summary(control: Evaluation) -> dict[str, object]:
    """What a session's evaluation keeps of the control it was judged by."""
    return {"status": control.status, "score": control.score, "reason": control.reason}


def attribute(failed: Evaluation, control: Evaluation) -> Evaluation:
    """The evaluation to commit for ``failed`` (its status one of ``GRADING_FAILURES``) given the
    case's ``control``: ``failed`` with score 0 when the control was ``scored`` (the agent's
    failure), else ``grader_broken`` with no score (the grader fails without the agent)."""
    what = f"{failed.status}: {failed.reason or 'no reason given'}"
    if control.status == "scored":
        why = (f"{what}; counted as the agent's 0: the same grader scored the control (the untouched "
               f"starting workspace) {control.score:g}")
        return failed.model_copy(update={"score": 0.0, "reason": why, "control": control_summary(control)})
    why = (f"grader broken: it failed on this session ({what}) and on the control, the untouched starting "
           f"workspace ({control.status}: {control.reason or 'no reason given'}); not counted")
    return Evaluation(status="grader_broken", score=None, raw_repr=failed.raw_repr, reason=why,
                      artifacts=failed.artifacts, duration_s=failed.duration_s, isolation=failed.isolation,
                      control=control_summary(control))


def needs_control(evaluation: Evaluation | None) -> bool:
    """Whether ``evaluation`` is a grading failure that a control must attribute."""
    return evaluation is not None and evaluation.status in GRADING_FAILURES


class Controls:
    """The controls of one job, graded at most once per key (env and case) and shared by the
    case's sessions; concurrent askers wait for the one grading. ``work_dir``: where the control
    workspaces are made (None: the system temp folder)."""

    def __init__(self, work_dir: Path | None = None) -> None:
        self._work_dir = work_dir
        self._done: dict[tuple[str, str], asyncio.Future[Evaluation]] = {}

    @property
    def graded(self) -> int:
        """How many controls were graded (or are being graded)."""
        return len(self._done)

    async def control(self, case: Case, grade: ControlGrader) -> Evaluation:
        """The control of ``case``: ``grade`` run once on a fresh copy of its starting files (an
        empty folder for a case without files)."""
        key = (case.env_name, case.case_id)
        fut = self._done.get(key)
        if fut is None:
            fut = self._done[key] = asyncio.ensure_future(self._grade(case, grade))
        return await asyncio.shield(fut)

    async def _grade(self, case: Case, grade: ControlGrader) -> Evaluation:
        folder = Path(tempfile.mkdtemp(prefix="rollout-control-", dir=self._work_dir))
        try:
            workspace = folder / "w"
            if case.files_dir:
                await asyncio.to_thread(shutil.copytree, case.files_dir, workspace, symlinks=True)
            else:
                workspace.mkdir()
            return await grade(workspace)
        finally:
            await asyncio.to_thread(shutil.rmtree, folder, True)
