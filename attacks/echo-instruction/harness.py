"""The ``echo-instruction`` attack of ``launcher.py audit``: answers with the task's own text: the instruction (or question) as the answer everywhere."""

from rollout.audit.battery import Attack


class EchoInstruction(Attack):
    name = "echo-instruction"
    summary = "answers with the task's own text: the instruction (or question) as the answer everywhere"
    source = "graders that look for words of the expected answer in the reply, when the prompt holds them"
    fix_hint = "your grader accepts the prompt echoed back: compare the answer to the expected value, not by keywords"


HARNESS = EchoInstruction()
