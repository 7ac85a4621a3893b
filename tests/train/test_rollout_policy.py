"""The rollout_func's drop policy without the launcher (the jobs a call runs, what each asks for,
the rows it returns, the error when a case stays short), the per-step numbers, and the curve's
PNG raster. No torch needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollout.core.setup import SetupError
from rollout.jobs.options import JobOptions


def _sample(case: str, sid: str, reward: float) -> Any:
    from rollout.train.adapters import TrainSample

    return TrainSample(
        group_id=f"g-{sid}",
        case_id=case,
        session_id=sid,
        sample_index=0,
        prompt_ids=[1],
        completion_ids=[2, 3],
        completion_mask=[1, 1],
        completion_logprobs=[-0.1, -0.2],
        reward=reward,
        advantage=None,
        policy_versions=[0],
        steps=[1],
        finish_reason="stop",
        truncated=False,
    )


def test_short_cases_are_rerun_for_the_missing_samples_only_then_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drop policy without the launcher: the jobs a call runs, and what each asks for."""
    from rollout.train import trl_rollout
    from rollout.train.adapters import Dropped

    asked: list[tuple[str, list[str], int | None]] = []
    answers: dict[str, list[Any]] = {
        "t-step0001": [_sample("a", "a0", 10.0), _sample("b", "b0", 0.0), _sample("b", "b1", 10.0)],
        "t-step0001-rerun1": [_sample("a", "a1", 0.0)],
        "t-step0002": [_sample("a", "a2", 10.0)],
    }

    async def run_job(opts: JobOptions) -> None:
        assert opts.job_id is not None
        asked.append((opts.job_id, opts.case_ids, opts.rl_group_size))

    async def read(db_url: str, job_id: str) -> tuple[list[Any], list[Any], list[Dropped]]:
        return (
            [],
            answers.get(job_id, []),
            [Dropped("g", "x", "invalid: infrastructure failure (setup_failed)")],
        )

    monkeypatch.setattr(trl_rollout, "run_job", run_job)
    monkeypatch.setattr(trl_rollout, "read_job_samples", read)
    template = JobOptions(gateway_config=tmp_path / "gw.yaml", db_path=f"sqlite://{tmp_path / 't.db'}")
    rollout = trl_rollout.JobRollout(template, num_generations=2, job_prefix="t", max_reruns=1)
    rows = rollout.rollout_func(["a", "a", "b", "b"])
    assert asked == [("t-step0001", ["a", "b"], 2), ("t-step0001-rerun1", ["a"], 1)]
    assert rows["session_id"] == ["a0", "a1", "b0", "b1"] and rows["env_reward"] == [10.0, 0.0, 0.0, 10.0]
    (stats,) = rollout.history
    assert (stats.mean_reward, stats.pass_rate, stats.disagreeing_groups, stats.groups) == (5.0, 0.5, 2, 2)
    assert (stats.tokens_trained, stats.rows, stats.dropped, stats.jobs) == (8, 4, 2, 2)
    with pytest.raises(trl_rollout.ShortBatchError, match=r"cases short of 2 trainable samples: \{'a': 1\}"):
        rollout.rollout_func(["a", "a"])
    assert [a[0] for a in asked[2:]] == ["t-step0002", "t-step0002-rerun1"]


def test_the_curve_is_a_png_and_an_offline_page_with_every_step(tmp_path: Path) -> None:
    from rollout.train.curve import write_curve
    from rollout.train.heldout import HELD_OUT, summarize
    from rollout.train.trl_rollout import StepStats

    history = [
        StepStats(
            mean_reward=2.5,
            pass_rate=0.25,
            disagreeing_groups=1,
            groups=1,
            tokens_trained=40,
            rows=8,
            dropped=0,
            jobs=1,
            seconds=3.0,
        ),
        StepStats(
            mean_reward=7.5,
            pass_rate=0.75,
            disagreeing_groups=1,
            groups=1,
            tokens_trained=44,
            rows=8,
            dropped=1,
            jobs=2,
            seconds=4.0,
        ),
    ]
    evals = [
        summarize(
            {"a": [0.0], "b": [10.0], "c": [0.0]},
            when="before",
            step=0,
            label=HELD_OUT,
            temperature=0.0,
            pass_score=10.0,
        ),
        summarize(
            {"a": [10.0, 10.0], "b": [10.0, 0.0], "c": [0.0, 0.0]},
            when="after",
            step=2,
            label=HELD_OUT,
            temperature=0.5,
            pass_score=10.0,
        ),
    ]
    png, page = write_curve(history, evals, tmp_path / "out")
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (800, 450)
    text = page.read_text(encoding="utf-8")
    assert "<td>2</td><td>7.50</td><td>0.75</td><td>1/1</td><td>44</td><td>1</td><td>4.0</td>" in text
    assert (
        "<td>before</td><td>0</td><td>held-out</td><td>0.33 ± 0.33</td><td></td><td>3.33 ± 3.33</td>"
        "<td>3</td><td>1</td><td>greedy</td>" in text
    )
    assert (
        "<td>after</td><td>2</td><td>held-out</td><td>0.50 ± 0.29</td><td>0.67 ± 0.33</td><td>5.00 ± 2.89</td>"
        "<td>3</td><td>2</td><td>T=0.5</td>" in text
    )
    assert 'src="https://' not in text and len(text) > 1_000_000  # plotly's bundle inline: opens offline


def test_train_flags_are_checked_and_listed() -> None:
    from rollout.cli.train import parse_args

    a = parse_args(["--cases", "run_script, tally", "--steps", "3", "--model-config", "tiny"])
    assert (a.cases, a.eval_cases, a.steps, a.samples, a.model_config) == (
        ["run_script", "tally"],
        None,
        3,
        8,
        "tiny",
    )
    d = parse_args([])
    assert (d.env, d.cases, d.eval_cases, d.eval_samples, d.eval_every, d.allow_eval_overlap) == (
        "scripts",
        None,
        None,
        1,
        0,
        False,
    )
    e = parse_args(["--eval-samples", "4", "--eval-every", "2", "--allow-eval-overlap"])
    assert (e.eval_samples, e.eval_every, e.allow_eval_overlap) == (4, 2, True)
    with pytest.raises(SetupError, match=r"^--eval-every: must be at least 0 \(got -1\)"):
        parse_args(["--eval-every", "-1"])
    with pytest.raises(SystemExit) as e:  # argparse's own: not a number
        parse_args(["--samples", "x"])
    assert e.value.code == 2


@pytest.mark.parametrize("installed", [True, False])
def test_train_reports_to_tensorboard_by_default_only_when_it_is_installed(
    installed: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    from rollout.cli.train import parse_args

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (
            (find_spec("json") if installed else None)
            if name in ("tensorboard", "tensorboardX")
            else find_spec(name, *a)
        ),
    )
    assert parse_args([]).report_to == ("tensorboard" if installed else "none")
    assert parse_args(["--report-to", "none"]).report_to == "none"
    if installed:
        assert parse_args(["--report-to", "tensorboard"]).report_to == "tensorboard"
        return
    with pytest.raises(SystemExit) as e:
        parse_args(["--report-to", "tensorboard"])
    assert e.value.code == 2
    assert "--report-to tensorboard: the tensorboard package is not installed" in capsys.readouterr().err


def test_lora_flags_need_a_rank_and_peft(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    from rollout.cli.train import parse_args

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: find_spec("json") if name == "peft" else find_spec(name, *a),
    )
    a = parse_args(["--lora-r", "8"])
    assert (a.lora_r, a.lora_alpha) == (8, 16.0)
    assert (parse_args(["--lora-r", "8", "--lora-alpha", "4"]).lora_alpha, parse_args([]).lora_r) == (
        4.0,
        None,
    )
    with pytest.raises(SystemExit):
        parse_args(["--lora-alpha", "4"])
    assert "--lora-alpha needs --lora-r" in capsys.readouterr().err
    with pytest.raises(SetupError, match=r"^--lora-r: must be at least 1 \(got 0\)$"):
        parse_args(["--lora-r", "0"])
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "peft" else find_spec(name, *a)
    )
    with pytest.raises(SystemExit):
        parse_args(["--lora-r", "8"])
    assert "--lora-r: the peft package is not installed" in capsys.readouterr().err


def test_train_names_each_flag_out_of_range_with_its_value_before_any_work() -> None:
    """As a job's flags: one line per flag, the value given, exit 1 (``main`` catches the
    SetupError), before the model loads (nothing is written)."""
    from rollout.cli.train import parse_args

    argv = ["--samples", "1", "--steps", "0", "--pool-size", "0", "--lr", "-1", "--temperature", "nan"]
    with pytest.raises(SetupError) as e:
        parse_args([*argv, "--max-retries", "-1"])
    assert str(e.value).splitlines() == [
        "--steps: must be at least 1 (got 0)",
        "--pool-size: must be at least 1 (got 0)",
        "--samples: must be at least 2 (got 1): GRPO compares the samples of a case",
        "--max-retries: must be at least 0 (got -1)",
        "--lr: must be more than 0 (got -1.0)",
        "--temperature: must be at least 0 (got nan)",
    ]


@pytest.mark.parametrize("bad", ["out_file", "out_used", "resume_nothing"])
def test_train_refuses_before_any_work_what_cannot_run(
    tmp_path: Path, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollout.cli.train import parse_args

    (tmp_path / "f").write_text("")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "train.db").write_text("")
    argv = {
        "out_file": ["--out", str(tmp_path / "f")],
        "out_used": ["--out", str(tmp_path / "used")],
        "resume_nothing": ["--resume", "--out", str(tmp_path)],
    }[bad]
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert {
        "out_file": "a file, not a folder",
        "out_used": "holds an earlier run (train.db): add --resume to continue it",
        "resume_nothing": "--resume: --out " + str(tmp_path) + " holds no run",
    }[bad] in err


def test_the_evaluation_counts_valid_scores_without_tokens_and_reruns_invalid_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from rollout.train import trl_rollout

    def sample(sid: str, score: float | None, valid: bool) -> Any:
        return SimpleNamespace(
            session_id=sid,
            score=score,
            valid=valid,
            invalid_reason=None if valid else "infrastructure failure (setup_failed)",
        )

    groups = {  # a's sample is valid but not one sequence (no TrainSample): it still counts
        "e-before": [
            SimpleNamespace(group_id="ga", case_id="a", samples=[sample("a0", 10.0, True)]),
            SimpleNamespace(group_id="gb", case_id="b", samples=[sample("b0", None, False)]),
        ],
        "e-before-rerun1": [SimpleNamespace(group_id="gb2", case_id="b", samples=[sample("b1", 0.0, True)])],
    }
    asked: list[tuple[str | None, list[str], float | None]] = []

    async def run_job(opts: JobOptions) -> None:
        asked.append((opts.job_id, opts.case_ids, opts.llm_temperature))

    async def read(db_url: str, job_id: str) -> tuple[list[Any], list[Any], list[Any]]:
        return groups.get(job_id, []), [], []

    monkeypatch.setattr(trl_rollout, "run_job", run_job)
    monkeypatch.setattr(trl_rollout, "read_job_samples", read)
    template = JobOptions(gateway_config=tmp_path / "gw.yaml", db_path=f"sqlite://{tmp_path / 't.db'}")
    rollout = trl_rollout.JobRollout(template, num_generations=2, job_prefix="e")
    from rollout.train.heldout import run_eval

    scores = run_eval(rollout, ["a", "b"], "before", 1, 0.0)
    assert scores == {"a": [10.0], "b": [0.0]}  # mean 5.0, pass rate 0.5, 2 samples
    assert asked == [("e-before", ["a", "b"], 0.0), ("e-before-rerun1", ["b"], 0.0)]


def test_vllm_server_flag_is_refused_with_the_reason_where_it_cannot_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    import torch

    from rollout.cli.train import parse_args

    find_spec = importlib.util.find_spec

    def vllm(installed: bool) -> None:  # the vllm package present or not, as find_spec tells
        spec = find_spec("json") if installed else None
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a: spec if name == "vllm" else find_spec(name, *a)
        )

    for argv, message in (
        (["--vllm-server", "localhost:8000"], "is not a server's address"),
        (["--vllm-server", "http://h:8000/v1"], "is not a server's address"),
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err
    vllm(installed=False)
    with pytest.raises(SystemExit):
        parse_args(["--vllm-server", "http://h:8000"])
    assert "--vllm-server: the vllm package is not installed" in capsys.readouterr().err
    vllm(installed=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        parse_args(["--vllm-server", "http://h:8000"])
    assert "no CUDA device" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    a = parse_args(["--vllm-server", "http://h:8000/"])
    assert (a.vllm_server, a.max_new_tokens) == ("http://h:8000", 48)
    with pytest.raises(SystemExit):
        parse_args(["--vllm-server", "http://h:8000", "--max-new-tokens", "64"])
    assert "--max-new-tokens caps the CPU policy server" in capsys.readouterr().err
    assert parse_args(["--max-new-tokens", "64"]).max_new_tokens == 64


def test_grpo_settings_on_the_cpu_and_with_a_vllm_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from trl import GRPOConfig

    from rollout.cli.train import TrainArgs, grpo_settings

    cpu = grpo_settings(TrainArgs(samples=4, cases_per_step=2, steps=3), tmp_path)
    assert (cpu["use_cpu"], cpu["bf16"], cpu["per_device_train_batch_size"], cpu["num_generations"]) == (
        True,
        False,
        8,
        4,
    )
    assert "use_vllm" not in cpu
    assert GRPOConfig(**cpu).use_vllm is False  # TRL takes them as they are
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    gpu = grpo_settings(TrainArgs(vllm_server="http://h:8000"), tmp_path)
    assert {k: gpu[k] for k in ("use_cpu", "bf16", "use_vllm", "vllm_mode", "vllm_server_base_url")} == {
        "use_cpu": False,
        "bf16": True,
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": "http://h:8000",
    }
    assert gpu["vllm_importance_sampling_correction"] is True
    assert set(gpu) <= set(GRPOConfig.__dataclass_fields__)  # every one a field of TRL's config


def test_the_served_model_is_the_first_of_the_servers_list() -> None:
    import httpx

    from rollout.cli.train import served_model
    from rollout.core.setup import SetupError

    def answer(models: object, status: int = 200) -> httpx.Client:
        return httpx.Client(
            transport=httpx.MockTransport(
                lambda r: (
                    httpx.Response(status, json=models) if r.url.path == "/v1/models" else httpx.Response(404)
                )
            )
        )

    listed = {"data": [{"id": "HuggingFaceTB/SmolLM2-135M-Instruct"}, {"id": "other"}]}
    assert served_model("http://h:8000", answer(listed)) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    for models, status, message in (
        ({"data": []}, 200, "lists no model"),
        ({"error": "x"}, 500, "no model list at http://h:8000/v1/models"),
        ([1, 2], 200, "no model list"),
    ):
        with pytest.raises(SetupError, match=message):
            served_model("http://h:8000", answer(models, status))


def test_weights_are_pushed_to_vllm_before_an_evaluation_and_never_on_the_cpu() -> None:
    from types import SimpleNamespace

    from rollout.cli.train import push_weights

    pushed: list[int] = []
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=3), _last_loaded_step=2)
    trainer.vllm_generation = SimpleNamespace(sync_weights=lambda: pushed.append(trainer.state.global_step))
    push_weights(trainer)
    assert (pushed, trainer._last_loaded_step) == (
        [3],
        3,
    )  # TRL's next generation at step 3 skips its own push
    cpu = SimpleNamespace(state=SimpleNamespace(global_step=3), _last_loaded_step=-1)
    push_weights(cpu)
    assert cpu._last_loaded_step == -1
