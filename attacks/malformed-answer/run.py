"""Runtime of the ``malformed-answer`` attack (docs/audit.md): a malformed answer: truncated JSON, NaN, a NUL byte, a number that is no number."""

from rollout.contract.attack_kit import ANSWER_FILE, TEXT_FILE, finish, start, write

req = start()
write(ANSWER_FILE, '{"answer": NaN, "result": [1, 2')
write(TEXT_FILE, b"NaN\x00Infinity \xff\xfe")
finish(req, metrics={"answer": float("nan"), "extracted_answer": "NaN", "completion_text": "#### NaN"})
