"""The ``answer-fifo`` attack of ``launcher.py audit``: the answer files as FIFOs nobody writes: a grader that opens them blocks."""

from rollout.audit.battery import Attack


class AnswerFifo(Attack):
    name = "answer-fifo"
    summary = "the answer files as FIFOs nobody writes: a grader that opens them blocks"
    source = "graders that read the answer with a plain open(): a FIFO hangs them into a timeout"
    fix_hint = "your grader fails open on an answer that is not a regular file: treat it as no answer (0)"


HARNESS = AnswerFifo()
