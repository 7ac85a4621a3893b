"""Runtime of the ``huge-valid-answer`` attack (docs/audit.md): ``outputs/answer.json`` a valid JSON
object whose ``answer`` is a list of empty lists, 160 MiB in all (under the grader's copy cap)."""

from rollout.contract.attack_kit import ANSWER_FILE, finish, start, write

MIB = 1024 * 1024
req = start()
path = write(ANSWER_FILE, '{"answer": [[]')
chunk = ",[]" * (MIB // 3)
with path.open("a") as f:
    for _ in range(160):
        f.write(chunk)
    f.write("]}")
finish(req)
