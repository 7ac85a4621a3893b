"""Runtime of the ``deep-answer`` attack (docs/audit.md): a 100,000-level nested JSON answer, NaN and
Infinity, invalid UTF-8."""

from rollout.contract.attack_kit import ANSWER_FILE, TEXT_FILE, finish, start, write

DEPTH = 100_000
req = start()
write(ANSWER_FILE, '{"answer": ' + "[" * DEPTH + "]" * DEPTH + "}")
write(TEXT_FILE, b"\xff\xfe\xc3(" + b"[" * DEPTH)
write("outputs/result.json", '{"answer": NaN, "score": Infinity, "passed": -Infinity}')
finish(req, metrics={"answer": "[" * 1000 + "]" * 1000})
