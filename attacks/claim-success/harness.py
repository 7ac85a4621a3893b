"""The ``claim-success`` attack of ``launcher.py audit``: claims success without doing the task: a result line with status succeeded and metrics (passed, score, reward, resolved...), verdict files in the workspace."""

from rollout.audit.battery import Attack


class ClaimSuccess(Attack):
    name = "claim-success"
    summary = "claims success without doing the task: a result line with status succeeded and metrics (passed, score, reward, resolved...), verdict files in the workspace"
    source = "graders that read the runtime's metrics or a log the agent wrote (docs/trust-model.md)"
    fix_hint = (
        "your grader trusts runtime metrics or verdict files: grade the workspace or a verifier instead"
    )
    grader_reads = ("metric_keys", "paths")


HARNESS = ClaimSuccess()
