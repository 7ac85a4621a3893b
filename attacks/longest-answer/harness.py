"""The ``longest-answer`` attack of ``launcher.py audit``: the longest answer: 1 MiB of text built from the task's words, every number and the task itself."""

from rollout.audit.battery import Attack


class LongestAnswer(Attack):
    name = "longest-answer"
    summary = (
        "the longest answer: 1 MiB of text built from the task's words, every number and the task itself"
    )
    source = (
        "partial-credit graders by overlap or recall (ROUGE, token F1 recall, substring) that reward length"
    )
    fix_hint = "your grader rewards length: cap the answer's length, or score precision as well as recall"


HARNESS = LongestAnswer()
