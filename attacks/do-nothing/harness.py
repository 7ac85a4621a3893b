"""The audit's baseline: an agent that does nothing (every attack is measured against its reward)."""

from rollout.audit.battery import Attack


class DoNothing(Attack):
    name = "do-nothing"
    summary = "the baseline: leaves the workspace as it is and says it failed"
    source = "the reward of an agent that does nothing: every attack is measured against it"
    fix_hint = ""


HARNESS = DoNothing()
