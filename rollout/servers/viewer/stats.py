"""Job-wide numbers for the viewer and the report: the summary table and pass@k over k (the
launcher's own ``rollout.results.report.summarize`` on light records of the store's rows, so the numbers
are the terminal's), two jobs compared per case (counted in SQL) and paired on the cases both scored, and the hidden fields of each
env (what the runtime was not shown).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.core.envs import EnvConfigError, discover_envs, load_cases
from rollout.results.estimates import PairedDiff, Spread, paired
from rollout.results.report import SessionRecord, SummaryRow, summarize
from store import COUNTED_EVAL_STATUSES

log = logging.getLogger(__name__)


Counts = dict[str, Any]
"""A row of :mod:`store.queries` (``summary_rows``, ``case_outcomes``)."""


def job_spreads(case_means: Sequence[Counts]) -> dict[str, Spread]:
    """Per job, the :class:`~rollout.results.estimates.Spread` of its case means
    (:meth:`store.queries.ViewerQueries.case_means`): the case is the unit (docs/output.md,
    "Standard errors"); ``n`` the cases with a counted session."""
    out: dict[str, Spread] = defaultdict(Spread)
    for c in case_means:
        out[c["job_id"]].add(float(c["mean"]))
    return dict(out)


def spread_of(scores: Sequence[float]) -> Spread:
    """The :class:`~rollout.results.estimates.Spread` of a group's counted scores (one case: the
    samples are the unit)."""
    spread = Spread()
    for v in scores:
        spread.add(v)
    return spread


def counted_scores(members: Sequence[Counts]) -> list[float]:
    """The scores of the counted sessions among ``members`` (rows of ``job_environments``)."""
    return [
        float(m["reward"])
        for m in members
        if m["eval_status"] in COUNTED_EVAL_STATUSES and m["reward"] is not None
    ]


def records_of(rows: Sequence[Counts]) -> list[SessionRecord]:
    """Light ``SessionRecord``s (no trajectory, no usage) of
    :meth:`store.queries.ViewerQueries.summary_rows`, for ``rollout.results.report.summarize``.
    ``retried`` as the store says (a store without attempts: more than one attempt); ``outcome``
    is passed on when the store has it, and ``harness`` (a record type without these fields
    ignores them)."""
    return [
        SessionRecord.model_validate(
            {
                "session_id": r["env_id"],
                "job_id": r["job_id"],
                "env_name": r["env_name"],
                "case_id": r["case_id"],
                "group_id": r["group_id"],
                "model": r["llm_model"],
                "sample_index": r["sample_index"],
                "status": r["status"],
                "score": r["reward"],
                "eval_status": r["eval_status"],
                "duration_s": r["duration_s"],
                "outcome": r.get("outcome"),
                "harness": r.get("harness"),
                "retried": bool(r["retried"]) if "retried" in r else int(r["attempts"] or 0) > 1,
            }
        )
        for r in rows
    ]


def row_key(row: SummaryRow) -> tuple[str, str]:
    """(env, model) of a summary row, the model shown as ``harness · model`` for a harness row."""
    return row.env_name, row.model if row.harness is None else f"{row.harness} · {row.model}"


def summary(records: Sequence[SessionRecord]) -> list[SummaryRow]:
    """The launcher's own summary table of these records (``rollout.results.report.summarize``), so the
    viewer and the report show the numbers the terminal printed."""
    return summarize(list(records))


def pass_curves(records: Sequence[SessionRecord]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """pass@k for k = 1 .. the summary's k (the fewest samples of any case), per ``row_key``, each
    point as ``rollout.results.report.summarize(records, k=k)`` computes it (the unbiased estimator per
    case, averaged over cases). An (env, model) with nothing evaluated is left out."""
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for row in summarize(list(records)):
        points: list[tuple[int, float]] = []
        for k in range(1, row.k + 1):
            value = (row if k == row.k else _row_at(records, row, k)).pass_at_k
            if value is not None:
                points.append((k, value))
        if points:
            out[row_key(row)] = points
    return out


def _row_at(records: Sequence[SessionRecord], row: SummaryRow, k: int) -> SummaryRow:
    mine = [r for r in records if (r.env_name, r.model, r.harness) == (row.env_name, row.model, row.harness)]
    return summarize(mine, k=k)[0]


CaseTally = tuple[int, int, float | None]
"""(samples, passing samples, mean score of the counted samples (grading failures as 0) or None)."""


@dataclass
class CaseDelta:
    """One case in two jobs: its :data:`CaseTally` in A and in B (None: that job did not run it)."""

    env_name: str
    case_id: str
    a: CaseTally | None
    b: CaseTally | None

    @property
    def delta(self) -> float | None:
        """Mean score of B minus mean score of A (None when either has no score)."""
        if self.a is None or self.b is None or self.a[2] is None or self.b[2] is None:
            return None
        return self.b[2] - self.a[2]


def _by_case(cases: Sequence[Counts]) -> dict[tuple[str, str], CaseTally]:
    acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    for c in cases:
        a = acc[(c["env_name"], c["case_id"])]
        a[0] += int(c["n"])
        a[1] += int(c["passes"])
        a[2] += int(c["counted"])
        a[3] += float(c["score_sum"] or 0.0)
    return {key: (int(n), int(p), s / sc if sc else None) for key, (n, p, sc, s) in acc.items()}


def compare_cases(a_cases: Sequence[Counts], b_cases: Sequence[Counts]) -> list[CaseDelta]:
    """Per (env, case) of either job: its outcome in A and in B, the largest change of mean score
    first (then cases without a score in one of them, e.g. run by one job only). Models are merged:
    compare jobs on one model each, or one model on two jobs."""
    a, b = _by_case(a_cases), _by_case(b_cases)
    deltas = [
        CaseDelta(env, case, a.get((env, case)), b.get((env, case)))
        for env, case in sorted(a.keys() | b.keys())
    ]
    deltas.sort(key=lambda d: (d.delta is None, -abs(d.delta or 0.0), d.env_name, d.case_id))
    return deltas


@dataclass
class PairedRow:
    """Two jobs compared on the cases both scored, in one env (``env_name`` None: every env):
    the models each job ran there and the :class:`~rollout.results.estimates.PairedDiff` of the
    per-case mean scores."""

    env_name: str | None
    models_a: list[str]
    models_b: list[str]
    score: PairedDiff

    def as_json(self) -> dict[str, Any]:
        """The row as JSON (``/api/compare``)."""
        s = self.score
        return {
            "env": self.env_name,
            "models_a": self.models_a,
            "models_b": self.models_b,
            "common_cases": s.common,
            "only_a": s.only_a,
            "only_b": s.only_b,
            "mean_a": s.mean_a,
            "mean_b": s.mean_b,
            "diff": s.diff,
            "diff_stderr": s.stderr,
            "diff_ci95": list(s.ci95) if s.ci95 is not None else None,
        }


def _models(cases: Sequence[Counts]) -> dict[str, list[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for c in cases:
        out[c["env_name"]].add(c["llm_model"])
    return {env: sorted(models) for env, models in out.items()}


def compare_paired(a_cases: Sequence[Counts], b_cases: Sequence[Counts]) -> tuple[list[PairedRow], PairedRow]:
    """Two jobs on the cases both scored (each case's mean over its counted sessions, models
    merged as in :func:`compare_cases`): one row per env of either job, and one over every env.
    A case one job scored and the other did not (not run, or nothing counted) is in ``only_a`` /
    ``only_b``, never in the means."""
    a = {key: t[2] for key, t in _by_case(a_cases).items() if t[2] is not None}
    b = {key: t[2] for key, t in _by_case(b_cases).items() if t[2] is not None}
    models_a, models_b = _models(a_cases), _models(b_cases)
    rows = []
    for env in sorted(models_a.keys() | models_b.keys()):
        rows.append(
            PairedRow(
                env,
                models_a.get(env, []),
                models_b.get(env, []),
                paired(
                    {k: v for k, v in a.items() if k[0] == env}, {k: v for k, v in b.items() if k[0] == env}
                ),
            )
        )
    every = PairedRow(
        None,
        sorted({m for ms in models_a.values() for m in ms}),
        sorted({m for ms in models_b.values() for m in ms}),
        paired(a, b),
    )
    return rows, every


class HiddenFields:
    """The hidden fields of each env (``env.yaml`` ``dataset.hidden_fields``, plus what a task-folder
    dataset always hides), read from the env configs under ``agent_root``. ``of(env)`` is None
    for an env whose config is not there: the caller must then show no case row as the agent's."""

    def __init__(self, agent_root: Path) -> None:
        self.agent_root = agent_root
        self._by_env: dict[str, list[str] | None] | None = None

    def _load(self) -> dict[str, list[str] | None]:
        found: dict[str, list[str] | None] = {}
        try:
            configs = discover_envs(self.agent_root)
        except EnvConfigError as e:
            log.warning(
                "viewer: no env configs under %s (%s): case rows are shown only to the evaluator's view",
                self.agent_root,
                e,
            )
            return found
        for cfg in configs:
            try:
                cases = load_cases(cfg, 1)
            except EnvConfigError as e:
                log.warning("viewer: env %s: cannot read its cases (%s): hidden fields unknown", cfg.name, e)
                found[cfg.name] = None
                continue
            found[cfg.name] = list(cases[0].hidden_fields) if cases else None
        return found

    def of(self, env_name: str) -> list[str] | None:
        """The hidden field names of ``env_name``, or None when unknown."""
        if self._by_env is None:
            self._by_env = self._load()
        return self._by_env.get(env_name)
