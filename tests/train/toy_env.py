"""The two-case ``toy`` env the training tests run (cases ``a`` and ``b``), with the runtime and
evaluator each test gives."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def make_toy_env(root: Path, runtime: str, evaluator: str) -> None:
    env_dir = root / "toy"
    (env_dir / "data").mkdir(parents=True)
    (env_dir / "runtime.py").write_text(runtime)
    (env_dir / "rule_evaluator.py").write_text(evaluator)
    (env_dir / "data" / "cases.jsonl").write_text(
        "".join(json.dumps({"id": c, "q": f"say {c}"}) + "\n" for c in ("a", "b"))
    )
    (env_dir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "toy",
                "dataset": {"format": "jsonl", "path": "data/cases.jsonl", "id_field": "id"},
                "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 200},
                "max_steps": 4,
            }
        )
    )
