"""One audit: the battery's attacks and the do-nothing baseline run as harness sessions of one
launcher job (the real gateway, the real sandbox, each env's own evaluator and verifier), then
per attack and per case: did the reward go above the baseline's? (docs/audit.md)"""

from __future__ import annotations

import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from rollout.audit.battery import BASELINE, battery, info
from rollout.contract.harness import HarnessUnavailable
from rollout.core.setup import SetupError
from rollout.jobs.job import JobOptions, run_job
from rollout.results.report import SessionRecord

NO_MODEL_ROUTE = "audit-no-model"
"""The gateway route of an audit: nothing listens behind it (no attack calls a model)."""
NO_MODEL_URL = "http://127.0.0.1:9/v1"
EPSILON = 1e-9


class AuditOptions(BaseModel):
    """What to audit: the envs as a job finds them (``agent_configs``, with a Safactory
    ``agent_start_config``, and ``tasks`` folders; else every env of ``agent_root``), ``env_names``
    (empty: all of them), ``case_ids`` (empty: every case), ``attacks`` (bundled names or folders;
    empty: the whole battery), where sessions are kept (``db_path``, ``out``: default a temporary
    folder) and how many run at once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent_root: Path = Path("env")
    agent_configs: list[Path] = Field(default_factory=list)
    agent_start_config: Path | None = None
    tasks: list[Path] = Field(default_factory=list)
    env_names: list[str] = Field(default_factory=list)
    case_ids: list[str] = Field(default_factory=list)
    attacks: list[str] = Field(default_factory=list)
    db_path: str | None = None
    out: Path | None = None
    job_id: str | None = None
    pool_size: int = Field(default=2, ge=1)
    eval_timeout: float = Field(default=60.0, gt=0, allow_inf_nan=False)


Verdict = Literal["paid", "clean", "grader_error", "not_graded"]


class Finding(BaseModel):
    """One attack on one case: the baseline's reward and the attack's (None: not scored), what
    it gained, the verdict and the grader's reason."""

    attack: str
    env: str
    case: str
    baseline: float | None
    reward: float | None
    gained: float
    verdict: Verdict
    reason: str | None = None


class AttackSummary(BaseModel):
    """One attack over every case: where it paid, the most it gained, the grader's reason on the
    first case it paid on, and the fix hint (shown only when it paid); cases whose grader failed
    on it (an error or timeout: no reward, but worth a look)."""

    attack: str
    summary: str
    source: str
    fix_hint: str
    paid: list[str] = Field(default_factory=list)
    gained: float = 0.0
    reason: str | None = None
    grader_errors: list[str] = Field(default_factory=list)


class AuditReport(BaseModel):
    """The audit's result (``--json``): the job it ran, the baseline per case (``env/case`` ->
    reward), one summary per attack and every finding; ``inconclusive``: cases whose baseline or
    an attack was not graded (an infrastructure failure, a grading timeout)."""

    job_id: str
    store: str
    out: str
    duration_s: float
    cases: list[str]
    baseline: dict[str, float | None]
    attacks: list[AttackSummary]
    findings: list[Finding]
    inconclusive: list[str] = Field(default_factory=list)

    @property
    def paying(self) -> list[AttackSummary]:
        """The attacks that paid on some case."""
        return [a for a in self.attacks if a.paid]


PAID_EXIT = 4
INCONCLUSIVE_EXIT = 2


def exit_code(report: AuditReport) -> int:
    """0: no attack paid and every session was graded; 4: some attack paid (the audit failed);
    2: none paid but some case could not be judged."""
    if report.paying:
        return PAID_EXIT
    return INCONCLUSIVE_EXIT if report.inconclusive else 0


def _scored(r: SessionRecord) -> float | None:
    return r.score if r.eval_status == "scored" and r.score is not None else None


def findings(records: list[SessionRecord], attacks: dict[str, tuple[str, str, str]]) -> AuditReport:
    """The audit's verdicts from the job's records (``attacks``: name -> (summary, source,
    fix hint)); ``job_id``, ``store``, ``out`` and ``duration_s`` are left empty for the caller."""
    by_case: dict[str, dict[str, SessionRecord]] = defaultdict(dict)
    for r in records:
        if r.harness is not None:
            by_case[f"{r.env_name}/{r.case_id}"][r.harness] = r
    cases = sorted(by_case)
    baseline = {c: _scored(by_case[c][BASELINE]) if BASELINE in by_case[c] else None for c in cases}
    inconclusive = {c for c in cases if baseline[c] is None}
    summaries = {n: AttackSummary(attack=n, summary=s, source=src, fix_hint=fix)
                 for n, (s, src, fix) in attacks.items() if n != BASELINE}
    out: list[Finding] = []
    for c in cases:
        env, case = c.split("/", 1)
        for name, summ in summaries.items():
            rec = by_case[c].get(name)
            reward = _scored(rec) if rec is not None else None
            base = baseline[c]
            if rec is None or (reward is None and rec.eval_status not in ("error", "invalid_reward")):
                verdict: Verdict = "not_graded"
                inconclusive.add(c)
            elif reward is None:
                verdict = "grader_error"
                summ.grader_errors.append(c)
            elif base is not None and reward > base + EPSILON:
                verdict = "paid"
            else:
                verdict = "clean"
            gained = reward - base if verdict == "paid" and reward is not None and base is not None else 0.0
            out.append(Finding(attack=name, env=env, case=case, baseline=base, reward=reward, gained=gained,
                               verdict=verdict, reason=rec.reason if rec is not None else None))
            if verdict == "paid":
                summ.paid.append(c)
                if summ.reason is None:
                    summ.reason = rec.reason if rec is not None else None
                summ.gained = max(summ.gained, gained)
    return AuditReport(job_id="", store="", out="", duration_s=0.0, cases=cases, baseline=baseline,
                       attacks=list(summaries.values()), findings=out, inconclusive=sorted(inconclusive))


def gateway_config(folder: Path, db_path: str) -> Path:
    """A gateway config whose only route has no model behind it (attacks call none)."""
    path = folder / "audit-gateway.yaml"
    path.write_text(yaml.safe_dump({
        "storage_config": {"db_url": db_path}, "default_route": NO_MODEL_ROUTE,
        "llm_routes": {NO_MODEL_ROUTE: {"base_url": NO_MODEL_URL}}}), encoding="utf-8")
    return path


async def run_audit(opts: AuditOptions, on_start: Callable[[str, int], None] | None = None,
                    on_done: Callable[[SessionRecord], None] | None = None) -> AuditReport:
    """Run the battery on the selected cases (one launcher job: each attack a harness, one sample
    per case, evaluation on) and judge it. Raises SetupError (an unknown env, case or attack)."""
    try:
        loaded = battery(opts.attacks)
    except HarnessUnavailable as e:
        raise SetupError(str(e)) from e
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rollout-audit-") as tmp:
        db_path = opts.db_path or f"sqlite://{Path(tmp) / 'audit.db'}"
        job = JobOptions(
            agent_root=opts.agent_root, agent_configs=opts.agent_configs,
            agent_start_config=opts.agent_start_config, tasks=opts.tasks, env_names=opts.env_names, case_ids=opts.case_ids,
            gateway_config=gateway_config(Path(tmp), db_path), llm_model=[NO_MODEL_ROUTE],
            harness=[str(h.folder) for h in loaded], enable_evaluation=True, eval_timeout=opts.eval_timeout,
            db_path=db_path, pool_size=opts.pool_size, rl_group_size=1, job_id=opts.job_id,
            out=opts.out or Path(tmp) / "audit.jsonl")
        result = await run_job(job, on_start=on_start, on_done=on_done)
        records = result.records
    report = findings(records, {h.name: (info(h).summary, info(h).source, info(h).fix_hint) for h in loaded})
    return report.model_copy(update={"job_id": result.job_id, "store": result.store, "out": str(result.out),
                                     "duration_s": time.monotonic() - t0})
