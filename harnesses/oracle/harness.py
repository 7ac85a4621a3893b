"""The ``oracle`` harness: runs the task's reference solution (a Harbor task's ``solution/solve.sh``)
in the workspace instead of an agent, so a task author can check that the task scores 10 before
any model runs (Harbor's oracle agent). Calls no model. Nothing to install."""

from __future__ import annotations

from rollout.harness import Harness, HarnessContext, HarnessLaunch


class Oracle(Harness):
    """``bash <solution>/solve.sh`` in the workspace. The solution folder is bound read-only into
    this harness's sandbox only (``uses_solution``), at ``/solution`` as Harbor's oracle has it; a
    task without one fails with a message."""

    name = "oracle"
    protocol = "chat_completions"
    version = "1"
    uses_solution = True
    calls_model = False

    def launch(self, ctx: HarnessContext) -> HarnessLaunch:
        if ctx.solution_dir is None:
            return HarnessLaunch(
                argv=["sh", "-c", "echo 'oracle: this task has no solution/solve.sh' >&2; exit 1"],
                answer_path=None,
            )
        return HarnessLaunch(argv=["bash", f"{ctx.solution_dir}/solve.sh"], answer_path=None)


HARNESS = Oracle()
