"""Runtime of the ``echo-instruction`` attack (docs/audit.md): answers with the task's own text: the instruction (or question) as the answer everywhere."""

from rollout.contract.attack_kit import answer_everywhere, finish, instruction, start

req = start()
text = instruction(req)
finish(req, metrics=answer_everywhere({"answer": text}, text))
