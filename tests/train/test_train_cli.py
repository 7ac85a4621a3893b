"""``launcher.py train`` end to end on the tiny model: the scripts env's jobs in the sandbox, a
sampled evaluation (``--eval-samples 2``) before, after every step (``--eval-every 1``) and after,
into the printed lines and the curve; with ``--allow-eval-overlap`` the evaluation is reported as
overlapping, never held-out. The tiny random model never solves a case: every score is 0."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import pytest

from rollout.cli.train import TrainArgs, train

pytestmark = [
    pytest.mark.train,
    # TRL 1.16 still calls transformers' names deprecated in v5 (``is_gradient_checkpointing``)
    pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning"),
]


def test_a_sampled_evaluation_every_step_on_cases_also_trained_is_reported_as_overlapping(tmp_path: Path) -> None:
    out = io.StringIO()
    result = train(TrainArgs(cases=["gauge-batch"], eval_cases=["gauge-batch", "measure-list"],
                             allow_eval_overlap=True, steps=2, samples=2, eval_samples=2, eval_every=1,
                             max_new_tokens=8, model_config="tiny", out=tmp_path / "run", pool_size=2),
                   stdout=out)
    text = out.getvalue()
    lines = [line for line in text.splitlines() if line.startswith("eval ")]
    label = "overlapping (train-set eval)"
    assert lines == [f"eval {when:8s} {label}  pass@1 0.00±0.00  pass@2 0.00±0.00  mean reward 0.00±0.00  "
                     "(n=2 cases x 2 samples, T=0.5)" for when in ("before", "step 1", "after")]
    assert "held-out" not in text
    assert text.splitlines()[0] == f"training on gauge-batch; evaluating ({label}) on gauge-batch, measure-list"
    assert [(e.when, e.step, e.n, e.temperature) for e in result["evals"]] == [
        ("before", 0, 4, 0.5), ("step 1", 1, 4, 0.5), ("after", 2, 4, 0.5)]
    page = result["html"].read_text(encoding="utf-8")
    assert page.count(f"<td>{label}</td>") == 3 and "<td>step 1</td><td>1</td>" in page
    con = sqlite3.connect(tmp_path / "run" / "train.db")
    try:
        jobs = dict(con.execute("SELECT job_id, COUNT(*) FROM job_environments WHERE eval_status = 'scored' "
                                "GROUP BY job_id").fetchall())
    finally:
        con.close()
    assert {j: n for j, n in jobs.items() if "eval" in j} == {
        "train-eval-before": 4, "train-eval-step1": 4, "train-eval-after": 4}
