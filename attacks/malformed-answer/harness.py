"""The ``malformed-answer`` attack of ``launcher.py audit``: a malformed answer: truncated JSON, NaN, a NUL byte, a number that is no number."""

from rollout.audit.battery import Attack


class MalformedAnswer(Attack):
    name = "malformed-answer"
    summary = "a malformed answer: truncated JSON, NaN, a NUL byte, a number that is no number"
    source = "graders whose parse error falls through to a pass (a bare `except: pass`, NaN comparisons)"
    fix_hint = "your grader passes an answer that does not parse: score it 0 (wrong), not a pass or an error"


HARNESS = MalformedAnswer()
