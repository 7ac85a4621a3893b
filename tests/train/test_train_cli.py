"""``launcher.py train`` end to end on the tiny model: what a run keeps in ``--out`` (checkpoints,
the final model, ``run.json``, ``steps.jsonl``) on a fixture env (no sandbox), and the scripts env's
jobs in the sandbox with a sampled evaluation (``--eval-samples 2``) before, after every step
(``--eval-every 1``) and after; with ``--allow-eval-overlap`` it is reported as overlapping, never
held-out. The tiny random model never solves a case: every score there is 0."""

from __future__ import annotations

import importlib.util
import io
import json
import sqlite3
from dataclasses import asdict
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
    argv = [
        "--env",
        "toy",
        "--agent-root",
        str(tmp_path / "envs"),
        "--cases",
        "a",
        "--samples",
        "2",
        "--max-new-tokens",
        "8",
        "--model-config",
        "tiny",
        "--sandbox",
        "none",
        "--out",
        str(out),
        *flags,
    ]
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
        "env": "toy",
        "model": "tiny",
        "base_model": "tiny: a 2-layer Llama, random weights (rollout/train/tiny.py)",
        "train_cases": ["a"],
        "eval_cases": ["b"],
        "eval_label": "held-out",
        "steps": 3,
        "max_steps": 3,
        "samples": 2,
        "cases_per_step": 1,
        "lr": 5e-6,
        "beta": 0.0,
        "seed": 0,
        "save_steps": 2,
        "checkpoint": "checkpoint-3",
        "final": "final",
        "resumes": 0,
        "lora_r": None,
        "lora_alpha": None,
        "evals": [asdict(e) for e in evals],
    }
    assert [(e.when, e.step, e.cases, e.samples) for e in evals] == [("before", 0, 1, 1), ("after", 3, 1, 1)]
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert [s["mean_reward"] for s in steps] == [h.mean_reward for h in result["history"]]
    assert f"model: {out / 'final'}" in printed
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())["log_history"]
    assert metrics == [h for h in logged if "loss" in h]  # TRL's own logged values, one line per step
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert {"loss", "grad_norm", "entropy", "clip_ratio/region_mean", "reward", "learning_rate"} <= set(
        metrics[0]
    )
    for m in metrics:
        assert (
            f"loss {m['loss']:.4f}  grad norm {m['grad_norm']:.3f}  entropy {m['entropy']:.2f}  "
            f"clipped {m['clip_ratio/region_mean']:.2f}"
        ) in printed


@pytest.mark.parametrize("stopped", ["after_its_checkpoint", "before_its_checkpoint"])
def test_resume_continues_from_the_last_checkpoint_with_one_curve(tmp_path: Path, stopped: str) -> None:
    import asyncio
    import re

    from transformers import AutoModelForCausalLM

    from tests.train.test_trl_rollout import recorded

    out = tmp_path / "run"
    first, _ = run_train(tmp_path, out, "--steps", "2", "--save-steps", "1")
    if (
        stopped == "before_its_checkpoint"
    ):  # step 2 ran (its jobs, its line) but its checkpoint was never written
        import shutil

        shutil.rmtree(out / "checkpoint-2")
    resumed_from = {"after_its_checkpoint": 2, "before_its_checkpoint": 1}[stopped]
    result, printed = run_train(tmp_path, out, "--steps", "3", "--save-steps", "1", "--resume")
    assert f"resuming from {out / f'checkpoint-{resumed_from}'} (step {resumed_from} of 3)" in printed
    assert "eval before" not in printed
    for name in ("steps.jsonl", "metrics.jsonl"):
        assert [json.loads(line)["step"] for line in (out / name).read_text().splitlines()] == [1, 2, 3]
    assert len(result["history"]) == 3
    assert result["history"][:resumed_from] == first["history"][:resumed_from]
    page = (out / "curve.html").read_text()
    assert re.findall(r"<tr><td>(\d+)</td><td>[\d.]+</td>", page) == ["1", "2", "3"]
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2, 3]
    record = json.loads((out / "run.json").read_text())
    assert (record["steps"], record["checkpoint"], record["resumes"]) == (3, "checkpoint-3", 1)
    assert record["evals"][0] == asdict(first["evals"][0])  # the evaluation before, kept
    assert [e["when"] for e in record["evals"]] == ["before", "after"]
    new_steps = [f"train-resume1-step{n:04d}" for n in range(resumed_from + 1, 4)]
    jobs = {p.stem for p in (out / "jobs").glob("*step*.jsonl")}
    assert jobs == {"train-step0001", "train-step0002", *new_steps}
    sessions, recorded_steps = asyncio.run(recorded(f"sqlite://{out / 'train.db'}", new_steps))
    versions = {s.job_id: {st["policy_version"] for st in recorded_steps[sid]} for sid, s in sessions.items()}
    assert versions == {job: {int(job[-4:]) - 1} for job in new_steps}  # the version is the steps done
    AutoModelForCausalLM.from_pretrained(out / "checkpoint-3")


@pytest.mark.skipif(
    not any(importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX")),
    reason="the tensorboard package is not installed: --report-to tensorboard is refused",
)
def test_trls_logs_reach_tensorboard_by_default_when_it_is_installed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_train(tmp_path, out, "--steps", "1")
    assert len(list(out.glob("runs/*/events.out.tfevents.*"))) == 1


@pytest.mark.skipif(
    importlib.util.find_spec("peft") is None, reason="the peft package is not installed: --lora-r is refused"
)
def test_lora_trains_an_adapter_that_the_served_model_carries_and_the_checkpoints_hold(
    tmp_path: Path,
) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file

    from rollout.train.tiny import tiny_policy

    out = tmp_path / "run"
    result, _ = run_train(tmp_path, out, "--steps", "1", "--lora-r", "4")
    assert any(
        ".lora_A." in n for n, _ in result["model"].named_parameters()
    )  # what the policy server sampled from
    for folder in (out / "checkpoint-1", out / "final"):
        config = json.loads((folder / "adapter_config.json").read_text())
        assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
        assert sorted(config["target_modules"]) == [
            f"model.layers.{i}.{m}"
            for i in (0, 1)
            for m in (
                "mlp.down_proj",
                "mlp.gate_proj",
                "mlp.up_proj",
                "self_attn.k_proj",
                "self_attn.o_proj",
                "self_attn.q_proj",
                "self_attn.v_proj",
            )
        ]  # every linear layer but the output head
        assert not (folder / "model.safetensors").exists()
        keys = load_file(folder / "adapter_model.safetensors")
        assert len(keys) == 2 * 7 * 2 and all(".lora_A." in k or ".lora_B." in k for k in keys)
    loaded = PeftModel.from_pretrained(tiny_policy(0)[0], out / "final")
    assert sum(".lora_B." in n for n, _ in loaded.named_parameters()) == 14
    record = json.loads((out / "run.json").read_text())
    assert (record["lora_r"], record["lora_alpha"], record["final"]) == (4, 8.0, "final")


def test_a_sampled_evaluation_every_step_on_cases_also_trained_is_reported_as_overlapping(
    tmp_path: Path,
) -> None:
    from rollout.cli.train import TrainArgs, train

    out = io.StringIO()
    result = train(
        TrainArgs(
            cases=["gauge-batch"],
            eval_cases=["gauge-batch", "measure-list"],
            allow_eval_overlap=True,
            steps=2,
            samples=2,
            eval_samples=2,
            eval_every=1,
            max_new_tokens=8,
            model_config="tiny",
            out=tmp_path / "run",
            pool_size=2,
        ),
        stdout=out,
    )
    text = out.getvalue()
    lines = [line for line in text.splitlines() if line.startswith("eval ")]
    label = "overlapping (train-set eval)"
    assert lines == [
        f"eval {when:8s} {label}  pass@1 0.00±0.00  pass@2 0.00±0.00  mean reward 0.00±0.00  "
        "(n=2 cases x 2 samples, T=0.5)"
        for when in ("before", "step 1", "after")
    ]
    assert "held-out" not in text
    assert (
        text.splitlines()[0] == f"training on gauge-batch; evaluating ({label}) on gauge-batch, measure-list"
    )
    assert [(e.when, e.step, e.n, e.temperature) for e in result["evals"]] == [
        ("before", 0, 4, 0.5),
        ("step 1", 1, 4, 0.5),
        ("after", 2, 4, 0.5),
    ]
    page = result["html"].read_text(encoding="utf-8")
    assert page.count(f"<td>{label}</td>") == 3 and "<td>step 1</td><td>1</td>" in page
    con = sqlite3.connect(tmp_path / "run" / "train.db")
    try:
        jobs = dict(
            con.execute(
                "SELECT job_id, COUNT(*) FROM job_environments WHERE eval_status = 'scored' GROUP BY job_id"
            ).fetchall()
        )
    finally:
        con.close()
    assert {j: n for j, n in jobs.items() if "eval" in j} == {
        "train-eval-before": 4,
        "train-eval-step1": 4,
        "train-eval-after": 4,
    }
