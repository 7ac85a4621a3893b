"""The ``deep-answer`` attack of ``launcher.py audit``: answers a parser chokes on: JSON nested 100,000 levels deep, NaN and Infinity, bytes that are not UTF-8."""

from rollout.audit.battery import Attack


class DeepAnswer(Attack):
    name = "deep-answer"
    summary = "JSON nested 100,000 levels deep as the answer, NaN and Infinity, bytes that are not UTF-8"
    source = "graders whose parser or comparison recurses (RecursionError) or assumes clean UTF-8"
    fix_hint = (
        "your grader raises on the agent's answer: parse it defensively (catch RecursionError, "
        "UnicodeDecodeError, ValueError) and score 0 with a reason"
    )


HARNESS = DeepAnswer()
