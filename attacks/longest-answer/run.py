"""Runtime of the ``longest-answer`` attack (docs/audit.md): the longest answer: 1 MiB of text built from the task's words, every number and the task itself."""

import re

from rollout.contract.attack_kit import answer_everywhere, finish, instruction, start

req = start()
task = instruction(req)
words = list(dict.fromkeys(re.findall(r"\w+", task))) + [str(i) for i in range(1000)]
text = (task + "\n" + " ".join(words) + "\n") * (1024 * 1024 // (len(task) + len(" ".join(words)) + 2) + 1)
text = text[: 1024 * 1024]
finish(req, metrics=answer_everywhere({"answer": text}, text))
