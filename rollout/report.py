"""The report: one JSON line per session (``SessionRecord``), a summary per (env, model)
(``summarize``) with mean score and pass@k, a text table (``render_table``) and the JSONL export
(``write_jsonl``).

Counting rules: a session is *scored* when its ``eval_status`` is ``scored``; ``invalid_reward``,
``error`` and ``timeout`` are counted apart and are left out of the mean score unless
``count_unscored_as_zero`` is set. A session *passes* when it is scored and its score is 10
(``score >= 10 - 1e-9``); sessions without a score never pass. A session whose last attempt was an
infrastructure failure (``infra``) was never graded: it is left out of mean score and pass@k
(its reward is NULL, a trainer masks it), and counted apart (``infra``); ``retried`` counts
sessions that needed more than one attempt.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import textwrap
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, FiniteFloat

from rollout.outcomes import INFRA_CLASSES

SessionStatus = Literal["succeeded", "failed", "truncated", "timeout", "error", "cancelled"]

PASS_SCORE = 10.0
PASS_EPSILON = 1e-9
"""A session passes when ``score >= PASS_SCORE - PASS_EPSILON``."""

EVAL_ERROR_STATUS = "error"
EVAL_TIMEOUT_STATUS = "timeout"
EVAL_INVALID_STATUS = "invalid_reward"
EVAL_SCORED_STATUS = "scored"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate for one case: the probability that at least one of ``k`` samples
    drawn without replacement from ``n`` samples, ``c`` of which pass, passes.

    Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code"
    (arXiv:2107.03374), eq. 1: ``pass@k = 1 - C(n-c, k) / C(n, k)``, computed here in the
    numerically stable product form of the paper's Figure 3:
    ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``; it is exactly 1.0 when ``n - c < k``.

    Args:
        n: samples of the case (>= 1). c: passing samples (0 <= c <= n). k: 1 <= k <= n.

    Returns:
        A float in [0, 1].

    Raises:
        ValueError: a non-integer (bools included) argument, ``n < 1``, ``c`` outside 0..n,
            ``k < 1`` or ``k > n``.
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"pass_at_k: {name} must be an int, got {type(value).__name__}")
    if n < 1:
        raise ValueError(f"pass_at_k: n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must be in 0..n={n}, got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in 1..n={n}, got {k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


class UsageTotals(BaseModel):
    """Token counts summed over a session's steps (steps with unknown counts add 0)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class AttemptRecord(BaseModel):
    """One attempt of a session in the JSONL: number (from 1), runtime status, ``outcome`` (a task
    outcome or an infrastructure class, ``rollout.outcomes``), ``infra``, reason, steps recorded
    and the session id they are kept under, the backoff before the next attempt (seconds, None
    for the last), duration (seconds) and UTC ISO times."""

    attempt: int
    status: str
    outcome: str
    infra: bool = False
    reason: str | None = None
    step_count: int = 0
    steps_session_id: str
    retry_in_s: FiniteFloat | None = None
    duration_s: FiniteFloat | None = None
    started_at: str | None = None
    finished_at: str | None = None


class SessionRecord(BaseModel):
    """One session, one JSON line of the launcher's ``--out`` file.

    - ``status``: the session's runtime status: succeeded | failed | truncated | timeout | error |
      cancelled.
    - ``score``: the committed reward in 0..10 (finite; NaN/inf rejected), None when not evaluated.
    - ``eval_status``: scored | invalid_reward | error | timeout | skipped, or None (evaluation
      disabled or not reached). ``reason``: the evaluator's reason; ``error``: why the runtime or
      the launcher failed (None when nothing failed).
    - ``duration_s``: session wall time in seconds (None when unknown).
    - ``usage``: token sums over the steps, None when no step reported usage.
    - ``step_count``: number of steps; ``trajectory``: the steps as dicts, in order (the last
      attempt's).
    - ``sandbox``: how the runtime ran: ``bwrap`` (isolated) or ``none`` (no isolation), None when
      unknown (the runtime never ran).
    - ``outcome``: how the last attempt ended (None for records made by an older version);
      ``attempts``: every attempt, in order; ``retried``: more than one attempt.
    - ``harness``: the harness that ran the session (None: the env's own runtime);
      ``harness_exit``: its CLI's exit status and ``answer``: its parsed answer file (None when
      absent or not JSON, and for sessions run by the env's own runtime). ``usage`` is always
      the gateway's count of the recorded steps, never the harness's own estimate.
    """

    session_id: str
    job_id: str
    env_name: str
    case_id: str
    group_id: str
    model: str
    sample_index: int
    status: SessionStatus
    score: FiniteFloat | None = None
    eval_status: str | None = None
    reason: str | None = None
    error: str | None = None
    duration_s: FiniteFloat | None = None
    usage: UsageTotals | None = None
    step_count: int = 0
    sandbox: str | None = None
    outcome: str | None = None
    retried: bool = False
    harness: str | None = None
    harness_exit: int | None = None
    answer: Any = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    trajectory: list[dict[str, Any]] = Field(default_factory=list)


class SummaryRow(BaseModel):
    """Summary of the sessions of one (env_name, harness, model); ``harness`` None: the env's own
    runtime.

    Counts: ``sessions``; ``cases`` (distinct case_id); evaluation outcomes ``scored``,
    ``invalid``, ``eval_error``, ``eval_timeout`` and ``unevaluated`` (skipped or no eval_status);
    runtime outcomes ``runtime_failed`` (the runtime reported ``failed``: the agent did not finish
    its task), ``runtime_errors`` (status error: the launcher could not run the session) and
    ``runtime_timeouts`` (status timeout); ``retried`` (sessions with more than one attempt) and
    ``infra`` (sessions whose last attempt was an infrastructure failure: not graded, left out of
    the mean score and pass@k).

    Scores (0..10): ``mean_score`` over scored sessions (or over all sessions with unscored ones as
    0 when ``count_unscored_as_zero``), None when there is nothing to average.

    Pass rates (0..1, Chen et al. 2021 estimator per case, averaged over cases; None when no
    session of the row was evaluated, since nothing can pass): ``pass_at_1`` over all cases; ``pass_at_k`` for ``k`` over the ``pass_at_k_cases`` cases that have at least
    ``k`` samples (None when no case has). ``mean_duration_s``: over sessions with a duration, in
    seconds (None when none has one).
    """

    env_name: str
    model: str
    sessions: int
    cases: int
    harness: str | None = None
    scored: int
    invalid: int
    eval_error: int
    eval_timeout: int
    unevaluated: int
    mean_score: float | None
    k: int
    pass_at_1: float | None
    pass_at_k: float | None
    pass_at_k_cases: int
    runtime_failed: int
    runtime_errors: int
    runtime_timeouts: int
    mean_duration_s: float | None
    retried: int = 0
    infra: int = 0

    @property
    def eval_error_rate(self) -> float:
        """(eval_error + eval_timeout) / sessions, 0.0 for no sessions."""
        return (self.eval_error + self.eval_timeout) / self.sessions if self.sessions else 0.0


def is_infra(record: SessionRecord) -> bool:
    """Whether the session's last attempt was an infrastructure failure (never graded)."""
    return record.outcome in INFRA_CLASSES


def _is_scored(record: SessionRecord) -> bool:
    return record.eval_status == EVAL_SCORED_STATUS and record.score is not None


def _passes(record: SessionRecord) -> bool:
    return _is_scored(record) and record.score is not None and record.score >= PASS_SCORE - PASS_EPSILON


def summarize(
    records: list[SessionRecord], *, k: int | None = None, count_unscored_as_zero: bool = False
) -> list[SummaryRow]:
    """One ``SummaryRow`` per (env_name, harness, model), sorted by env_name, harness (the env's
    own runtime first), then model.

    pass@k is computed per case (the samples with the same ``case_id``): ``n`` = samples of the
    case, ``c`` = passing samples (scored and score == 10, within 1e-9), then averaged over the
    cases. ``k`` defaults, per row, to the smallest number of samples of any case in that row (the
    group size); with an explicit ``k``, cases with fewer than ``k`` samples are left out of pass@k
    (``pass_at_k_cases`` tells how many were used). pass@1 is always computed over all cases.

    Raises:
        ValueError: ``k`` given and < 1.
    """
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"summarize: k must be an int >= 1, got {k!r}")
    groups: dict[tuple[str, str, str], list[SessionRecord]] = defaultdict(list)
    for record in records:
        groups[(record.env_name, record.harness or "", record.model)].append(record)

    rows: list[SummaryRow] = []
    for (env_name, harness, model), all_recs in sorted(groups.items()):
        recs = [r for r in all_recs if not is_infra(r)]  # masked: never graded
        by_case: dict[str, list[SessionRecord]] = defaultdict(list)
        for r in recs:
            by_case[r.case_id].append(r)
        case_counts = [(len(rs), sum(1 for r in rs if _passes(r))) for rs in by_case.values()]
        row_k = k if k is not None else min((n for n, _ in case_counts), default=1)
        eligible = [(n, c) for n, c in case_counts if n >= row_k]
        evaluated = any(r.eval_status not in (None, "skipped") for r in recs)
        pass_k = (sum(pass_at_k(n, c, row_k) for n, c in eligible) / len(eligible)
                  if eligible and evaluated else None)
        pass_1 = (sum(pass_at_k(n, c, 1) for n, c in case_counts) / len(case_counts)
                  if evaluated and case_counts else None)

        scored = [r for r in recs if _is_scored(r)]
        if count_unscored_as_zero:
            values = [r.score if _is_scored(r) and r.score is not None else 0.0 for r in recs]
        else:
            values = [r.score for r in scored if r.score is not None]
        mean_score = math.fsum(values) / len(values) if values else None
        durations = [r.duration_s for r in all_recs if r.duration_s is not None]

        rows.append(
            SummaryRow(
                env_name=env_name,
                harness=harness or None,
                model=model,
                sessions=len(all_recs),
                cases=len({r.case_id for r in all_recs}),
                scored=len(scored),
                invalid=sum(1 for r in recs if r.eval_status == EVAL_INVALID_STATUS),
                eval_error=sum(1 for r in recs if r.eval_status == EVAL_ERROR_STATUS),
                eval_timeout=sum(1 for r in recs if r.eval_status == EVAL_TIMEOUT_STATUS),
                unevaluated=sum(1 for r in recs if r.eval_status in (None, "skipped")),
                mean_score=mean_score,
                k=row_k,
                pass_at_1=pass_1,
                pass_at_k=pass_k,
                pass_at_k_cases=len(eligible),
                runtime_failed=sum(1 for r in all_recs if r.status == "failed"),
                runtime_errors=sum(1 for r in all_recs if r.status == "error"),
                runtime_timeouts=sum(1 for r in all_recs if r.status == "timeout"),
                mean_duration_s=math.fsum(durations) / len(durations) if durations else None,
                retried=sum(1 for r in all_recs if r.retried),
                infra=sum(1 for r in all_recs if is_infra(r)),
            )
        )
    return rows


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


TABLE_WIDTH = 100
OWN_RUNTIME = "(env)"
"""What the harness column shows for sessions run by the env's own runtime."""
NAME_MIN = 10
TABLE_LEGEND = ("score: mean of scored sessions (0-10); pass@k: a session passes at score 10; failed: the "
                "runtime reported failed; time_s: mean session wall time (s)")
PROBLEM_LEGEND = {"inval": "invalid reward", "ev_err": "evaluator error", "ev_t/o": "evaluator timeout",
                  "rt_err": "runtime error", "rt_t/o": "runtime timeout", "retried": "more than one attempt",
                  "infra": "infrastructure failure, not graded"}
"""The abbreviations of a row's ``problems:`` line, in display order."""


def _cut(name: str, width: int) -> str:
    """``name`` cut to ``width`` characters by replacing its middle with ``..`` (the start, e.g.
    an org or family, and the end, e.g. a size or variant, are what tell names apart)."""
    if len(name) <= width:
        return name
    head = (width - 2 + 1) // 2
    return name[:head] + ".." + name[len(name) - (width - 2 - head):]


def _problems(r: SummaryRow) -> list[str]:
    counts = (r.invalid, r.eval_error, r.eval_timeout, r.runtime_errors, r.runtime_timeouts, r.retried, r.infra)
    return [f"{name} {n}" for name, n in zip(PROBLEM_LEGEND, counts, strict=True) if n]


def _wrap(text: str, width: int, indent: str = "  ") -> list[str]:
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False)


def render_table(rows: list[SummaryRow], width: int = TABLE_WIDTH) -> str:
    """A fixed-width plain-text table of ``rows`` that fits ``width`` columns (100 by default; names
    stop shrinking at ``NAME_MIN``, so under about 80 columns rows may not fit):
    a header line, a rule, one line per row, then a legend. The rarely non-zero counts (invalid
    reward, evaluator and runtime errors and timeouts, retried, infra) are folded into an indented
    ``problems:`` line under their row, listing only the non-zero ones. When the names do not fit,
    the longer of env and model is cut in the middle (``..``, down to ``NAME_MIN``) and the legend
    gives the full name (all of them when two cut alike). ``-`` stands for a missing value; scores have 2 decimals, pass rates 3,
    durations 1 (seconds). Returns ``"(no sessions)"`` for no rows. No trailing newline."""
    if not rows:
        return "(no sessions)"
    with_harness = any(r.harness is not None for r in rows)
    names = 3 if with_harness else 2  # the name columns come first: env, [harness,] model
    headers = ["env", *(["harness"] if with_harness else []), "model", "sess", "scored", "score", "pass@1",
               "pass@k", "k", "failed", "time_s"]
    body = [
        [r.env_name, *([r.harness or OWN_RUNTIME] if with_harness else []), r.model, str(r.sessions), str(r.scored),
         _fmt(r.mean_score, 2), _fmt(r.pass_at_1, 3), _fmt(r.pass_at_k, 3), str(r.k), str(r.runtime_failed),
         _fmt(r.mean_duration_s, 1)]
        for r in rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in body)) for i, h in enumerate(headers)]
    sep = 2 * (len(headers) - 1)
    while sum(widths) + sep > width and max(widths[:names]) > NAME_MIN:
        widest = max(reversed(range(names)), key=lambda i: widths[i])  # a tie cuts the later column
        widths[widest] -= 1
    cut: dict[str, list[str]] = {}  # one cut name may stand for several full names
    for line in body:
        for i in range(names):
            short = _cut(line[i], widths[i])
            if short != line[i] and line[i] not in cut.setdefault(short, []):
                cut[short].append(line[i])
            line[i] = short

    def fmt_line(cells: list[str]) -> str:
        parts = [c.ljust(w) if i < names else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(parts).rstrip()

    lines = [fmt_line(headers), "  ".join("-" * w for w in widths)]
    shown: set[str] = set()
    for line, row in zip(body, rows, strict=True):
        lines.append(fmt_line(line))
        if problems := _problems(row):
            shown.update(p.split()[0] for p in problems)
            lines.extend(_wrap("  problems: " + ", ".join(problems), width, indent="    "))
    legend = TABLE_LEGEND
    if any(r.harness is None for r in rows) and with_harness:
        legend += f"; harness {OWN_RUNTIME}: the env's own runtime"
    if shown:
        legend += "; problems: " + ", ".join(f"{k} = {v}" for k, v in PROBLEM_LEGEND.items() if k in shown)
    lines.extend(_wrap(legend, width))
    for short, full in cut.items():
        lines.extend(_wrap(f"cut name: {short} = {' or '.join(full)}", width))
    return "\n".join(lines)


def table_footer(records: Iterable[SessionRecord]) -> str | None:
    """The warning printed under the table when sessions ran without the sandbox (``sandbox:
    none``), naming their envs; None when every session ran sandboxed (or did not run)."""
    bare: dict[str, int] = defaultdict(int)
    for r in records:
        if r.sandbox == "none":
            bare[r.env_name] += 1
    if not bare:
        return None
    envs = ", ".join(f"{name} ({n})" for name, n in sorted(bare.items()))
    return (f"warning: {sum(bare.values())} sessions ran WITHOUT a sandbox (--sandbox none or the env's "
            f"runtime.sandbox: none): {envs}. Their runtimes could read the host's files and environment and "
            "reach its network; their scores may not be trustworthy as rewards.")


def write_jsonl(path: Path, records: Iterable[SessionRecord]) -> int:
    """Write one strict-JSON line per record to ``path`` and return the number of lines.

    Parent directories are created. The file is written to a temporary file in the same directory,
    fsynced, then moved over ``path`` with ``os.replace``, so readers see the old file or the whole
    new one. NaN/inf anywhere (score, trajectory, ...) is never emitted: ``json.dumps`` runs with
    ``allow_nan=False``.

    Raises:
        ValueError: a record holds NaN or +-inf (the target file is left untouched).
        TypeError: a record holds a value that is not JSON-serializable.
        OSError: the file cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    count = 0
    try:
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600; the export is an ordinary file
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for record in records:
                line = json.dumps(record.model_dump(mode="python"), allow_nan=False, ensure_ascii=False)
                fh.write(line)
                fh.write("\n")
                count += 1
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    return count
