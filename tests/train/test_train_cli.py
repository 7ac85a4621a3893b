"""``launcher.py train`` end to end on the tiny model and a fixture env (no sandbox): what a run
keeps in ``--out`` (checkpoints, the final model, ``run.json``, ``steps.jsonl``)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.train.test_trl_rollout import make_env

pytestmark = [
    pytest.mark.train,
    # TRL 1.16 still calls transformers' names deprecated in v5 (``is_gradient_checkpointing``)
    pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning"),
]


def run_train(tmp_path: Path, out: Path, *flags: str) -> tuple[dict[str, Any], str]:
    from rollout.cli.train import parse_args, train

    if not (tmp_path / "envs").exists():
        make_env(tmp_path / "envs")
    argv = ["--env", "toy", "--agent-root", str(tmp_path / "envs"), "--cases", "a", "--samples", "2",
            "--max-new-tokens", "8", "--model-config", "tiny", "--sandbox", "none", "--out", str(out), *flags]
    printed = io.StringIO()
    return train(parse_args(argv), stdout=printed), printed.getvalue()


def weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_a_run_keeps_checkpoints_the_final_model_and_its_record(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    result, printed = run_train(tmp_path, out, "--steps", "3", "--save-steps", "2")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    assert json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
    assert result["final"] == out / "final"
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    saved = weights(out / "checkpoint-3")
    assert set(model.state_dict()) == set(saved)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert AutoTokenizer.from_pretrained(out / "final").eos_token == "<|im_end|>"
    record = json.loads((out / "run.json").read_text())
    evals = result["evals"]
    assert record == {
        "env": "toy", "model": "tiny", "base_model": "tiny: a 2-layer Llama, random weights (rollout/train/tiny.py)",
        "train_cases": ["a"], "eval_cases": ["a", "b"], "steps": 3, "max_steps": 3, "samples": 2,
        "cases_per_step": 1, "lr": 5e-6, "beta": 0.0, "seed": 0, "save_steps": 2, "checkpoint": "checkpoint-3",
        "final": "final", "resumes": 0,
        "evals": {w: {"mean_reward": evals[w][0], "pass_rate": evals[w][1], "samples": 2}
                  for w in ("before", "after")}}
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert [s["mean_reward"] for s in steps] == [h.mean_reward for h in result["history"]]
    assert f"model: {out / 'final'}" in printed
