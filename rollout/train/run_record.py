"""What ``launcher.py train`` keeps beside its checkpoints (docs/training.md, "What a run keeps"):
``run.json`` (what was trained, on what, for how many steps, and the held-out evaluation) and
``steps.jsonl`` (one line per step: the curve, read back by ``--resume``), ``metrics.jsonl`` (TRL's
logged values per step)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from rollout.train.trl_rollout import StepStats

__all__ = ["EvalRecord", "RunRecord", "append_jsonl", "read_jsonl", "read_run", "read_steps", "write_run"]

RUN_FILE = "run.json"
STEPS_FILE = "steps.jsonl"
METRICS_FILE = "metrics.jsonl"


class EvalRecord(BaseModel):
    """One evaluation, as ``rollout.train.heldout.EvalResult`` has it."""

    model_config = ConfigDict(extra="forbid")
    when: str
    step: int
    label: str
    cases: int
    samples: int
    temperature: float | None
    mean_reward: float
    mean_reward_se: float | None
    pass_rate: float
    pass_rate_se: float | None
    pass_at_k: float | None
    pass_at_k_se: float | None


class RunRecord(BaseModel):
    """``run.json``: ``steps`` is the optimizer steps done, ``checkpoint`` the newest checkpoint
    folder (relative to the run's folder), ``final`` the model saved at the end (with ``lora_r``:
    the adapter of ``base_model``)."""

    model_config = ConfigDict(extra="forbid")
    env: str
    model: str
    base_model: str
    train_cases: list[str]
    eval_cases: list[str]
    eval_label: str = "held-out"  # "overlapping (train-set eval)" with --allow-eval-overlap
    steps: int = 0
    max_steps: int
    samples: int
    cases_per_step: int
    lr: float
    beta: float
    seed: int
    save_steps: int
    lora_r: int | None = None
    lora_alpha: int | None = None
    checkpoint: str | None = None
    final: str | None = None
    evals: list[EvalRecord] = []
    resumes: int = 0


def write_run(out: Path, record: RunRecord) -> Path:
    """Write ``out/run.json`` (whole, replacing the previous one)."""
    path = out / RUN_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_run(out: Path) -> RunRecord:
    """``out/run.json``; FileNotFoundError when there is none, ValidationError when it is not one."""
    return RunRecord.model_validate_json((out / RUN_FILE).read_text(encoding="utf-8"))


def append_jsonl(path: Path, obj: dict[str, Any]) -> None:
    """Append one JSON line (flushed: a run stopped after it still has it)."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(obj) + "\n")


def read_jsonl(path: Path, upto: int) -> list[dict[str, Any]]:
    """The lines of ``path`` whose ``step`` is at most ``upto``, and the file cut to them (the
    steps after ``upto`` are run again); none when there is no file."""
    if not path.exists():
        return []
    kept = [
        o
        for o in (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        if int(o["step"]) <= upto
    ]
    path.write_text("".join(json.dumps(o) + "\n" for o in kept), encoding="utf-8")
    return kept


def step_line(step: int, stats: StepStats) -> dict[str, Any]:
    """One ``steps.jsonl`` line."""
    return {"step": step, **asdict(stats)}


def read_steps(out: Path, upto: int) -> list[StepStats]:
    """The curve of steps 1..``upto`` from ``out/steps.jsonl`` (the file cut to them); ValueError
    when a step is missing or repeated."""
    lines = read_jsonl(out / STEPS_FILE, upto)
    if [o["step"] for o in lines] != list(range(1, upto + 1)):
        raise ValueError(f"{out / STEPS_FILE}: steps {[o['step'] for o in lines]}, not 1..{upto}")
    return [StepStats(**{k: v for k, v in o.items() if k != "step"}) for o in lines]
