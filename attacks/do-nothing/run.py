"""Runtime of the ``do-nothing`` attack (docs/audit.md): the baseline: leaves the workspace as it is and says it failed."""

from rollout.contract.attack_kit import finish, start

finish(start(), status="failed", error_text="the do-nothing baseline did nothing")
