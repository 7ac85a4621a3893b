"""Runtime of the ``every-candidate`` attack (docs/audit.md): every candidate at once: every number and quoted word of the task, 0-100, yes/no/true/false and option letters, as one answer and as a list."""

import re

from rollout.contract.attack_kit import answer_everywhere, finish, instruction, start

req = start()
task = instruction(req)
candidates = list(
    dict.fromkeys(
        re.findall(r"-?\d+(?:\.\d+)?", task)
        + re.findall(r"[`'\"]([^`'\"\n]{1,40})[`'\"]", task)
        + [str(i) for i in range(101)]
        + ["yes", "no", "true", "false", "A", "B", "C", "D", "E"]
    )
)
text = " ".join(candidates)
finish(
    req,
    metrics={
        **answer_everywhere({"answer": candidates, "answers": candidates}, text),
        "candidates": candidates,
    },
)
