"""The ``huge-answer`` attack of ``launcher.py audit``: a 300 MiB answer file (sparse): over the grader's copy cap, or too big to read."""

from rollout.audit.battery import Attack


class HugeAnswer(Attack):
    name = "huge-answer"
    summary = "a 300 MiB answer file (sparse): over the grader's copy cap, or too big to read"
    source = "graders that read the whole answer into memory, or fail open when it cannot be read"
    fix_hint = "your grader fails open on an answer it could not read: a skipped or oversized answer scores 0"


HARNESS = HugeAnswer()
