"""Failure attribution for grading: whose is a grading that failed (docs/trust-model.md).

A grader or verifier that raises, times out or returns no valid score on a session's final state
may have been broken by the agent (a deep answer, a huge one, a stalled checker) or may be broken
by itself. ``Controls`` grades a **control** once per case and job: the same grader, in the same
isolation, on the case's untouched starting workspace with no model call and no runtime result,
and, when that fails and the case has a reference answer (an ``expected.json`` task's), on the
starting workspace holding that answer. ``attribute`` decides from it: a control that grades shows
the grader works, so the failure was the agent's (its committed 0 counts, valid for training); a
control that fails too shows the grader is broken (``grader_broken``: no reward, excluded, the env
named).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.core.envs import Case
from rollout.grading.evaluation import Evaluation
from store import GRADING_FAILURES

ControlGrader = Callable[[Path], Awaitable[Evaluation]]
"""Grades a control: called with its workspace (a folder the caller may not keep)."""
UNTOUCHED = "the untouched starting workspace"
REFERENCE = "the starting workspace with the reference answer in outputs/answer.json"
ANSWER_FILE = "outputs/answer.json"
"""Where an ``expected.json`` task's answer goes (the bundled expected.json grader's file)."""


@dataclass(frozen=True)
class Control:
    """What a case's control gave (``evaluation``) and on what it ran (``on``: ``UNTOUCHED`` or
    ``REFERENCE``)."""

    evaluation: Evaluation
    on: str = UNTOUCHED

    def summary(self) -> dict[str, Any]:
        """What a session's evaluation keeps of the control it was judged by."""
        e = self.evaluation
        return {"on": self.on, "status": e.status, "score": e.score, "reason": e.reason}


def reference_answer(case: Case) -> dict[str, Any] | None:
    """The case's reference answer: an ``expected.json`` task's object (``row["expected"]``), else None."""
    expected = case.row.get("expected")
    return expected if isinstance(expected, dict) and expected else None


def attribute(failed: Evaluation, control: Control) -> Evaluation:
    """The evaluation to commit for ``failed`` (its status one of ``GRADING_FAILURES``) given the
    case's ``control``: ``failed`` with score 0 when the control was ``scored`` (the agent's
    failure), else ``grader_broken`` with no score (the grader fails without the agent)."""
    what = f"{failed.status}: {failed.reason or 'no reason given'}"
    c = control.evaluation
    if c.status == "scored":
        why = (
            f"{what}; counted as the agent's 0: the same grader scored the control ({control.on}) {c.score:g}"
        )
        return failed.model_copy(update={"score": 0.0, "reason": why, "control": control.summary()})
    why = (
        f"grader broken: it failed on this session ({what}) and on the control, {control.on} "
        f"({c.status}: {c.reason or 'no reason given'}); not counted"
    )
    return Evaluation(
        status="grader_broken",
        score=None,
        raw_repr=failed.raw_repr,
        reason=why,
        artifacts=failed.artifacts,
        duration_s=failed.duration_s,
        isolation=failed.isolation,
        control=control.summary(),
    )


def needs_control(evaluation: Evaluation | None) -> bool:
    """Whether ``evaluation`` is a grading failure that a control must attribute."""
    return evaluation is not None and evaluation.status in GRADING_FAILURES


class Controls:
    """The controls of one job, graded at most once per key (env and case) and shared by the
    case's sessions; concurrent askers wait for the one grading. ``work_dir``: where the control
    workspaces are made (None: the system temp folder)."""

    def __init__(self, work_dir: Path | None = None) -> None:
        self._work_dir = work_dir
        self._done: dict[tuple[str, str], asyncio.Future[Control]] = {}

    @property
    def graded(self) -> int:
        """How many controls were graded (or are being graded)."""
        return len(self._done)

    async def control(self, case: Case, grade: ControlGrader) -> Control:
        """The control of ``case``: ``grade`` run once on a fresh copy of its starting files (an
        empty folder for a case without files); when that is not scored and the case has a
        ``reference_answer``, once more with it in ``ANSWER_FILE`` (the control is then the first
        that scored, else the untouched one)."""
        key = (case.env_name, case.case_id)
        fut = self._done.get(key)
        if fut is None:
            fut = self._done[key] = asyncio.ensure_future(self._grade(case, grade))
        return await asyncio.shield(fut)

    async def judge(self, evaluation: Evaluation, case: Case, grade: ControlGrader) -> Evaluation:
        """``evaluation`` as committed: unchanged unless it is a grading failure, then attributed
        (``attribute``) by the control of ``case``, graded with ``grade`` when not yet."""
        if not needs_control(evaluation):
            return evaluation
        return attribute(evaluation, await self.control(case, grade))

    async def aclose(self) -> None:
        """Cancel the controls still being graded (their askers are gone: the job stopped)."""
        pending = [f for f in self._done.values() if not f.done()]
        for f in pending:
            f.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _grade(self, case: Case, grade: ControlGrader) -> Control:
        untouched = Control(await self._graded(case, grade, None))
        answer = reference_answer(case)
        if untouched.evaluation.status == "scored" or answer is None:
            return untouched
        reference = Control(await self._graded(case, grade, answer), REFERENCE)
        return reference if reference.evaluation.status == "scored" else untouched

    async def _graded(self, case: Case, grade: ControlGrader, answer: dict[str, Any] | None) -> Evaluation:
        folder = Path(tempfile.mkdtemp(prefix="rollout-control-", dir=self._work_dir))
        try:
            workspace = folder / "w"
            if case.files_dir:
                await asyncio.to_thread(shutil.copytree, case.files_dir, workspace, symlinks=True)
            else:
                workspace.mkdir()
            if answer is not None:
                (workspace / ANSWER_FILE).parent.mkdir(parents=True, exist_ok=True)
                (workspace / ANSWER_FILE).write_text(json.dumps(answer))
            return await grade(workspace)
        finally:
            await asyncio.to_thread(shutil.rmtree, folder, True)
