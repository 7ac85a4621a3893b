"""Writes ``data/cases.jsonl``: the scripts env's instances, generated from a fixed seed.

Every instance is the same skill (run the one command the instruction shows; the script writes
``outputs/answer.json``) on its own script name, data file and numbers. The ``split`` field puts
the first ``TRAIN_CASES`` instances in ``train`` and the rest in ``eval``: no two instances share
an id, a script name or a data file, so the two splits are disjoint by construction. The expected
answer is computed here in Python from the data, never by running the script.

    python env/scripts/generate.py   # rewrites data/cases.jsonl (the test checks it is up to date)
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

SEED = 20260
TRAIN_CASES = 5
EVAL_CASES = 12
DATA = Path(__file__).resolve().parent / "data" / "cases.jsonl"

WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "maple",
    "tiger",
    "lemon",
    "piano",
    "ocean",
    "brick",
    "eagle",
    "grape",
    "honey",
    "ivory",
    "jelly",
    "koala",
    "mango",
    "nutmeg",
    "olive",
    "pearl",
    "quartz",
    "robin",
]

Op = tuple[str, str, Callable[[list[str]], int], bool]
"""(answer key, shell pipeline reading ``$F``, the same in Python, numbers rather than words)."""
OPS: list[Op] = [
    ("lines", "wc -l < \"$F\" | tr -d ' '", len, False),
    ("distinct", "sort -u \"$F\" | wc -l | tr -d ' '", lambda v: len(set(v)), False),
    ("total", "awk '{s += $1} END {print s}' \"$F\"", lambda v: sum(int(x) for x in v), True),
    ("largest", 'sort -n "$F" | tail -n 1', lambda v: max(int(x) for x in v), True),
    ("smallest", 'sort -n "$F" | head -n 1', lambda v: min(int(x) for x in v), True),
]
SCRIPT_NAMES = [
    "count",
    "tally",
    "measure",
    "summarize",
    "check",
    "compute",
    "report",
    "scan",
    "digest",
    "inspect",
    "survey",
    "audit",
    "gauge",
    "review",
    "probe",
    "sample",
    "reckon",
    "weigh",
]
DATA_NAMES = [
    "items",
    "records",
    "list",
    "values",
    "entries",
    "log",
    "stock",
    "notes",
    "batch",
    "orders",
    "readings",
    "scores",
    "lines",
    "rows",
    "points",
    "cells",
    "marks",
    "ticks",
]

SCRIPT = """#!/bin/sh
# Reads {data} and writes the answer.
F={data}
mkdir -p outputs
echo "{{\\"{key}\\": $({pipeline})}}" > outputs/answer.json
echo "wrote outputs/answer.json"
"""


def instances() -> list[dict[str, object]]:
    """The rows of ``data/cases.jsonl``, in order (train first)."""
    rng = random.Random(SEED)
    scripts = rng.sample(SCRIPT_NAMES, TRAIN_CASES + EVAL_CASES)
    datas = rng.sample(DATA_NAMES, TRAIN_CASES + EVAL_CASES)
    rows: list[dict[str, object]] = []
    for i in range(TRAIN_CASES + EVAL_CASES):
        key, pipeline, answer, numeric = OPS[i % len(OPS)]
        n = rng.randint(3, 9)
        values = (
            [str(rng.randint(1, 99)) for _ in range(n)] if numeric else [rng.choice(WORDS) for _ in range(n)]
        )
        script, data = f"{scripts[i]}.sh", f"{datas[i]}.txt"
        rows.append(
            {
                "id": f"{scripts[i]}-{datas[i]}",
                "split": "train" if i < TRAIN_CASES else "eval",
                "instruction": f"```bash\n./{script}\n```\nRun the command above.\n",
                "files": {
                    script: SCRIPT.format(data=data, key=key, pipeline=pipeline),
                    data: "".join(f"{v}\n" for v in values),
                },
                "expected": {key: answer(values)},
            }
        )
    return rows


def render() -> str:
    """The JSONL text of :func:`instances`."""
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in instances())


if __name__ == "__main__":
    DATA.write_text(render(), encoding="utf-8")
    print(f"wrote {DATA}")
