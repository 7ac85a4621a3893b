"""The training curve of ``launcher.py train``: a PNG (matplotlib) and an HTML page (plotly, its
bundle inline, so it opens offline) with the per-step table and the held-out evaluation before and
after."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import plotly.graph_objects as go  # noqa: E402

from rollout.train.trl_rollout import StepStats  # noqa: E402

__all__ = ["write_curve"]


def write_curve(
    history: Sequence[StepStats],
    evals: dict[str, tuple[float, float, int]],
    out_dir: Path,
    max_score: float = 10.0,
) -> tuple[Path, Path]:
    """Write ``curve.png`` and ``curve.html`` into ``out_dir``; ``evals``: name -> (mean reward,
    pass rate, samples). Returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = list(range(1, len(history) + 1))
    passes = [h.pass_rate for h in history]
    rewards = [h.mean_reward for h in history]
    png = out_dir / "curve.png"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, [r / max_score for r in rewards], marker=".", label=f"mean reward / {max_score:g}")
    ax.plot(steps, passes, marker="o", label="pass rate")
    for name, (_, rate, _n) in evals.items():
        ax.axhline(rate, linestyle="--", linewidth=1, color="grey")
        ax.annotate(
            f"held-out {name}: {rate:.2f}",
            (steps[0] if steps else 0, rate),
            fontsize=8,
            xytext=(2, 2),
            textcoords="offset points",
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
        f"<tr><td>{html.escape(name)}</td><td>{m:.2f}</td><td>{p:.2f}</td><td>{n}</td></tr>"
        for name, (m, p, n) in evals.items()
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>GRPO training</title></head><body>"
        + fig.to_html(full_html=False, include_plotlyjs=True)
        + "<h2>Held-out evaluation</h2><table border=1><tr><th>when</th><th>mean reward</th>"
        + f"<th>pass rate</th><th>samples</th></tr>{ev}</table>"
        + f"<h2>Steps</h2><table border=1>{head}{rows}</table></body></html>"
    )
    page_path = out_dir / "curve.html"
    page_path.write_text(page, encoding="utf-8")
    return png, page_path
