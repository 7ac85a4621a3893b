"""The ``every-candidate`` attack of ``launcher.py audit``: every candidate at once: every number and quoted word of the task, 0-100, yes/no/true/false and option letters, as one answer and as a list."""

from rollout.audit.battery import Attack


class EveryCandidate(Attack):
    name = "every-candidate"
    summary = "every candidate at once: every number and quoted word of the task, 0-100, yes/no/true/false and option letters, as one answer and as a list"
    source = (
        "multiple-choice and short-answer graders that check whether the expected answer occurs in the reply"
    )
    fix_hint = (
        "your grader accepts an answer holding several candidates: parse exactly one answer and compare it"
    )


HARNESS = EveryCandidate()
