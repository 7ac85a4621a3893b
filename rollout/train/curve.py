"""The training curve of ``launcher.py train``: a PNG (matplotlib) and an HTML page (plotly, its
bundle inline, so it opens offline) with the per-step table and the evaluations (before, every
``--eval-every`` steps, after) at the step each was made, pass@1 with its standard error."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import plotly.graph_objects as go  # noqa: E402

from rollout.train.heldout import EvalResult, sampling  # noqa: E402
from rollout.train.trl_rollout import StepStats  # noqa: E402

__all__ = ["write_curve"]


def _se(value: float | None) -> str:
    return "" if value is None else f" ± {value:.2f}"


def write_curve(
    history: Sequence[StepStats], evals: Sequence[EvalResult], out_dir: Path, max_score: float = 10.0
) -> tuple[Path, Path]:
    """Write ``curve.png`` and ``curve.html`` into ``out_dir``; ``evals`` drawn at their steps (before
    at 0). Returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = list(range(1, len(history) + 1))
    passes = [h.pass_rate for h in history]
    rewards = [h.mean_reward for h in history]
    png = out_dir / "curve.png"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, [r / max_score for r in rewards], marker=".", label=f"mean reward / {max_score:g}")
    ax.plot(steps, passes, marker="o", label="pass rate")
    if evals:
        ax.errorbar(
            [e.step for e in evals],
            [e.pass_rate for e in evals],
            yerr=[e.pass_rate_se or 0.0 for e in evals],
            marker="s",
            color="green",
            capsize=3,
            label=f"{evals[0].label} pass@1 (n={evals[0].cases} cases)",
        )
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("per-step batch")
    ax.set_ylim(0, 1.05)
    ax.set_title("GRPO training")
    ax.legend(loc="lower right")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=steps, y=passes, mode="lines+markers", name="pass rate"))
    fig.add_trace(go.Scatter(x=steps, y=rewards, mode="lines+markers", name="mean reward", yaxis="y2"))
    if evals:
        fig.add_trace(
            go.Scatter(
                x=[e.step for e in evals],
                y=[e.pass_rate for e in evals],
                mode="lines+markers",
                name=f"{evals[0].label} pass@1",
                error_y={"type": "data", "array": [e.pass_rate_se or 0.0 for e in evals]},
            )
        )
    fig.update_layout(
        title="GRPO training",
        xaxis_title="step",
        yaxis={"title": "pass rate", "range": [0, 1]},
        yaxis2={"title": "mean reward", "overlaying": "y", "side": "right", "range": [0, max_score]},
    )
    head = (
        "<tr><th>step</th><th>mean reward</th><th>pass rate</th><th>disagreeing groups</th>"
        "<th>tokens trained</th><th>dropped</th><th>seconds</th></tr>"
    )
    rows = "".join(
        f"<tr><td>{i}</td><td>{h.mean_reward:.2f}</td><td>{h.pass_rate:.2f}</td>"
        f"<td>{h.disagreeing_groups}/{h.groups}</td><td>{h.tokens_trained}</td><td>{h.dropped}</td>"
        f"<td>{h.seconds:.1f}</td></tr>"
        for i, h in enumerate(history, 1)
    )
    ev = "".join(
        f"<tr><td>{html.escape(e.when)}</td><td>{e.step}</td><td>{html.escape(e.label)}</td>"
        f"<td>{e.pass_rate:.2f}{_se(e.pass_rate_se)}</td>"
        f"<td>{'' if e.pass_at_k is None else f'{e.pass_at_k:.2f}{_se(e.pass_at_k_se)}'}</td>"
        f"<td>{e.mean_reward:.2f}{_se(e.mean_reward_se)}</td><td>{e.cases}</td><td>{e.samples}</td>"
        f"<td>{sampling(e)}</td></tr>"
        for e in evals
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>GRPO training</title></head><body>"
        + fig.to_html(full_html=False, include_plotlyjs=True)
        + "<h2>Evaluation</h2><table border=1><tr><th>when</th><th>step</th><th>evaluation</th>"
        + "<th>pass@1 ± se</th><th>pass@k ± se (k = samples)</th><th>mean reward ± se</th><th>n (cases)</th>"
        + f"<th>samples per case</th><th>sampling</th></tr>{ev}</table>"
        + f"<h2>Steps</h2><table border=1>{head}{rows}</table></body></html>"
    )
    page_path = out_dir / "curve.html"
    page_path.write_text(page, encoding="utf-8")
    return png, page_path
