"""Job-wide numbers for the viewer and the report, from :mod:`store.queries` rows: the summary table
(the launcher's own ``rollout.report.summarize``, so the numbers match the terminal's), pass@k over
k, two jobs compared, and the hidden fields of each env (what the runtime was not shown).
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
from rollout.report import PASS_EPSILON, PASS_SCORE, SessionRecord, SummaryRow, pass_at_k, summarize

log = logging.getLogger(__name__)


def records_of(rows: Sequence[dict[str, Any]]) -> list[SessionRecord]:
    """Light ``SessionRecord``s (no trajectory) of finished session rows
    (:meth:`store.queries.ViewerQueries.finished_sessions`)."""
    out: list[SessionRecord] = []
    for r in rows:
        usage = None
        if r.get("total_tokens") is not None or r.get("prompt_tokens") is not None:
            usage = {k: int(r.get(k) or 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        out.append(SessionRecord.model_validate({
            "session_id": r["env_id"], "job_id": r["job_id"], "env_name": r["env_name"], "case_id": r["case_id"],
            "group_id": r["group_id"], "model": r["llm_model"], "sample_index": r["sample_index"],
            "status": r["status"], "score": r["reward"], "eval_status": r["eval_status"],
            "reason": r["eval_reason"], "error": r["error_text"], "duration_s": r["duration_s"], "usage": usage,
            "step_count": int(r.get("steps") or 0),
        }))
    return out


def summary(rows: Sequence[dict[str, Any]]) -> list[SummaryRow]:
    """The launcher's summary table of these finished sessions."""
    return summarize(records_of(rows))


def _passes(r: dict[str, Any]) -> bool:
    return r["eval_status"] == "scored" and r["reward"] is not None and r["reward"] >= PASS_SCORE - PASS_EPSILON


def case_counts(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, tuple[int, int, float | None]]]:
    """``{(env, model): {case_id: (samples, passing samples, mean score of scored samples)}}``."""
    acc: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        acc[(r["env_name"], r["llm_model"])][r["case_id"]].append(r)
    out: dict[tuple[str, str], dict[str, tuple[int, int, float | None]]] = {}
    for key, cases in acc.items():
        out[key] = {}
        for case_id, rs in cases.items():
            scores = [x["reward"] for x in rs if x["eval_status"] == "scored" and x["reward"] is not None]
            out[key][case_id] = (len(rs), sum(1 for x in rs if _passes(x)),
                                 math.fsum(scores) / len(scores) if scores else None)
    return out


def pass_curves(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """pass@k for k = 1 .. the fewest samples of any case, per (env, model): the unbiased estimator
    per case (``rollout.report.pass_at_k``) averaged over cases. Rows with no evaluated session
    are left out (nothing can pass)."""
    evaluated = {(r["env_name"], r["llm_model"]) for r in rows if r["eval_status"] not in (None, "skipped")}
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for key, cases in sorted(case_counts(rows).items()):
        if key not in evaluated:
            continue
        kmax = min(n for n, _, _ in cases.values())
        out[key] = [(k, sum(pass_at_k(n, c, k) for n, c, _ in cases.values()) / len(cases))
                    for k in range(1, kmax + 1)]
    return out


@dataclass
class CaseDelta:
    env_name: str
    case_id: str
    a: tuple[int, int, float | None] | None
    b: tuple[int, int, float | None] | None

    @property
    def delta(self) -> float | None:
        """Mean score of B minus mean score of A (None when either has no score)."""
        if self.a is None or self.b is None or self.a[2] is None or self.b[2] is None:
            return None
        return self.b[2] - self.a[2]


def compare_cases(a_rows: Sequence[dict[str, Any]], b_rows: Sequence[dict[str, Any]]) -> list[CaseDelta]:
    """Per (env, case) of either job: samples, passes and mean score in A and in B, sorted by the
    largest change first (cases only one job ran, then unscored ones, last). Models are merged:
    compare jobs on one model each, or one model on two jobs."""
    def by_case(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], tuple[int, int, float | None]]:
        merged: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            merged[(r["env_name"], r["case_id"])].append(r)
        out = {}
        for key, rs in merged.items():
            scores = [x["reward"] for x in rs if x["eval_status"] == "scored" and x["reward"] is not None]
            out[key] = (len(rs), sum(1 for x in rs if _passes(x)), math.fsum(scores) / len(scores) if scores else None)
        return out

    a, b = by_case(a_rows), by_case(b_rows)
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
