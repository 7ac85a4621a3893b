"""The ``answer-as-code`` attack of ``launcher.py audit``: answers that are Python code: an expression building an object equal to anything, and ``__import__('os')`` payloads."""

from rollout.audit.battery import Attack


class AnswerAsCode(Attack):
    name = "answer-as-code"
    summary = (
        "answers with Python code: an expression whose value equals anything (__eq__ always true), "
        "__import__('os') payloads"
    )
    source = "graders that eval() the answer to compare it (code execution in the grader)"
    fix_hint = (
        "your grader evaluates the agent's answer as code: parse it (json.loads, ast.literal_eval) instead"
    )
    grader_reads = ("evals",)


HARNESS = AnswerAsCode()
