"""What ``launcher.py train`` evaluates on and how it reports it: disjoint cases by default (the
env's split field, else the cases not trained), an overlap refused naming its cases before any
work, allowed only by flag and then never called held-out; the estimates (pass@1, pass@k, mean
reward, their standard errors over cases). No torch needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.core.envs import Case
from rollout.core.setup import SetupError
from rollout.jobs.options import JobOptions
from rollout.jobs.prepare import load_envs
from rollout.train.heldout import HELD_OUT, OVERLAPPING, choose_cases, eval_line, summarize, summary_line

REPO = Path(__file__).resolve().parents[2]


def _cases(env: str) -> list[Case]:
    ((_, cases),) = load_envs(
        JobOptions(agent_root=REPO / "env", env_names=[env], gateway_config=REPO / "nowhere.yaml")
    )
    return cases


def test_the_default_trains_on_the_train_split_and_evaluates_on_the_disjoint_eval_split() -> None:
    split = choose_cases("scripts", _cases("scripts"), None, None)
    assert split.train == ["gauge-batch", "inspect-log", "summarize-marks", "review-items", "compute-orders"]
    assert len(split.eval) == 12 and not set(split.eval) & set(split.train)
    assert (split.overlap, split.label) == ([], HELD_OUT)


def test_an_env_without_a_split_evaluates_on_the_cases_not_trained() -> None:
    split = choose_cases("basics", _cases("basics"), ["run_script"], None)
    assert (split.train, split.eval, split.label) == (["run_script"], ["read_name", "tally"], HELD_OUT)
    with pytest.raises(
        SetupError,
        match=r"no case left to evaluate on besides the trained ones "
        r"\(read_name, run_script, tally\)",
    ):
        choose_cases("basics", _cases("basics"), None, None)


def test_an_overlap_is_refused_naming_its_cases_unless_allowed_and_then_not_held_out() -> None:
    cases = _cases("basics")
    with pytest.raises(
        SetupError, match=r"overlap the trained cases: tally, run_script; .*--allow-eval-overlap"
    ):
        choose_cases("basics", cases, ["run_script", "tally"], ["tally", "read_name", "run_script"])
    split = choose_cases(
        "basics", cases, ["run_script", "tally"], ["tally", "read_name", "run_script"], allow_overlap=True
    )
    assert (split.eval, split.overlap, split.label) == (
        ["tally", "read_name", "run_script"],
        ["tally", "run_script"],
        OVERLAPPING,
    )
    with pytest.raises(SetupError, match=r"env basics has no case \['nope'\]"):
        choose_cases("basics", cases, ["run_script"], ["nope"])


def test_train_refuses_an_overlap_before_loading_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollout.cli.train import main

    out = tmp_path / "run"
    code = main(
        [
            "--env",
            "scripts",
            "--cases",
            "gauge-batch",
            "--eval-cases",
            "gauge-batch,measure-list",
            "--model-config",
            "tiny",
            "--out",
            str(out),
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the evaluation cases overlap the trained cases: gauge-batch; ")
    assert not out.exists()


def test_the_estimates_are_over_cases_with_pass_at_k_and_standard_errors() -> None:
    # 3 cases x 4 samples: passes 2/4, 0/4, 4/4
    scores = {"a": [10.0, 0.0, 10.0, 0.0], "b": [0.0, 0.0, 0.0, 5.0], "c": [10.0] * 4}
    r = summarize(scores, when="after", step=16, label=HELD_OUT, temperature=0.5, pass_score=10.0)
    assert (r.cases, r.samples, r.n, r.step) == (3, 4, 12, 16)
    assert r.pass_rate == pytest.approx(0.5)  # (0.5 + 0 + 1) / 3
    assert r.pass_rate_se == pytest.approx(0.5 / 3**0.5)  # sd 0.5 over 3 cases
    assert r.pass_at_k == pytest.approx(2 / 3)  # 1, 0, 1
    assert r.pass_at_k_se == pytest.approx((1 / 3) ** 0.5 / 3**0.5)
    assert r.mean_reward == pytest.approx((5.0 + 1.25 + 10.0) / 3)
    assert r.mean_reward_se == pytest.approx(
        (((5 - 65 / 12) ** 2 + (1.25 - 65 / 12) ** 2 + (10 - 65 / 12) ** 2) / 2 / 3) ** 0.5
    )
    line = eval_line(r)
    assert line == (
        "eval after    held-out  pass@1 0.50±0.29  pass@4 0.67±0.33  mean reward 5.42±2.53  "
        "(n=3 cases x 4 samples, T=0.5)"
    )
    greedy = summarize(
        {"a": [10.0], "b": [0.0]}, when="before", step=0, label=OVERLAPPING, temperature=0.0, pass_score=10.0
    )
    assert (greedy.pass_rate, greedy.pass_rate_se, greedy.pass_at_k) == (0.5, 0.5, None)
    assert eval_line(greedy) == (
        "eval before   overlapping (train-set eval)  pass@1 0.50±0.50  mean reward "
        "5.00±5.00  (n=2 cases x 1 sample, greedy)"
    )
    assert "held-out" not in eval_line(greedy) + summary_line(greedy, greedy)
    assert summary_line(greedy, r) == (
        "held-out pass@1 0.50±0.50 -> 0.50±0.29, mean reward 5.00±5.00 -> "
        "5.42±2.53 (n=3 cases x 4 samples, T=0.5)"
    )
    with pytest.raises(ValueError, match="same number"):
        summarize(
            {"a": [1.0], "b": [1.0, 2.0]}, when="x", step=0, label=HELD_OUT, temperature=0.0, pass_score=10.0
        )
