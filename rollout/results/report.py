"""The report: one JSON line per session (``SessionRecord``), a summary per (env, harness, model)
(``summarize``: mean score, pass@k, standard errors) and its text table (``render_table``). What is
counted, left out and why: docs/output.md and docs/trust-model.md ("Failure attribution")."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, FiniteFloat, model_validator

from rollout.contract.protocol import model_from_json
from rollout.core.logs import plural
from rollout.core.outcomes import INFRA_CLASSES
from rollout.results.estimates import Spread
from rollout.results.session_fields import SessionFields
from store import COUNTED_EVAL_STATUSES, GRADER_BROKEN, FinalStatus
from wire.text import json_text

PASS_SCORE = 10.0
PASS_EPSILON = 1e-9
"""A session passes when ``score >= PASS_SCORE - PASS_EPSILON``."""

EVAL_ERROR_STATUS = "error"
EVAL_TIMEOUT_STATUS = "timeout"
EVAL_INVALID_STATUS = "invalid_reward"
EVAL_SCORED_STATUS = "scored"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one case of ``n`` samples, ``c`` passing (Chen et al. 2021, arXiv:2107.03374,
    eq. 1, in the stable product form of its Figure 3); exactly 1.0 when ``n - c < k``. ValueError
    for a non-integer (bools included), ``n < 1``, ``c`` outside 0..n or ``k`` outside 1..n."""
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


class AttemptRecord(BaseModel):
    """One attempt of a session in the JSONL (docs/output.md): number, runtime status, ``outcome``
    (``rollout.core.outcomes``), ``infra``, reason, steps and where they are kept, backoff, times."""

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


class SessionRecord(SessionFields):
    """One session, one JSON line of the launcher's ``--out`` file: the shared fields
    (:class:`SessionFields`, the same as ``launcher.py export`` writes) and the launcher's own
    (trajectory, sandbox, grader isolation, attempts, harness, its exit and answer); every field
    is in docs/output.md. ``reason`` repeats ``eval_reason`` for older readers."""

    job_id: str
    env_name: str
    case_id: str
    group_id: str
    model: str
    sample_index: int
    status: FinalStatus
    reason: str | None = None
    sandbox: str | None = None
    grader_isolation: str | None = None
    verifier_container: str | None = None
    retried: bool = False
    metrics: dict[str, Any] | None = None
    harness_exit: int | None = None
    answer: Any = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    trajectory: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _reward_of_score(self) -> SessionRecord:
        """``reward`` is ``score`` / 10 whatever was given (a record read back from an older file
        gets it too), ``eval_reason`` and ``reason`` the same text."""
        self.reward = None if self.score is None else self.score / 10
        if self.eval_reason is None:
            self.eval_reason = self.reason
        self.reason = self.eval_reason
        return self


class SummaryRow(BaseModel):
    """Summary of the sessions of one (env_name, harness, model); ``harness`` None: the env's own
    runtime. Counts of evaluation and runtime outcomes, ``retried``, ``infra`` and
    ``grader_broken`` (both left out of the mean and pass@k); ``mean_score`` (0..10, grading
    failures as their committed 0) and pass@1 / pass@k (0..1, per case, averaged over cases) with
    standard errors clustered by case; None where there is nothing to average. docs/output.md
    says each column and estimator."""

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
    score_stderr: float | None = None
    pass_at_1_stderr: float | None = None
    pass_at_k: float | None
    pass_at_k_cases: int
    runtime_failed: int
    runtime_truncated: int = 0
    runtime_errors: int
    runtime_timeouts: int
    mean_duration_s: float | None
    retried: int = 0
    infra: int = 0
    grader_broken: int = 0


def is_infra(record: SessionRecord) -> bool:
    """Whether the session's last attempt was an infrastructure failure (never graded)."""
    return record.outcome in INFRA_CLASSES


def is_runtime_error(record: SessionRecord) -> bool:
    """Whether the runtime itself ended in error (``rt_err``): an outage counts as infra only."""
    return record.status == "error" and not is_infra(record)


def _is_scored(record: SessionRecord) -> bool:
    return record.eval_status == EVAL_SCORED_STATUS and record.score is not None


def _passes(record: SessionRecord) -> bool:
    return _is_scored(record) and record.score is not None and record.score >= PASS_SCORE - PASS_EPSILON


def summarize(records: Iterable[SessionRecord], *, k: int | None = None) -> list[SummaryRow]:
    """One ``SummaryRow`` per (env_name, harness, model), sorted by env, harness (the env's own runtime
    first), model. pass@k per case, averaged over cases; ``k`` defaults per row to the smallest
    sample count of its cases, and an explicit ``k`` leaves out cases with fewer samples
    (``pass_at_k_cases``). ValueError for ``k < 1``."""
    return ReportTotals.of(records).summary(k=k)


class _RowTotals:
    """The running counts of one (env, harness, model): what ``SummaryRow`` is computed from.
    Sums are exact (``Fraction``), so a mean equals ``math.fsum(values) / len(values)``."""

    def __init__(self) -> None:
        self.sessions = self.graded = self.scored = self.invalid = self.eval_error = self.eval_timeout = 0
        self.unevaluated = self.runtime_failed = self.runtime_truncated = self.runtime_errors = 0
        self.runtime_timeouts = self.grader_broken = self.counted = 0
        self.retried = self.infra = self.durations = self.cases = 0
        self.evaluated = False
        self.score_sum = Fraction(0)
        self.duration_sum = Fraction(0)
        self.open_cases: dict[
            str, list[Any]
        ] = {}  # case id -> [samples, passing, counted, score sum], graded
        self.case_scores = Spread()  # the mean score of each folded case with a counted session
        self.open_ids: set[str] = set()  # case ids of every session not folded yet
        self.pairs: Counter[tuple[int, int]] = Counter()  # (samples, passing) -> cases folded

    def add(self, r: SessionRecord) -> None:
        self.sessions += 1
        self.open_ids.add(r.case_id)
        if r.duration_s is not None:
            self.durations += 1
            self.duration_sum += Fraction(r.duration_s)
        self.runtime_failed += r.status == "failed"
        self.runtime_truncated += r.status == "truncated"
        self.runtime_errors += is_runtime_error(r)
        self.runtime_timeouts += r.status == "timeout"
        self.retried += r.retried
        if is_infra(r):  # masked: never graded
            self.infra += 1
            return
        if r.eval_status == GRADER_BROKEN:  # masked: the grader fails without the agent
            self.grader_broken += 1
            self.evaluated = True
            return
        self.graded += 1
        counts = self.open_cases.setdefault(r.case_id, [0, 0, 0, Fraction(0)])
        counts[0] += 1
        counts[1] += _passes(r)
        self.scored += _is_scored(r)
        if r.eval_status in COUNTED_EVAL_STATUSES and r.score is not None:
            self.counted += 1
            self.score_sum += Fraction(r.score)
            counts[2] += 1
            counts[3] += Fraction(r.score)
        self.invalid += r.eval_status == EVAL_INVALID_STATUS
        self.eval_error += r.eval_status == EVAL_ERROR_STATUS
        self.eval_timeout += r.eval_status == EVAL_TIMEOUT_STATUS
        if r.eval_status in (None, "skipped"):
            self.unevaluated += 1
        else:
            self.evaluated = True

    def fold(self) -> None:
        """Keep only the (samples, passing) counts of the cases seen so far: none of them may
        come again."""
        self.cases += len(self.open_ids)
        self.pairs.update((n, c) for n, c, _, _ in self.open_cases.values())
        for _, _, counted, total in self.open_cases.values():
            if counted:
                self.case_scores.add(float(total / counted))
        self.open_ids.clear()
        self.open_cases.clear()

    def row(self, key: tuple[str, str, str], k: int | None) -> SummaryRow:
        self.fold()
        env_name, harness, model = key
        n_cases = sum(self.pairs.values())
        row_k = k if k is not None else min((n for n, _ in self.pairs), default=1)
        eligible = [(n, c, m) for (n, c), m in self.pairs.items() if n >= row_k]
        n_eligible = sum(m for _, _, m in eligible)
        pass_k = (
            math.fsum(pass_at_k(n, c, row_k) * m for n, c, m in eligible) / n_eligible
            if eligible and self.evaluated
            else None
        )
        pass_1 = (
            math.fsum(pass_at_k(n, c, 1) * m for (n, c), m in self.pairs.items()) / n_cases
            if self.evaluated and n_cases
            else None
        )
        passing = Spread()
        for (n, c), m in sorted(self.pairs.items()):
            passing.add(c / n, m)
        return SummaryRow(
            env_name=env_name,
            harness=harness or None,
            model=model,
            sessions=self.sessions,
            cases=self.cases,
            scored=self.scored,
            invalid=self.invalid,
            eval_error=self.eval_error,
            eval_timeout=self.eval_timeout,
            unevaluated=self.unevaluated,
            mean_score=float(self.score_sum) / self.counted if self.counted else None,
            k=row_k,
            pass_at_1=pass_1,
            pass_at_k=pass_k,
            pass_at_k_cases=n_eligible,
            score_stderr=self.case_scores.stderr if self.counted else None,
            pass_at_1_stderr=passing.stderr if pass_1 is not None else None,
            runtime_failed=self.runtime_failed,
            runtime_truncated=self.runtime_truncated,
            runtime_errors=self.runtime_errors,
            runtime_timeouts=self.runtime_timeouts,
            mean_duration_s=float(self.duration_sum) / self.durations if self.durations else None,
            retried=self.retried,
            infra=self.infra,
            grader_broken=self.grader_broken,
        )


class ReportTotals:
    """What the report needs of a job's records, counted as they come: the summary rows, the sessions
    run without a sandbox, infrastructure failures, launcher errors and (status, eval_status)
    counts. Records streamed in case order: call ``fold_cases`` after each case (flat memory)."""

    def __init__(self) -> None:
        self.sessions = 0
        self.infra_attempts = 0
        self.launcher_errors = 0
        self.bare: dict[str, int] = defaultdict(int)
        self.trusted: dict[str, int] = defaultdict(int)
        self.same: dict[str, int] = defaultdict(int)
        self.by_status: Counter[tuple[str, str | None]] = Counter()
        self.oracle_short: dict[str, list[str]] = defaultdict(list)  # env -> cases its oracle failed
        self._rows: dict[tuple[str, str, str], _RowTotals] = {}

    @classmethod
    def of(cls, records: Iterable[SessionRecord]) -> ReportTotals:
        """The totals of ``records``."""
        totals = cls()
        for r in records:
            totals.add(r)
        return totals

    def add(self, record: SessionRecord) -> None:
        """Count one finished session's record."""
        self.sessions += 1
        key = (record.env_name, record.harness or "", record.model)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = _RowTotals()
        row.add(record)
        self.infra_attempts += sum(1 for a in record.attempts if a.infra)
        self.launcher_errors += record.outcome == "launcher_error"
        if record.sandbox == "none":
            self.bare[record.env_name] += 1
        if record.grader_isolation == "none":
            self.trusted[record.env_name] += 1
        if record.verifier_container == "same":
            self.same[record.env_name] += 1
        self.by_status[(record.status, record.eval_status)] += 1
        graded = record.eval_status in ("scored", "error", "timeout", "invalid_reward")
        if record.harness == "oracle" and graded and (record.score is None or record.score < 10):
            self.oracle_short[record.env_name].append(record.case_id)

    def fold_cases(self) -> None:
        """Every case seen so far is complete: keep only its counts."""
        for row in self._rows.values():
            row.fold()

    @property
    def grader_broken(self) -> dict[str, int]:
        """Sessions that met a broken grader, by env (none: empty)."""
        out: Counter[str] = Counter()
        for (env, _, _), r in self._rows.items():
            out[env] += r.grader_broken
        return {e: n for e, n in sorted(out.items()) if n}

    @property
    def lost(self) -> int:
        """Sessions whose last attempt was an infrastructure failure (never graded)."""
        return sum(r.infra for r in self._rows.values())

    def count(self, statuses: Iterable[str] = (), eval_statuses: Iterable[str] = ()) -> int:
        """Sessions whose status is one of ``statuses`` or whose eval_status is one of ``eval_statuses``."""
        st, ev = set(statuses), set(eval_statuses)
        return sum(n for (s, e), n in self.by_status.items() if s in st or e in ev)

    def summary(self, *, k: int | None = None) -> list[SummaryRow]:
        """The rows ``summarize`` gives for the records added (it folds every case)."""
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"summarize: k must be an int >= 1, got {k!r}")
        return [row.row(key, k) for key, row in sorted(self._rows.items())]

    def footer(self) -> str | None:
        """``table_footer`` of the records added."""
        lines = [_footer(self.bare, self.trusted, self.same), _oracle_footer(self.oracle_short)]
        return "\n".join(x for x in lines if x) or None


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _fmt_se(value: float | None, se: float | None, digits: int) -> str:
    """``value±se`` (``value`` alone when there is no standard error)."""
    return _fmt(value, digits) if value is None or se is None else f"{value:.{digits}f}±{se:.{digits}f}"


TABLE_WIDTH = 100
OWN_RUNTIME = "(env)"
"""What the harness column shows for sessions run by the env's own runtime."""
NAME_MIN = 10
TABLE_LEGEND = (
    "score: mean of graded sessions (0-10; a grading failure the agent caused counts 0); pass@k: a session passes at score 10; "
    "±: standard error over cases (each case's mean); failed: the runtime reported failed; time_s: mean session "
    "wall time (s)"
)
PROBLEM_LEGEND = {
    "trunc": "used its whole step budget (truncated)",
    "inval": "invalid reward",
    "ev_err": "evaluator error",
    "ev_t/o": "evaluator timeout",
    "rt_err": "runtime error (the runtime's own; an outage counts as infra)",
    "rt_t/o": "runtime timeout",
    "retried": "more than one attempt",
    "infra": "infrastructure failure, not graded",
    "broken": "grader broken (failed on the untouched starting workspace too), not counted",
}
"""The abbreviations of a row's ``problems:`` line, in display order."""


def _cut(name: str, width: int) -> str:
    """``name`` cut to ``width`` characters by replacing its middle with ``..`` (the start, e.g.
    an org or family, and the end, e.g. a size or variant, are what tell names apart)."""
    if len(name) <= width:
        return name
    head = (width - 2 + 1) // 2
    return name[:head] + ".." + name[len(name) - (width - 2 - head) :]


def _problems(r: SummaryRow) -> list[str]:
    counts = (
        r.runtime_truncated,
        r.invalid,
        r.eval_error,
        r.eval_timeout,
        r.runtime_errors,
        r.runtime_timeouts,
        r.retried,
        r.infra,
        r.grader_broken,
    )
    return [f"{name} {n}" for name, n in zip(PROBLEM_LEGEND, counts, strict=True) if n]


def _wrap(text: str, width: int, indent: str = "  ") -> list[str]:
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False)


def render_table(rows: list[SummaryRow], width: int = TABLE_WIDTH) -> str:
    """A fixed-width plain-text table of ``rows`` fitting ``width`` columns: header, rule, a line per
    row (rare non-zero counts on an indented ``problems:`` line), a legend giving names cut in the
    middle; ``-`` for a missing value, ``3.33±0.41`` for a mean and its standard error.
    ``"(no sessions)"`` for no rows."""
    if not rows:
        return "(no sessions)"
    with_harness = any(r.harness is not None for r in rows)
    names = 3 if with_harness else 2  # the name columns come first: env, [harness,] model
    headers = [
        "env",
        *(["harness"] if with_harness else []),
        "model",
        "sess",
        "scored",
        "score",
        "pass@1",
        "pass@k",
        "k",
        "failed",
        "time_s",
    ]
    body = [
        [
            r.env_name,
            *([r.harness or OWN_RUNTIME] if with_harness else []),
            r.model,
            str(r.sessions),
            str(r.scored),
            _fmt_se(r.mean_score, r.score_stderr, 2),
            _fmt_se(r.pass_at_1, r.pass_at_1_stderr, 3),
            _fmt(r.pass_at_k, 3),
            str(r.k),
            str(r.runtime_failed),
            _fmt(r.mean_duration_s, 1),
        ]
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
        parts = [
            c.ljust(w) if i < names else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
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
    """The warnings printed under the table, naming their envs: sessions run without the sandbox
    (``sandbox: none``), graded in the launcher, verified in the agent's own container, and the
    cases whose oracle did not score 10; None when there is none of these."""
    return ReportTotals.of(records).footer()


def _footer(bare: dict[str, int], trusted: dict[str, int], same: dict[str, int]) -> str | None:
    said = (
        (
            bare,
            "ran WITHOUT a sandbox (--sandbox none or the env's runtime.sandbox: none)",
            " Their runtimes could read the host's files and environment and reach its network; their "
            "scores may not be trustworthy as rewards.",
        ),
        (
            trusted,
            "were graded in the launcher, not in the grader sandbox (--grader-isolation none, --sandbox "
            "none or the env's grader.isolation: none)",
            "",
        ),
        (
            same,
            "were verified in the agent's own container (dataset.same_container, --same-container)",
            " What the agent wrote anywhere in the image was under their tests, so the agent could "
            "decide their reward.",
        ),
    )
    lines = [
        f"warning: {plural(sum(counts.values()), 'session')} "
        f"{what.replace('were ', 'was ', 1) if sum(counts.values()) == 1 else what}: "
        f"{', '.join(f'{name} ({n})' for name, n in sorted(counts.items()))}.{after}"
        for counts, what, after in said
        if counts
    ]
    return "\n".join(lines) or None


def _oracle_footer(short: dict[str, list[str]]) -> str | None:
    """A line naming the cases whose reference solution (the ``oracle`` harness) did not score 10."""
    if not short:
        return None
    cases = "; ".join(
        f"{env}: {', '.join(sorted(set(ids))[:10])}{', ...' if len(set(ids)) > 10 else ''}"
        for env, ids in sorted(short.items())
    )
    n = sum(len(set(ids)) for ids in short.values())
    return (
        f"warning: the oracle (each task's reference solution) scored below 10 on {plural(n, 'case')} "
        f"({cases}): a broken solution or broken tests, or a test that needs what this sandbox does not "
        "give (a network, another user, a process the agent left running: docs/images.md); the "
        "verifier's output is in each session's evaluation artifacts (docs/verifiers.md)"
    )


def write_jsonl(path: Path, records: Iterable[SessionRecord]) -> int:
    """Write one strict-JSON line per record to ``path`` atomically (a temporary file, fsynced, then
    ``os.replace``) and return the number of lines. ValueError for NaN/inf (the file is left
    untouched), TypeError for a value that is not JSON, OSError when it cannot be written."""
    with JsonlWriter(path) as out:
        for record in records:
            out.write(record)
    return out.count


def output_path_problem(out: Path, example: str) -> str | None:
    """Why no file can be written at ``out`` (a folder: the message suggests ``out/<example>``;
    or under a path that is a file), or None; for checks before any work."""
    if out.is_dir():
        return f"{out} is a folder; give the file's path (e.g. {out / example})"
    for parent in out.parents:
        if parent.exists():
            return None if parent.is_dir() else f"{parent} is a file, not a folder"
    return None


class JsonlWriter:
    """``write_jsonl`` one record at a time: ``with JsonlWriter(path) as out: out.write(r)``. The
    lines go to a temporary file beside ``path``, moved over it (fsynced) when the block ends
    without an error; on an error the target is left untouched. ``count``: lines written."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.count = 0
        self._tmp = ""
        self._fh: Any = None

    def __enter__(self) -> JsonlWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            os.chmod(self._tmp, 0o644)  # mkstemp creates 0600; the export is an ordinary file
            self._fh = os.fdopen(fd, "w", encoding="utf-8")
        except BaseException:
            os.close(fd)
            os.unlink(self._tmp)
            raise
        return self

    def write(self, record: SessionRecord) -> None:
        """Append one record's line. Raises ValueError (NaN/inf) or TypeError (not JSON)."""
        line = json_text(record.model_dump(mode="python"), allow_nan=False)
        self._fh.write(line)
        self._fh.write("\n")
        self.count += 1

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is None:
                self._fh.flush()
                os.fsync(self._fh.fileno())
            self._fh.close()
            if exc_type is None:
                os.replace(self._tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            raise
        if exc_type is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)


def read_jsonl(path: Path) -> list[SessionRecord]:
    """The records of a JSONL file written by ``write_jsonl``."""
    with Path(path).open(encoding="utf-8") as fh:
        return [model_from_json(SessionRecord, line) for line in fh if line.strip()]
