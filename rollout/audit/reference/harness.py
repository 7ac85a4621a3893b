"""The reference run of ``launcher.py audit`` (not an attack): the case's reference solution, for
the sanity row that checks the task can be solved (docs/audit.md)."""

from rollout.audit.battery import Attack


class Reference(Attack):
    name = "audit-reference"
    summary = (
        "the case's reference solution: a Harbor task's solution/solve.sh, an expected.json task's answer"
    )
    source = "the sanity row: a task whose reference fails cannot be solved here"
    uses_solution = True


HARNESS = Reference()
