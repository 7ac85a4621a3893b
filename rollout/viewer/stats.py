"""Job-wide numbers for the viewer and the report, from per-case counts made in SQL
(:meth:`store.queries.ViewerQueries.case_outcomes`): the summary table (the launcher's
``SummaryRow``, same rules as ``rollout.report.summarize``), pass@k over k, two jobs compared;
and the hidden fields of each env (what the runtime was not shown).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.envs import EnvConfigError, discover_envs, load_cases
from rollout.report import SummaryRow, pass_at_k

log = logging.getLogger(__name__)


Case = dict[str, Any]
"""One row of :meth:`store.queries.ViewerQueries.case_outcomes` (a case's finished sessions counted)."""


def summary(cases: Sequence[Case]) -> list[SummaryRow]:
    """The launcher's summary table (``rollout.report.summarize`` with its default counting:
    unscored sessions left out of the mean, ``k`` = the fewest samples of any case) from
    per-case counts, so a 100,000-session job is summed in SQL rather than loaded."""
    by_key: dict[tuple[str, str], list[Case]] = defaultdict(list)
    for c in cases:
        by_key[(c["env_name"], c["llm_model"])].append(c)
    rows: list[SummaryRow] = []
    for (env, model), cs in sorted(by_key.items()):
        def total(name: str, cs: list[Case] = cs) -> int:
            return sum(int(c[name] or 0) for c in cs)

        sessions = total("n")
        evaluated = sessions - total("unevaluated") > 0
        k = min(int(c["n"]) for c in cs)
        scored = total("scored")
        durations = total("duration_n")
        pass_1 = sum(pass_at_k(int(c["n"]), int(c["passes"]), 1) for c in cs) / len(cs) if evaluated else None
        pass_k = sum(pass_at_k(int(c["n"]), int(c["passes"]), k) for c in cs) / len(cs) if evaluated else None
        rows.append(SummaryRow(
            env_name=env, model=model, sessions=sessions, cases=len(cs), scored=scored, invalid=total("invalid"),
            eval_error=total("eval_error"), eval_timeout=total("eval_timeout"), unevaluated=total("unevaluated"),
            mean_score=math.fsum(float(c["score_sum"] or 0.0) for c in cs) / scored if scored else None,
            k=k, pass_at_1=pass_1, pass_at_k=pass_k, pass_at_k_cases=len(cs),
            runtime_failed=total("rt_failed"), runtime_errors=total("rt_errors"), runtime_timeouts=total("rt_timeouts"),
            mean_duration_s=math.fsum(float(c["duration_sum"] or 0.0) for c in cs) / durations if durations else None,
        ))
    return rows


def pass_curves(cases: Sequence[Case]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """pass@k for k = 1 .. the fewest samples of any case, per (env, model): the unbiased estimator
    per case (``rollout.report.pass_at_k``) averaged over cases. An (env, model) with no evaluated
    session is left out (nothing can pass)."""
    by_key: dict[tuple[str, str], list[Case]] = defaultdict(list)
    for c in cases:
        by_key[(c["env_name"], c["llm_model"])].append(c)
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for key, cs in sorted(by_key.items()):
        if all(int(c["n"]) == int(c["unevaluated"]) for c in cs):
            continue
        kmax = min(int(c["n"]) for c in cs)
        out[key] = [(k, sum(pass_at_k(int(c["n"]), int(c["passes"]), k) for c in cs) / len(cs))
                    for k in range(1, kmax + 1)]
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


def _by_case(cases: Sequence[Case]) -> dict[tuple[str, str], Outcome]:
    acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    for c in cases:
        a = acc[(c["env_name"], c["case_id"])]
        a[0] += int(c["n"])
        a[1] += int(c["passes"])
        a[2] += int(c["scored"])
        a[3] += float(c["score_sum"] or 0.0)
    return {key: (int(n), int(p), s / sc if sc else None) for key, (n, p, sc, s) in acc.items()}


def compare_cases(a_cases: Sequence[Case], b_cases: Sequence[Case]) -> list[CaseDelta]:
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
