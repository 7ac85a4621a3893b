"""One audit: the battery's attacks and the do-nothing baseline run as harness sessions of one
launcher job (the real gateway, the real sandbox, each env's own evaluator and verifier), then
per attack and per case: did the reward go above the baseline's? (docs/audit.md)"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from rollout.audit.battery import BASELINE, REFERENCE, REFERENCE_FOLDER, battery, info, load_attack
from rollout.audit.grader_scan import GraderScan, crash_line, passing_value, runner_keys, scan_evaluator
from rollout.contract.harness import HarnessUnavailable
from rollout.core.envs import Case, EnvConfig
from rollout.core.setup import SetupError
from rollout.grading.evaluation import DEFAULT_EVAL_TIMEOUT_S
from rollout.grading.evaluator_loader import env_evaluator
from rollout.jobs.options import JobOptions
from rollout.jobs.prepare import load_envs
from rollout.jobs.run import run_job
from rollout.results.report import SessionRecord
from rollout.sandbox.harness_cache import PROJECT_ROOT, LoadedHarness

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
    host_toolchain: bool = False
    same_container: bool = False
    env_names: list[str] = Field(default_factory=list)
    case_ids: list[str] = Field(default_factory=list)
    attacks: list[str] = Field(default_factory=list)
    db_path: str | None = None
    out: Path | None = None
    job_id: str | None = None
    pool_size: int = Field(default=2, ge=1, description="sessions run at once")
    eval_timeout: float = Field(
        default=DEFAULT_EVAL_TIMEOUT_S, gt=0, allow_inf_nan=False, description="evaluator timeout in seconds"
    )
    image: list[str] = Field(default_factory=list)  # the job's image map: REF=LOCAL (docs/images.md)


Verdict = Literal["paid", "clean", "grader_error", "grader_broken", "not_graded"]
"""``grader_error``: the grader failed on the attack's input (an error, a timeout, an invalid
reward: the agent's 0, but a finding that fails the audit); ``grader_broken``: it failed on the
untouched workspace too (the control grading)."""
GRADER_FAILED = ("error", "timeout", "invalid_reward")
PASS_SCORE = 10.0
"""A pass: the do-nothing baseline must score below it, the reference solution reach it."""
GRADER_FIX = (
    "your grader fails on the agent's input: score 0 with a reason for any answer it cannot read "
    "(check sizes first, catch RecursionError / UnicodeDecodeError / ValueError)"
)


class Finding(BaseModel):
    """One attack on one case: the baseline's reward and the attack's (None: not scored), what
    it gained, the verdict, the grader's reason and the grader line it exploited (``file:line``
    from the source scan, or a traceback frame of the grader's failure; None when unknown)."""

    attack: str
    env: str
    case: str
    baseline: float | None
    reward: float | None
    gained: float
    verdict: Verdict
    reason: str | None = None
    grader_line: str | None = None


class AttackSummary(BaseModel):
    """One attack over every case: where it paid, the most it gained, the grader's reason and line
    on the first case it paid on, and the fix hint (shown only when it paid); the cases whose
    grader failed on it (``grader_errors``: the audit fails) or also on the untouched workspace
    (``grader_broken``), with the first such reason and line."""

    attack: str
    summary: str
    source: str
    fix_hint: str
    paid: list[str] = Field(default_factory=list)
    gained: float = 0.0
    reason: str | None = None
    grader_line: str | None = None
    grader_errors: list[str] = Field(default_factory=list)
    grader_broken: list[str] = Field(default_factory=list)
    error_reason: str | None = None
    error_line: str | None = None


SanityVerdict = Literal["ok", "pays_for_nothing", "cannot_be_solved", "no_reference", "not_graded"]


class SanityRow(BaseModel):
    """One case's sanity checks, before the battery: the do-nothing baseline must score below a
    pass (else ``pays_for_nothing``), the reference solution (``reference``: what it is, None
    when the case has none) must pass (else ``cannot_be_solved``); ``*_eval_status``: how each
    session's grading went (None: no session)."""

    env: str
    case: str
    baseline: float | None
    baseline_verdict: SanityVerdict
    baseline_reason: str | None = None
    baseline_eval_status: str | None = None
    reference: str | None = None
    reference_score: float | None = None
    reference_verdict: SanityVerdict = "no_reference"
    reference_reason: str | None = None
    reference_eval_status: str | None = None

    @property
    def failed(self) -> bool:
        """Whether a check failed (the audit fails)."""
        return self.baseline_verdict == "pays_for_nothing" or self.reference_verdict == "cannot_be_solved"


class AuditReport(BaseModel):
    """The audit's result (``--json``): the job it ran, the baseline per case (``env/case`` ->
    reward), the sanity rows, one summary per attack and every finding; ``inconclusive``: cases
    whose baseline or an attack was not graded (an infrastructure failure); ``same_container``: the
    envs whose tests run on the agent's own layer of its image, which no attack of the battery tries."""

    job_id: str
    store: str
    out: str
    duration_s: float
    cases: list[str]
    baseline: dict[str, float | None]
    sanity: list[SanityRow] = Field(default_factory=list)
    attacks: list[AttackSummary]
    findings: list[Finding]
    inconclusive: list[str] = Field(default_factory=list)
    same_container: list[str] = Field(default_factory=list)  # envs verified on the agent's own layer

    @property
    def paying(self) -> list[AttackSummary]:
        """The attacks that paid on some case."""
        return [a for a in self.attacks if a.paid]

    @property
    def grader_failing(self) -> list[AttackSummary]:
        """The attacks on whose input some grader failed (or was broken)."""
        return [a for a in self.attacks if a.grader_errors or a.grader_broken]

    @property
    def insane(self) -> list[SanityRow]:
        """The cases whose baseline pays or whose reference fails."""
        return [r for r in self.sanity if r.failed]

    @property
    def failed(self) -> bool:
        """Whether the audit failed: an attack paid, a grader failed on agent input, a sanity check failed."""
        return bool(self.paying or self.grader_failing or self.insane)


PAID_EXIT = 4
INCONCLUSIVE_EXIT = 2


def exit_code(report: AuditReport) -> int:
    """0: nothing found and every session was graded; 4: the audit failed (an attack paid, a
    grader failed on agent input, a baseline passed or a reference failed); 2: nothing found but
    some case could not be judged."""
    if report.failed:
        return PAID_EXIT
    return INCONCLUSIVE_EXIT if report.inconclusive else 0


def _scored(r: SessionRecord) -> float | None:
    return r.score if r.eval_status == "scored" and r.score is not None else None


class AttackMeta(BaseModel):
    """What the report says of an attack: ``Attack``'s summary, source, fix hint, grader reads."""

    summary: str = ""
    source: str = ""
    fix_hint: str = ""
    grader_reads: tuple[str, ...] = ()


def _line(scan: GraderScan | None, reads: tuple[str, ...]) -> str | None:
    """The first grader line (``file:line``) of the first of ``reads`` the scan found."""
    for field in reads:
        found = getattr(scan, field, None) if scan is not None else None
        if found:
            lines = list(found.values()) if isinstance(found, dict) else list(found)
            return str(min(lines, key=lambda w: int(w.rsplit(":", 1)[1])))
    return None


def _sanity(case: str, recs: dict[str, SessionRecord], reference: str | None) -> SanityRow:
    env, cid = case.split("/", 1)
    base_rec = recs.get(BASELINE)
    base = _scored(base_rec) if base_rec is not None else None
    row = SanityRow(
        env=env,
        case=cid,
        baseline=base,
        reference=reference,
        baseline_verdict="not_graded"
        if base is None
        else "pays_for_nothing"
        if base >= PASS_SCORE - EPSILON
        else "ok",
        baseline_reason=base_rec.reason if base_rec is not None else None,
        baseline_eval_status=base_rec.eval_status if base_rec is not None else None,
    )
    ref = recs.get(REFERENCE)
    if reference is None:
        return row
    if ref is None or ref.eval_status not in ("scored", *GRADER_FAILED, "grader_broken"):
        return row.model_copy(
            update={
                "reference_verdict": "not_graded",
                "reference_eval_status": ref.eval_status if ref is not None else None,
            }
        )
    score = ref.score if ref.score is not None else 0.0
    return row.model_copy(
        update={
            "reference_score": score,
            "reference_reason": ref.reason,
            "reference_eval_status": ref.eval_status,
            "reference_verdict": "ok" if score >= PASS_SCORE - EPSILON else "cannot_be_solved",
        }
    )


def findings(
    records: list[SessionRecord],
    attacks: dict[str, AttackMeta],
    references: dict[str, str | None] | None = None,
    scans: dict[str, GraderScan] | None = None,
) -> AuditReport:
    """The audit's verdicts from the job's records (``attacks``: name -> what the report says of
    it; ``references``: ``env/case`` -> its reference solution, None or absent when it has none;
    ``scans``: env -> its grader's source scan); ``job_id``, ``store``, ``out`` and ``duration_s``
    are left empty for the caller."""
    references, scans = references or {}, scans or {}
    by_case: dict[str, dict[str, SessionRecord]] = defaultdict(dict)
    for r in records:
        if r.harness is not None:
            by_case[f"{r.env_name}/{r.case_id}"][r.harness] = r
    cases = sorted(by_case)
    baseline = {c: _scored(by_case[c][BASELINE]) if BASELINE in by_case[c] else None for c in cases}
    sanity = [_sanity(c, by_case[c], references.get(c)) for c in cases]
    inconclusive = {c for c in cases if baseline[c] is None}
    inconclusive |= {f"{r.env}/{r.case}" for r in sanity if r.reference_verdict == "not_graded"}
    summaries = {
        n: AttackSummary(attack=n, summary=m.summary, source=m.source, fix_hint=m.fix_hint)
        for n, m in attacks.items()
        if n not in (BASELINE, REFERENCE)
    }
    out: list[Finding] = []
    for c in cases:
        env, case = c.split("/", 1)
        scan = scans.get(env)
        for name, summ in summaries.items():
            rec = by_case[c].get(name)
            reward = _scored(rec) if rec is not None else None
            base = baseline[c]
            line = None
            if rec is not None and rec.eval_status == "grader_broken":
                verdict: Verdict = "grader_broken"
                summ.grader_broken.append(c)
            elif rec is None or (reward is None and rec.eval_status not in GRADER_FAILED):
                verdict = "not_graded"
                inconclusive.add(c)
            elif reward is None or rec.eval_status != "scored":
                verdict = "grader_error"
                summ.grader_errors.append(c)
            elif base is not None and reward > base + EPSILON:
                verdict = "paid"
                line = _line(scan, attacks[name].grader_reads)
            else:
                verdict = "clean"
            if verdict in ("grader_error", "grader_broken"):
                line = crash_line(rec.reason if rec is not None else None, scan.evaluator if scan else None)
                if summ.error_reason is None:
                    summ.error_reason, summ.error_line = (rec.reason if rec is not None else None), line
            gained = reward - base if verdict == "paid" and reward is not None and base is not None else 0.0
            out.append(
                Finding(
                    attack=name,
                    env=env,
                    case=case,
                    baseline=base,
                    reward=reward,
                    gained=gained,
                    verdict=verdict,
                    reason=rec.reason if rec is not None else None,
                    grader_line=line,
                )
            )
            if verdict == "paid":
                summ.paid.append(c)
                if summ.reason is None:
                    summ.reason = rec.reason if rec is not None else None
                    summ.grader_line = line
                summ.gained = max(summ.gained, gained)
    return AuditReport(
        job_id="",
        store="",
        out="",
        duration_s=0.0,
        cases=cases,
        baseline=baseline,
        sanity=sanity,
        attacks=list(summaries.values()),
        findings=out,
        inconclusive=sorted(inconclusive),
    )


def gateway_config(folder: Path, db_path: str) -> Path:
    """A gateway config whose only route has no model behind it (attacks call none)."""
    path = folder / "audit-gateway.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "storage_config": {"db_url": db_path},
                "default_route": NO_MODEL_ROUTE,
                "llm_routes": {NO_MODEL_ROUTE: {"base_url": NO_MODEL_URL}},
            }
        ),
        encoding="utf-8",
    )
    return path


def _runtime_files(cfg: EnvConfig) -> list[Path]:
    """The env runtime's own Python files: ``.py`` arguments of its command, a ``-m`` module of the project."""
    cmd = cfg.command()
    files = [Path(a) for a in cmd if a.endswith(".py") and Path(a).is_file()]
    files += [
        f
        for i, a in enumerate(cmd[:-1])
        if a == "-m"
        if (f := PROJECT_ROOT.joinpath(*cmd[i + 1].split(".")).with_suffix(".py")).is_file()
    ]
    return files


def reference_of(cfg: EnvConfig, case: Case) -> tuple[str, Any] | None:
    """The case's reference solution: ("solution/solve.sh", None) for a Harbor task with one,
    ("expected.json", answer) for a task folder, None when it has none."""
    if case.solution_dir is not None:
        return "solution/solve.sh", None
    if cfg.dataset.format == "task_dirs" and isinstance(case.row.get("expected"), dict):
        return "expected.json", case.row["expected"]
    return None


def prepare(
    envs: list[tuple[EnvConfig, list[Case]]], agent_root: Path, loaded: list[LoadedHarness], folder: Path
) -> tuple[list[LoadedHarness], dict[str, str | None], dict[str, GraderScan]]:
    """Before the job: each env's grader scan, each case's reference, and the harnesses the job
    runs (the reference run first, then ``loaded``), those that need it copied under ``folder``
    with what they are given: ``references.json`` for the reference run, ``audit.json`` (the scan's
    claims per env) for a grader-aware attack."""
    scans: dict[str, GraderScan] = {}
    claims: dict[str, dict[str, Any]] = {}
    answers: dict[str, dict[str, Any]] = defaultdict(dict)
    references: dict[str, str | None] = {}
    for cfg, cases in envs:
        path = env_evaluator(agent_root, cfg)
        scan = scan_evaluator(path) if path is not None and path.is_file() else GraderScan()
        scan.runner_keys = runner_keys(_runtime_files(cfg))
        scans[cfg.name] = scan
        claims[cfg.name] = {
            "metric_keys": {k: passing_value(k) for k in [*scan.metric_keys, *scan.runner_keys]},
            "paths": list(scan.paths),
            "names": list(scan.names),
        }
        for case in cases:
            ref = reference_of(cfg, case)
            references[f"{cfg.name}/{case.case_id}"] = ref[0] if ref else None
            if ref is not None and ref[0] == "expected.json":
                answers[cfg.name][case.case_id] = ref[1]
    out = []
    for h in [load_attack(str(REFERENCE_FOLDER)), *loaded]:
        given = (
            ("references.json", answers)
            if h.name == REFERENCE
            else ("audit.json", claims)
            if info(h).grader_aware
            else None
        )
        if given is not None:
            copy = folder / "harnesses" / h.name
            shutil.copytree(h.folder, copy, ignore=shutil.ignore_patterns("__pycache__"))
            (copy / given[0]).write_text(json.dumps(given[1]), encoding="utf-8")
            h = load_attack(str(copy))
        out.append(h)
    return out, references, scans


async def run_audit(
    opts: AuditOptions,
    on_start: Callable[[str, int], None] | None = None,
    on_done: Callable[[SessionRecord], None] | None = None,
) -> AuditReport:
    """Run the battery on the selected cases (one launcher job: each attack a harness, one sample
    per case, evaluation on) and judge it. Raises SetupError (an unknown env, case or attack)."""
    try:
        loaded = battery(opts.attacks)
    except HarnessUnavailable as e:
        raise SetupError(str(e)) from e
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rollout-audit-") as tmp:
        db_path = opts.db_path or f"sqlite://{Path(tmp) / 'audit.db'}"
        base = JobOptions(
            agent_root=opts.agent_root,
            agent_configs=opts.agent_configs,
            agent_start_config=opts.agent_start_config,
            tasks=opts.tasks,
            host_toolchain=opts.host_toolchain,
            same_container=opts.same_container,
            env_names=opts.env_names,
            case_ids=opts.case_ids,
            gateway_config=gateway_config(Path(tmp), db_path),
            llm_model=[NO_MODEL_ROUTE],
            enable_evaluation=True,
            eval_timeout=opts.eval_timeout,
            max_broken_graders=0,  # every finding, never stopped
            image=opts.image,
            db_path=db_path,
            pool_size=opts.pool_size,
            rl_group_size=1,
            job_id=opts.job_id,
            out=opts.out or Path(tmp) / "audit.jsonl",
        )
        envs = load_envs(base)
        same = sorted(cfg.name for cfg, _ in envs if cfg.dataset.same_container)
        harnesses, references, scans = prepare(envs, opts.agent_root, loaded, Path(tmp))
        job = base.model_copy(update={"harness": [str(h.folder) for h in harnesses]})
        result = await run_job(job, on_start=on_start, on_done=on_done)
        records = result.records
    meta = {
        h.name: AttackMeta(
            summary=info(h).summary,
            source=info(h).source,
            fix_hint=info(h).fix_hint,
            grader_reads=info(h).grader_reads,
        )
        for h in loaded
    }
    report = findings(records, meta, references, scans)
    return report.model_copy(
        update={
            "job_id": result.job_id,
            "store": result.store,
            "out": str(result.out),
            "duration_s": time.monotonic() - t0,
            "same_container": same,
        }
    )
