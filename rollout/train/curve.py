"""The training curve of ``launcher.py train``: a PNG (matplotlib when installed, else a plain
raster drawn here: axes, the pass rate in blue, the mean reward / 10 in orange, no text) and an
HTML page (plotly, its bundle inline, so it opens offline) with the per-step table and the
held-out evaluation before and after."""

from __future__ import annotations

import html
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rollout.train.trl_rollout import StepStats

__all__ = ["write_curve"]

_W, _H, _M = 640, 360, 30
_BLUE, _ORANGE, _GREY = (31, 119, 180), (255, 127, 14), (120, 120, 120)


def _png(pixels: np.ndarray) -> bytes:
    h, w, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _line(img: np.ndarray, p: tuple[float, float], q: tuple[float, float], color: tuple[int, int, int]) -> None:
    n = int(max(abs(q[0] - p[0]), abs(q[1] - p[1]))) + 1
    xs = np.linspace(p[0], q[0], n).round().astype(int)
    ys = np.linspace(p[1], q[1], n).round().astype(int)
    for dx in (0, 1):
        for dy in (0, 1):
            img[np.clip(ys + dy, 0, _H - 1), np.clip(xs + dx, 0, _W - 1)] = color


def raster_png(series: Sequence[tuple[Sequence[float], tuple[int, int, int]]]) -> bytes:
    """A PNG of each series (values 0..1 over the steps) as a polyline on plain axes."""
    img = np.full((_H, _W, 3), 255, dtype=np.uint8)
    _line(img, (_M, _H - _M), (_W - _M, _H - _M), _GREY)
    _line(img, (_M, _M), (_M, _H - _M), _GREY)
    for values, color in series:
        n = len(values)
        pts = [(_M + (_W - 2 * _M) * (i / max(n - 1, 1)), (_H - _M) - (_H - 2 * _M) * min(max(v, 0.0), 1.0))
               for i, v in enumerate(values)]
        for a, b in zip(pts, pts[1:], strict=False):
            _line(img, a, b, color)
        if n == 1:
            _line(img, pts[0], pts[0], color)
    return _png(img)


def write_curve(history: Sequence[StepStats], evals: dict[str, tuple[float, float, int]], out_dir: Path,
                max_score: float = 10.0) -> tuple[Path, Path]:
    """Write ``curve.png`` and ``curve.html`` into ``out_dir``; ``evals``: name -> (mean reward,
    pass rate, samples). Returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = list(range(1, len(history) + 1))
    passes = [h.pass_rate for h in history]
    rewards = [h.mean_reward for h in history]
    png = out_dir / "curve.png"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.plot(steps, passes, label="pass rate")
        ax.plot(steps, [r / max_score for r in rewards], label=f"mean reward / {max_score:g}")
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
        ax.legend()
        fig.savefig(png, dpi=100)
        plt.close(fig)
    except ImportError:
        png.write_bytes(raster_png([([r / max_score for r in rewards], _ORANGE), (passes, _BLUE)]))  # pass rate on top
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_trace(go.Scatter(x=steps, y=passes, mode="lines+markers", name="pass rate"))
    fig.add_trace(go.Scatter(x=steps, y=rewards, mode="lines+markers", name="mean reward", yaxis="y2"))
    fig.update_layout(title="GRPO training", xaxis_title="step", yaxis={"title": "pass rate", "range": [0, 1]},
                      yaxis2={"title": "mean reward", "overlaying": "y", "side": "right",
                              "range": [0, max_score]})
    head = ("<tr><th>step</th><th>mean reward</th><th>pass rate</th><th>disagreeing groups</th>"
            "<th>tokens trained</th><th>dropped</th><th>seconds</th></tr>")
    rows = "".join(f"<tr><td>{i}</td><td>{h.mean_reward:.2f}</td><td>{h.pass_rate:.2f}</td>"
                   f"<td>{h.disagreeing_groups}/{h.groups}</td><td>{h.tokens_trained}</td><td>{h.dropped}</td>"
                   f"<td>{h.seconds:.1f}</td></tr>" for i, h in enumerate(history, 1))
    ev = "".join(f"<tr><td>{html.escape(name)}</td><td>{m:.2f}</td><td>{p:.2f}</td><td>{n}</td></tr>"
                 for name, (m, p, n) in evals.items())
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>GRPO training</title></head><body>"
            + fig.to_html(full_html=False, include_plotlyjs=True)
            + "<h2>Held-out evaluation</h2><table border=1><tr><th>when</th><th>mean reward</th>"
            + f"<th>pass rate</th><th>samples</th></tr>{ev}</table>"
            + f"<h2>Steps</h2><table border=1>{head}{rows}</table></body></html>")
    page_path = out_dir / "curve.html"
    page_path.write_text(page, encoding="utf-8")
    return png, page_path
