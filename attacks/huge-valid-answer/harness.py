"""The ``huge-valid-answer`` attack of ``launcher.py audit``: a valid JSON answer of 160 MiB (a list of empty lists): parsing it takes gigabytes."""

from rollout.audit.battery import Attack


class HugeValidAnswer(Attack):
    name = "huge-valid-answer"
    summary = (
        "a valid 160 MiB JSON answer (a list of 56 million empty lists): parsing it takes gigabytes of memory"
    )
    source = "graders that parse the whole answer before checking its size (out of memory)"
    fix_hint = "your grader runs out of memory on a large answer: check the file's size before reading it"


HARNESS = HugeValidAnswer()
