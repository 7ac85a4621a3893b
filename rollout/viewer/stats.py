"""Job-wide numbers for the viewer and the report, from per-case counts made in SQL
(:meth:`store.queries.ViewerQueries.case_outcomes`): the summary table (the launcher's
``SummaryRow``, same rules as ``rollout.report.summarize``), pass@k over k, two jobs compared;
and the hidden fields of each env (what the runtime was not shown).
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.envs import EnvConfigError, discover_envs, load_cases
from rollout.report import SummaryRow, pass_at_k

log = logging.getLogger(__name__)


Counts = dict[str, Any]
"""A row of :mod:`store.queries` counts (``env_totals``, ``pass_histogram``, ``case_outcomes``)."""


@functools.lru_cache(maxsize=4096)
def _pass_at_k(n: int, c: int, k: int) -> float:
    return pass_at_k(n, c, k)


def _by_env(rows: Sequence[Counts]) -> dict[tuple[str, str], list[Counts]]:
    out: dict[tuple[str, str], list[Counts]] = defaultdict(list)
    for r in rows:
        out[(r["env_name"], r["llm_model"])].append(r)
    return out


def _mean_pass(hist: list[Counts], k: int) -> float:
    cases = sum(int(h["cases"]) for h in hist)
    return sum(int(h["cases"]) * _pass_at_k(int(h["n"]), int(h["passes"]), k) for h in hist) / cases


def summary(totals: Sequence[Counts], histogram: Sequence[Counts]) -> list[SummaryRow]:
    """The launcher's summary table (same rules as ``rollout.report.summarize`` with its defaults:
    unscored sessions left out of the mean, ``k`` = the fewest samples of any case) from the
    counts of ``ViewerQueries.env_totals`` and ``pass_histogram``: a 100,000-session job is
    summed in SQL, not loaded."""
    hists = _by_env(histogram)
    rows: list[SummaryRow] = []
    for t in totals:
        hist = hists[(t["env_name"], t["llm_model"])]
        sessions, scored, durations = int(t["n"]), int(t["scored"]), int(t["duration_n"])
        evaluated = sessions - int(t["unevaluated"]) > 0
        k = min(int(h["n"]) for h in hist)
        cases = sum(int(h["cases"]) for h in hist)
        rows.append(SummaryRow(
            env_name=t["env_name"], model=t["llm_model"], sessions=sessions, cases=cases, scored=scored,
            invalid=int(t["invalid"]), eval_error=int(t["eval_error"]), eval_timeout=int(t["eval_timeout"]),
            unevaluated=int(t["unevaluated"]),
            mean_score=float(t["score_sum"]) / scored if scored else None,
            k=k, pass_at_1=_mean_pass(hist, 1) if evaluated else None,
            pass_at_k=_mean_pass(hist, k) if evaluated else None, pass_at_k_cases=cases,
            runtime_failed=int(t["rt_failed"]), runtime_errors=int(t["rt_errors"]),
            runtime_timeouts=int(t["rt_timeouts"]),
            mean_duration_s=float(t["duration_sum"]) / durations if durations else None,
        ))
    return rows


def pass_curves(totals: Sequence[Counts], histogram: Sequence[Counts]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """pass@k for k = 1 .. the fewest samples of any case, per (env, model): the unbiased estimator
    per case (``rollout.report.pass_at_k``) averaged over cases. An (env, model) with no evaluated
    session is left out (nothing can pass)."""
    evaluated = {(t["env_name"], t["llm_model"]) for t in totals if int(t["n"]) > int(t["unevaluated"])}
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for key, hist in sorted(_by_env(histogram).items()):
        if key in evaluated:
            out[key] = [(k, _mean_pass(hist, k)) for k in range(1, min(int(h["n"]) for h in hist) + 1)]
    return out


Outcome = tuple[int, int, float | None]
"""(samples, passing samples, mean score of the scored samples or None)."""


@dataclass
class CaseDelta:
    """One case in two jobs: its :data:`Outcome` in A and in B (None: that job did not run it)."""

    env_name: str
    case_id: str
    a: Outcome | None
    b: Outcome | None

    @property
    def delta(self) -> float | None:
        """Mean score of B minus mean score of A (None when either has no score)."""
        if self.a is None or self.b is None or self.a[2] is None or self.b[2] is None:
            return None
        return self.b[2] - self.a[2]


def _by_case(cases: Sequence[Counts]) -> dict[tuple[str, str], Outcome]:
    acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    for c in cases:
        a = acc[(c["env_name"], c["case_id"])]
        a[0] += int(c["n"])
        a[1] += int(c["passes"])
        a[2] += int(c["scored"])
        a[3] += float(c["score_sum"] or 0.0)
    return {key: (int(n), int(p), s / sc if sc else None) for key, (n, p, sc, s) in acc.items()}


def compare_cases(a_cases: Sequence[Counts], b_cases: Sequence[Counts]) -> list[CaseDelta]:
    """Per (env, case) of either job: its outcome in A and in B, the largest change of mean score
    first (then cases without a score in one of them, e.g. run by one job only). Models are merged:
    compare jobs on one model each, or one model on two jobs."""
    a, b = _by_case(a_cases), _by_case(b_cases)
    deltas = [CaseDelta(env, case, a.get((env, case)), b.get((env, case))) for env, case in sorted(a.keys() | b.keys())]
    deltas.sort(key=lambda d: (d.delta is None, -abs(d.delta or 0.0), d.env_name, d.case_id))
    return deltas


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
            log.warning("viewer: no env configs under %s (%s): case rows are shown only to the evaluator's view",
                        self.agent_root, e)
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
