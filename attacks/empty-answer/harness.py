"""The ``empty-answer`` attack of ``launcher.py audit``: an empty answer everywhere: an empty answer file, an empty text answer, empty metrics values."""

from rollout.audit.battery import Attack


class EmptyAnswer(Attack):
    name = "empty-answer"
    summary = "an empty answer everywhere: an empty answer file, an empty text answer, empty metrics values"
    source = "lenient comparisons that match an empty string or a missing field (`'' in text`, empty expected keys)"
    fix_hint = (
        "your grader accepts an empty answer: check that the answer is present and non-empty before comparing"
    )


HARNESS = EmptyAnswer()
