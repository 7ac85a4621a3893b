"""The HTML report of one job: the summary table, score histograms, pass@k over k,
duration/token/latency distributions and the evaluator's failure reasons, linking each example
session into the viewer. A report file loads plotly's offline bundle from a file written once
beside it (``plotly-<version>.min.js``; no network), the viewer's page from the viewer.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import plotly
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from rollout.results.report import output_path_problem
from rollout.servers.viewer.db import ViewerError, open_queries
from rollout.servers.viewer.render import templates
from rollout.servers.viewer.stats import pass_curves, records_of, summary
from store import COUNTED_EVAL_STATUSES
from store.queries import ViewerQueries

DEFAULT_VIEWER_URL = "http://127.0.0.1:8765"
VIEWER_PLOTLY_SRC = "/static/plotly.min.js"
"""Where the viewer serves plotly.js (``rollout.servers.viewer.app``)."""
_CONFIG = {"displaylogo": False, "responsive": True}


@functools.cache
def plotly_js() -> str:
    """plotly.js from the plotly package (the offline bundle; no CDN)."""
    return str(get_plotlyjs())


def plotly_file_name() -> str:
    """The name of the plotly.js file beside the report files: ``plotly-<version>.min.js`` (the
    version of the installed plotly package, so reports of two versions never share a wrong one)."""
    return f"plotly-{plotly.__version__}.min.js"


def write_plotly_beside(folder: Path) -> Path:
    """Write plotly.js into ``folder`` as ``plotly_file_name()`` unless it is there with the same
    size (written atomically: a reader sees no half file); returns its path."""
    js = plotly_js().encode("utf-8")
    path = folder / plotly_file_name()
    if path.is_file() and path.stat().st_size == len(js):
        return path
    _write_atomic(path, js)
    return path


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _label(env: str, model: str) -> str:
    return f"{env} · {model}"


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(
        title=title,
        xaxis_title=x,
        yaxis_title=y,
        template="plotly_white",
        height=360,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def _div(fig: go.Figure, div_id: str) -> str:
    return str(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=_CONFIG))


def figures(
    rows: list[dict[str, Any]],
    curves: dict[tuple[str, str], list[tuple[int, float]]],
    steps: list[dict[str, Any]],
    reasons: list[dict[str, Any]],
) -> dict[str, str]:
    """The report's plots as HTML divs, by name (a plot without data is left out)."""
    out: dict[str, str] = {}
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_key[(r["env_name"], r["llm_model"])].append(r)

    hist = go.Figure()
    for (env, model), rs in sorted(by_key.items()):
        scores = [
            r["reward"] for r in rs if r["eval_status"] in COUNTED_EVAL_STATUSES and r["reward"] is not None
        ]
        if scores:
            hist.add_trace(
                go.Histogram(
                    x=scores,
                    name=_label(env, model),
                    xbins={"start": -0.5, "end": 10.5, "size": 1},
                    opacity=0.75,
                )
            )
    if hist.data:
        hist.update_layout(barmode="group", xaxis={"range": [-0.5, 10.5], "dtick": 1})
        out["scores"] = _div(
            _layout(hist, "Score histogram (graded sessions, a grading failure as 0)", "score", "sessions"),
            "plot-scores",
        )

    if curves:
        fig = go.Figure()
        for (env, model), points in curves.items():
            fig.add_trace(
                go.Scatter(
                    x=[k for k, _ in points],
                    y=[v for _, v in points],
                    mode="lines+markers",
                    name=_label(env, model),
                )
            )
        kmax = max(len(points) for points in curves.values())
        fig.update_layout(yaxis={"range": [-0.02, 1.02]}, xaxis={"dtick": 1, "range": [0.5, kmax + 0.5]})
        out["pass_at_k"] = _div(
            _layout(fig, "pass@k over k (unbiased estimator, mean over cases)", "k", "pass@k"), "plot-passk"
        )

    for name, key, title, axis in (
        ("durations", "duration_s", "Session duration", "seconds"),
        ("tokens", "total_tokens", "Tokens per session", "total tokens"),
    ):
        fig = go.Figure()
        for (env, model), rs in sorted(by_key.items()):
            values = [r[key] for r in rs if r.get(key) is not None]
            if values:
                fig.add_trace(
                    go.Box(y=values, name=_label(env, model), boxpoints="all", jitter=0.4, pointpos=0)
                )
        if fig.data:
            out[name] = _div(_layout(fig, title, "", axis), f"plot-{name}")

    fig = go.Figure()
    by_env_steps: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for s in steps:
        by_env_steps[(s["env_name"] or "?", s["llm_model"])].append(s)
    for (env, model), ss in sorted(by_env_steps.items()):
        lat = [s["latency_ms"] for s in ss if s["latency_ms"] is not None]
        ttft = [s["ttft_ms"] for s in ss if s["ttft_ms"] is not None]
        if lat:
            fig.add_trace(go.Box(y=lat, name=f"{_label(env, model)}: latency"))
        if ttft:
            fig.add_trace(go.Box(y=ttft, name=f"{_label(env, model)}: TTFT"))
    if fig.data:
        out["latency"] = _div(
            _layout(fig, "Per-step latency and time to first token", "", "milliseconds"), "plot-latency"
        )

    if reasons:
        top = list(reversed(reasons[:15]))
        fig = go.Figure(
            go.Bar(
                x=[r["n"] for r in top],
                orientation="h",
                y=[f"{r['env_name']}: {_cut(r['reason'], 60)}" for r in top],
            )
        )
        _layout(fig, "Why sessions did not pass (most frequent reasons)", "sessions", "")
        fig.update_layout(height=max(300, 40 + 28 * len(top)), margin={"l": 380})
        out["reasons"] = _div(fig, "plot-reasons")
    return out


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


async def build_report(
    queries: ViewerQueries,
    job_id: str,
    *,
    viewer_url: str = DEFAULT_VIEWER_URL,
    inline_js: bool = True,
    plotly_src: str = VIEWER_PLOTLY_SRC,
    sections: Sequence[str] = (),
    session_href: Callable[[str], str] | None = None,
    group_href: Callable[[str], str] | None = None,
    bundle: Sequence[dict[str, Any]] = (),
) -> str:
    """The report of ``job_id`` as one HTML document. ``viewer_url`` prefixes the links into the
    viewer ("" for links relative to a viewer serving the page); ``inline_js`` inlines plotly.js
    (a self-contained document, ~4.8 MB) instead of loading it from ``plotly_src`` (a URL, or a
    path relative to the document). ``sections``: HTML fragments, already escaped, put before the
    summary (the audit's). ``session_href``: a session's link (default: the viewer's page);
    ``group_href``: a group's link in the bundle's list (None: no link); ``bundle``: the rows of every session, listed at the end (a bundle's index). Raises
    ViewerError for an unknown job."""
    job = await queries.job(job_id)
    if job is None:
        raise ViewerError(f"no job {job_id!r} in this store")
    rows = await queries.finished_sessions(job_id)
    records = records_of(await queries.summary_rows(job_id))
    reasons = await queries.failure_reasons(job_id, 50)
    plots = figures(rows, pass_curves(records), await queries.step_timings(job_id), reasons)
    css = (Path(__file__).resolve().parent / "static" / "viewer.css").read_text(encoding="utf-8")
    viewer = viewer_url.rstrip("/")
    return (
        templates()
        .get_template("report.html")
        .render(
            session_href=session_href or (lambda sid: f"{viewer}/sessions/{sid}"),
            group_href=group_href,
            bundle=list(bundle),
            job=job,
            summary=summary(records),
            plots=plots,
            reasons=reasons,
            viewer=viewer_url.rstrip("/"),
            css=css,
            plotly_js=plotly_js() if inline_js else None,
            plotly_src=plotly_src,
            worst=await queries.worst_sessions(job_id, 10),
            generated=datetime.now(UTC),
            sections=list(sections),
        )
    )


async def write_report(
    db_url: str,
    job_id: str,
    out: Path,
    *,
    viewer_url: str = DEFAULT_VIEWER_URL,
    self_contained: bool = False,
    sections: Sequence[str] = (),
) -> Path:
    """Write the report of ``job_id`` in the store at ``db_url`` to ``out`` (atomically: a reader
    sees the old file or the whole new one), and plotly.js beside it once (``write_plotly_beside``:
    the report loads it by a relative path, so the folder works offline and can be moved whole);
    ``self_contained``: plotly.js inlined instead, nothing beside; ``sections``: as ``build_report``.
    Raises ViewerError (the store
    cannot be read, or has no such job; or ``out`` cannot be a file: ``output_path_problem``)."""
    if (problem := output_path_problem(Path(out), "report.html")) is not None:
        raise ViewerError(f"cannot write the report: {problem}")
    engine, queries = await open_queries(db_url)
    try:
        html = await build_report(
            queries,
            job_id,
            viewer_url=viewer_url,
            inline_js=self_contained,
            plotly_src=plotly_file_name(),
            sections=sections,
        )
    finally:
        await engine.dispose()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not self_contained:
        write_plotly_beside(out.parent)
    _write_atomic(out, html.encode("utf-8"))
    return out
