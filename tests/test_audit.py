"""``launcher.py audit``: the battery's verdicts from records (fast), and for real (marked ``audit``:
the sandbox, the gateway, the graders): the bundled envs come out clean, and each attack is caught
by a deliberately gullible grader of tests/fixtures/gullible/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.audit.audit import INCONCLUSIVE_EXIT, PAID_EXIT, AttackMeta, exit_code, findings
from rollout.audit.battery import (
    ATTACK_ROOT,
    BASELINE,
    REFERENCE,
    Attack,
    attack_folders,
    battery,
    load_attack,
)
from rollout.audit.grader_scan import GraderScan, crash_line, passing_value, runner_keys, scan_evaluator
from rollout.audit.report import html_section, sanity_cells, table_rows, verdict_line
from rollout.contract.harness import HarnessUnavailable, load_harness_file
from rollout.core.setup import SetupError
from rollout.jobs.options import JobOptions
from rollout.jobs.prepare import load_envs
from rollout.results.report import SessionRecord
from rollout.sandbox.bwrap import SandboxUnavailable
from rollout.sandbox.harness_cache import install, load_harness
from rollout.sandbox.runner import sandbox_support

REPO = Path(__file__).resolve().parents[1]
GULLIBLE = REPO / "tests" / "fixtures" / "gullible"
CAUGHT_BY = {
    "g-empty": "empty-answer",
    "g-malformed": "malformed-answer",
    "g-link": "answer-link",
    "g-fifo": "answer-fifo",
    "g-huge": "huge-answer",
    "g-metrics": "claim-success",
    "g-eq": "always-equal",
    "g-exit": "exit-early",
    "g-harbor": "exit-early",
    "g-hooks": "planted-hooks",
    "g-tests": "tests-tampered",
    "g-path": "shadow-path",
    "g-leaky": "read-hidden",
    "g-git": "read-hidden",
    "g-echo": "echo-instruction",
    "g-candidates": "every-candidate",
    "g-overlap": "longest-answer",
    "g-bench": "claim-grader-keys",
    "g-marker": "claim-grader-keys",
    "g-eval": "answer-as-code",
}
"""Each gullible env (tests/fixtures/gullible/, g-git made by the test) and the attack that must pay there."""
BROKEN_BY = {"deep-answer": "g-deep", "huge-valid-answer": "g-deep"}
"""Each attack that must make a gullible grader fail (no pay: the finding 'grader fails on agent input')."""
SANITY_ENVS = ("g-free", "g-unsolvable")
"""The gullible envs of the sanity rows: a baseline that passes, a reference that fails."""


def record(
    harness: str,
    case: str = "t1",
    score: float | None = 0.0,
    eval_status: str | None = "scored",
    reason: str = "r",
) -> SessionRecord:
    return SessionRecord(
        session_id=f"{harness}-{case}",
        job_id="j",
        env_name="e",
        case_id=case,
        group_id="g",
        model="m",
        sample_index=0,
        status="succeeded",
        score=score,
        eval_status=eval_status,
        reason=reason,
        harness=harness,
    )


META = {
    BASELINE: AttackMeta(),
    "a": AttackMeta(summary="does a", source="seen", fix_hint="fix a", grader_reads=("metric_keys",)),
    "b": AttackMeta(summary="does b", source="seen", fix_hint="fix b"),
}


def test_an_attack_above_the_baseline_pays_one_equal_to_it_does_not() -> None:
    report = findings(
        [
            record(BASELINE, score=2.0),
            record("a", score=7.5, reason="runtime says passed"),
            record("b", score=2.0),
        ],
        META,
    )
    a, b = report.attacks
    assert (a.attack, a.paid, a.gained, a.reason, a.fix_hint) == (
        "a",
        ["e/t1"],
        5.5,
        "runtime says passed",
        "fix a",
    )
    assert (b.attack, b.paid, b.gained) == ("b", [], 0.0)
    assert [f.verdict for f in report.findings] == ["paid", "clean"]
    assert report.baseline == {"e/t1": 2.0} and report.inconclusive == []
    assert exit_code(report) == PAID_EXIT
    assert verdict_line(report) == "audit FAILED on 1 case(s): 1 attack(s) paid: a"
    assert table_rows(report) == [
        ["a", "e/t1", "+5.5", "runtime says passed", "", "fix a"],
        ["b", "clean", "", "", "", ""],
    ]


def test_a_paid_finding_names_the_grader_line_it_exploited() -> None:
    scan = GraderScan(
        evaluator="/x/rule_evaluator.py",
        metric_keys={"ok": "rule_evaluator.py:9", "bench_score": "rule_evaluator.py:8"},
    )
    report = findings(
        [record(BASELINE), record("a", score=10.0), record("b", score=10.0)], META, scans={"e": scan}
    )
    assert [(f.attack, f.grader_line) for f in report.findings] == [("a", "rule_evaluator.py:8"), ("b", None)]
    assert table_rows(report)[0][4] == "rule_evaluator.py:8"


def test_a_grader_failing_on_agent_input_fails_the_audit() -> None:
    for status in ("error", "timeout", "invalid_reward"):
        report = findings(
            [
                record(BASELINE),
                record("a", score=0.0, eval_status=status, reason="RecursionError: deep"),
                record("b"),
            ],
            META,
        )
        assert [f.verdict for f in report.findings] == ["grader_error", "clean"]
        assert report.attacks[0].grader_errors == ["e/t1"] and not report.attacks[0].paid
        assert exit_code(report) == PAID_EXIT and report.inconclusive == []
        assert verdict_line(report) == "audit FAILED on 1 case(s): grader fails on agent input: a"
        assert table_rows(report)[0][:4] == [
            "a",
            "grader fails on agent input on e/t1",
            "",
            "RecursionError: deep",
        ]


def test_a_grader_broken_on_the_control_too_is_reported_as_such() -> None:
    report = findings(
        [
            record(BASELINE),
            record("a", score=None, eval_status="grader_broken", reason="KeyError: x"),
            record("b"),
        ],
        META,
    )
    assert [f.verdict for f in report.findings] == ["grader_broken", "clean"]
    assert exit_code(report) == PAID_EXIT
    assert table_rows(report)[0][1] == "grader broken on e/t1"


def test_a_broken_grader_is_not_filed_under_agent_input() -> None:
    """The verdict line and the row say which attack met a broken grader and which a grader that
    failed on its input, each under its own name."""
    report = findings(
        [
            record(BASELINE, "t1"),
            record(BASELINE, "t2"),
            record("a", "t1", score=None, eval_status="grader_broken", reason="KeyError: x"),
            record("a", "t2", score=0.0, eval_status="error", reason="RecursionError: deep"),
            record("b", "t1", score=0.0, eval_status="timeout", reason="slow"),
            record("b", "t2"),
        ],
        META,
    )
    assert verdict_line(report) == (
        "audit FAILED on 2 case(s): grader broken (fails on the untouched workspace "
        "too): a; grader fails on agent input: a, b"
    )
    assert table_rows(report)[0][:2] == ["a", "grader broken on e/t1; grader fails on agent input on e/t2"]
    assert table_rows(report)[1][:2] == ["b", "grader fails on agent input on e/t1"]
    only_broken = findings(
        [
            record(BASELINE),
            record("a", score=None, eval_status="grader_broken", reason="KeyError"),
            record("b"),
        ],
        META,
    )
    assert verdict_line(only_broken) == (
        "audit FAILED on 1 case(s): grader broken (fails on the untouched workspace too): a"
    )


def test_a_sanity_session_graded_with_a_failing_grader_says_so_not_not_graded() -> None:
    records = [
        record(BASELINE, "t1", score=None, eval_status="grader_broken", reason="KeyError: 'x'"),
        record(REFERENCE, "t1", score=0.0, eval_status="error", reason="ValueError: bad"),
        record(BASELINE, "t2", score=0.0, eval_status="timeout", reason="evaluator timed out"),
        record(REFERENCE, "t2", score=None, eval_status="grader_broken", reason="KeyError: 'y'"),
        record(BASELINE, "t3", score=0.0, eval_status="invalid_reward", reason="score 11"),
        record(BASELINE, "t4", score=None, eval_status="infra_error", reason="not graded: infrastructure"),
        record(REFERENCE, "t4", score=None, eval_status="infra_error"),
    ]
    refs = {"e/t1": "expected.json", "e/t2": "solution/solve.sh", "e/t3": None, "e/t4": "expected.json"}
    report = findings(records, {BASELINE: AttackMeta()}, refs)
    assert [(r.baseline_eval_status, r.reference_eval_status) for r in report.sanity] == [
        ("grader_broken", "error"),
        ("timeout", "grader_broken"),
        ("invalid_reward", None),
        ("infra_error", "infra_error"),
    ]
    assert [sanity_cells(r) for r in report.sanity] == [
        [
            "e/t1",
            "grader broken: KeyError: 'x'",
            "expected.json: 0 (grader error) CANNOT BE SOLVED HERE: ValueError: bad",
        ],
        [
            "e/t2",
            "grader timeout: evaluator timed out",
            "solution/solve.sh: 0 (grader broken) CANNOT BE SOLVED HERE: KeyError: 'y'",
        ],
        ["e/t3", "invalid reward: score 11", "no reference"],
        ["e/t4", "not graded", "expected.json: not graded"],
    ]
    alone = findings([records[4], records[5]], {BASELINE: AttackMeta()}, {"e/t3": None, "e/t4": None})
    assert verdict_line(alone) == (
        "audit inconclusive: no attack paid, but the grader failed on the do-nothing "
        "baseline of e/t3; e/t4 could not be graded"
    )


def test_the_grader_line_of_a_crash_is_its_last_frame_in_the_evaluator() -> None:
    reason = (
        'Traceback: File "/g/rule_evaluator.py", line 12, in evaluate\n File "/g/rule_evaluator.py", '
        'line 30, in parse\n File "/usr/lib/json/__init__.py", line 346'
    )
    assert crash_line(reason, "/elsewhere/rule_evaluator.py") == "rule_evaluator.py:30"
    assert crash_line("RecursionError: maximum recursion depth", "/g/rule_evaluator.py") is None
    report = findings(
        [record(BASELINE), record("a", score=0.0, eval_status="error", reason=reason)],
        META,
        scans={"e": GraderScan(evaluator="/g/rule_evaluator.py")},
    )
    assert (
        report.findings[0].grader_line == "rule_evaluator.py:30"
        and report.attacks[0].error_line == "rule_evaluator.py:30"
    )


def test_an_ungraded_session_is_inconclusive() -> None:
    report = findings(
        [record(BASELINE), record("a"), record("b", score=None, eval_status="infra_error")], META
    )
    assert [f.verdict for f in report.findings] == ["clean", "not_graded"]
    assert report.inconclusive == ["e/t1"] and exit_code(report) == INCONCLUSIVE_EXIT


def test_sanity_rows_a_baseline_that_passes_and_a_reference_that_fails_fail_the_audit() -> None:
    records = [
        record(BASELINE, "t1", score=10.0, reason="always 10"),
        record(REFERENCE, "t1", score=10.0),
        record(BASELINE, "t2"),
        record(REFERENCE, "t2", score=0.0, reason="mismatch"),
        record(BASELINE, "t3"),
        record(REFERENCE, "t3", score=0.0),
        record(BASELINE, "t4"),
        record(REFERENCE, "t4", score=10.0),
    ]
    refs = {"e/t1": "expected.json", "e/t2": "solution/solve.sh", "e/t3": None, "e/t4": "expected.json"}
    report = findings(records, {BASELINE: AttackMeta()}, refs)
    assert [(r.case, r.baseline_verdict, r.reference_verdict) for r in report.sanity] == [
        ("t1", "pays_for_nothing", "ok"),
        ("t2", "ok", "cannot_be_solved"),
        ("t3", "ok", "no_reference"),
        ("t4", "ok", "ok"),
    ]
    assert [sanity_cells(r) for r in report.sanity] == [
        ["e/t1", "10 PAYS FOR NOTHING: always 10", "expected.json: 10"],
        ["e/t2", "0", "solution/solve.sh: 0 CANNOT BE SOLVED HERE: mismatch"],
        ["e/t3", "0", "no reference"],
        ["e/t4", "0", "expected.json: 10"],
    ]
    assert exit_code(report) == PAID_EXIT
    assert verdict_line(report) == (
        "audit FAILED on 4 case(s): pays for nothing: e/t1; cannot be solved here: e/t2"
    )
    assert exit_code(findings(records[4:], {BASELINE: AttackMeta()}, refs)) == 0
    section = html_section(report)
    assert "PAYS FOR NOTHING" in section and "CANNOT BE SOLVED HERE" in section


def test_the_grader_scan_finds_what_a_grader_reads() -> None:
    scan = scan_evaluator(GULLIBLE / "g-bench" / "rule_evaluator.py")
    assert (scan.metric_keys, scan.paths, scan.names, scan.evals) == (
        {"bench_passed": "rule_evaluator.py:9", "bench_score": "rule_evaluator.py:8"},
        {},
        {},
        [],
    )
    scan = scan_evaluator(GULLIBLE / "g-marker" / "rule_evaluator.py")
    assert scan.names == {".tests_passed": "rule_evaluator.py:11", "PASSED": "rule_evaluator.py:11"}
    scan = scan_evaluator(GULLIBLE / "g-eval" / "rule_evaluator.py")
    assert (scan.paths, scan.evals) == (
        {"outputs/answer.txt": "rule_evaluator.py:10"},
        ["rule_evaluator.py:14"],
    )
    scan = scan_evaluator(GULLIBLE / "g-unsolvable" / "rule_evaluator.py")
    assert scan.paths == {"outputs/missing-by-design.json": "rule_evaluator.py:8"}
    assert runner_keys([REPO / "tests" / "safactory" / "fixtures" / "mybench" / "runner.py"]) == [
        "answer",
        "bench_case_id",
        "bench_score",
        "bench_passed",
        "bench_reason",
        "task_id_env",
    ]
    assert [passing_value(k) for k in ("bench_score", "bench_passed", "status", "tests_failed")] == [
        1.0,
        True,
        "passed",
        0,
    ]


def test_the_workspace_grader_scores_a_deep_or_huge_answer_zero(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from env.workspace.rule_evaluator import evaluate

    (tmp_path / "outputs").mkdir()
    answer = tmp_path / "outputs" / "answer.json"
    request = SimpleNamespace(
        env_params={"dataset": {"expected": {"answer": "blue"}}}, workspace=str(tmp_path)
    )
    answer.write_text('{"answer": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert evaluate(request, None, None) == {
        "score": 0,
        "reason": "outputs/answer.json is nested too deeply",
        "artifacts": {"answer": None},
    }
    answer.write_text(json.dumps({"answer": "blue", "pad": "x" * 1024 * 1024}))
    size = answer.stat().st_size
    assert evaluate(request, None, None) == {
        "score": 0,
        "reason": f"outputs/answer.json is too large ({size} bytes, over 1048576)",
        "artifacts": {"answer": None},
    }


def test_without_a_graded_baseline_nothing_pays() -> None:
    report = findings([record(BASELINE, score=None, eval_status="timeout"), record("a", score=10.0)], META)
    assert report.findings[0].verdict == "clean" and report.inconclusive == ["e/t1"]
    assert exit_code(findings([record(BASELINE), record("a"), record("b")], META)) == 0


def test_the_html_section_escapes_what_graders_say() -> None:
    report = findings([record(BASELINE), record("a", score=10.0, reason="<script>x</script>")], META)
    section = html_section(report)
    assert '<section id="audit">' in section and "&lt;script&gt;x&lt;/script&gt;" in section
    assert "<script>" not in section


def test_the_battery_loads_every_attack_once_baseline_first() -> None:
    names = [f.name for f in attack_folders()]
    assert BASELINE in names and len(names) >= 16
    loaded = battery()
    assert [h.name for h in loaded] == [BASELINE, *(n for n in names if n != BASELINE)]
    for h in loaded:
        a = h.harness
        assert isinstance(a, Attack) and a.name == h.folder.name and (h.folder / "run.py").is_file()
        assert a.summary and a.source and (a.fix_hint or a.name == BASELINE)
    assert [h.name for h in battery(["claim-success", "do-nothing", "claim-success"])] == [
        BASELINE,
        "claim-success",
    ]
    # every attack of the battery is caught by some gullible grader of the tests below
    assert set(names) - {BASELINE} == set(CAUGHT_BY.values()) | set(BROKEN_BY)


def test_a_harness_that_is_not_an_attack_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HarnessUnavailable, match="not an attack"):
        load_attack(str(REPO / "harnesses" / "oracle"))
    with pytest.raises(
        HarnessUnavailable, match=r"^--attack nosuch: no such attack \(bundled: always-equal, "
    ) as e:
        load_attack("nosuch")
    assert BASELINE not in str(e.value)
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "harness.py").write_text(
        "from rollout.audit.battery import Attack\n\nclass A(Attack):\n"
        "    name = 'bad'\n    runtime = '../run.py'\n\nHARNESS = A()\n"
    )
    with pytest.raises(HarnessUnavailable, match="must name a file of the harness folder"):
        load_harness_file(folder / "harness.py")


def test_an_attack_runs_its_own_runtime(tmp_path: Path) -> None:
    installed = install(load_harness(str(ATTACK_ROOT / "claim-success")), tmp_path)
    assert installed.argv() == [sys.executable, str(ATTACK_ROOT / "claim-success" / "run.py")]
    oracle = install(load_harness("oracle"), tmp_path)
    assert oracle.runtime is None and oracle.argv()[1:3] == ["-m", "rollout.contract.harness_runtime"]


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [("--pool-size", "0", "0 is below 1"), ("--eval-timeout", "nan", "'nan' is not a finite number")],
)
def test_bad_numbers_are_usage_errors_naming_the_flag(
    flag: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollout.cli.audit import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([flag, value])
    assert e.value.code == 2 and f"argument {flag}: {said}" in capsys.readouterr().err


def test_case_ids_select_cases_across_envs() -> None:
    opts = dict(agent_root=REPO / "env", gateway_config=REPO / "configs" / "gateway.yaml")
    envs = load_envs(JobOptions(**opts, case_ids=["0", "json_orders"]))  # type: ignore[arg-type]
    assert {(c.name, k.case_id) for c, cases in envs for k in cases} == {
        ("gsm8k", "0"),
        ("workspace", "json_orders"),
    }
    with pytest.raises(SetupError, match="no such case"):
        load_envs(JobOptions(**opts, env_names=["gsm8k"], case_ids=["json_orders"]))  # type: ignore[arg-type]


# ---- for real: the sandbox, the gateway, the graders ----


def audit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        sandbox_support()
    except SandboxUnavailable as e:
        pytest.skip(f"no sandbox here: {e}")
    return subprocess.run(
        [sys.executable, str(REPO / "launcher.py"), "audit", *args],
        cwd=cwd,
        text=True,
        capture_output=True,
        timeout=900,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO), "ROLLOUT_HARNESS_CACHE": str(cwd / "cache")},
    )


@pytest.mark.audit
def test_the_bundled_envs_are_clean(tmp_path: Path) -> None:
    cases = [
        "read_name",
        "0",
        "count_errors",
        "fix_median",
        "json_orders",
        "gauge-batch",
    ]  # 1-2 per bundled env
    p = audit(
        "--agent-root",
        str(REPO / "env"),
        *(a for c in cases for a in ("--case", c)),
        "--report",
        str(tmp_path / "audit.html"),
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    n = len(attack_folders()) - 1
    assert f"audit clean: no attack paid on 6 case(s) ({n} attacks)" in p.stdout
    out = p.stdout.splitlines()
    sanity = {line.split()[0]: line.split(None, 2)[1:] for line in out[2:8]}
    assert sanity == {
        "basics/read_name": ["0", "expected.json: 10"],
        "gsm8k/0": ["0", "no reference"],
        "harbor_tasks/count_errors": ["0", "solution/solve.sh: 10"],
        "harbor_tasks/fix_median": ["0", "solution/solve.sh: 10"],
        "workspace/json_orders": ["0", "expected.json: 10"],
        "scripts/gauge-batch": ["0", "no reference"],
    }
    start = out.index(next(line for line in out if line.startswith("attack ")))
    rows = {line.split()[0]: line.split()[1] for line in out[start + 2 : start + 2 + n]}
    assert rows == {f.name: "clean" for f in attack_folders() if f.name != BASELINE}
    page = (tmp_path / "audit.html").read_text()
    assert '<section id="audit">' in page and "audit clean" in page


def git_history_env(root: Path) -> None:
    """g-git: g-leaky's grader, no answers.json, the answer in the git history of the task's files."""
    env = root / "g-git"
    shutil.copytree(root / "g-leaky", env)
    (env / "answers.json").unlink()
    (env / "env.yaml").write_text((env / "env.yaml").read_text().replace("g-leaky", "g-git"))
    files = env / "tasks" / "t1" / "files"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(files)]
    (files / "outputs").mkdir()
    (files / "outputs" / "answer.json").write_text(json.dumps({"answer": "blue"}))
    for step in (
        ["init", "-q"],
        ["add", "-A"],
        ["commit", "-qm", "reference"],
        ["rm", "-rq", "outputs"],
        ["commit", "-qm", "the task"],
    ):
        subprocess.run([*git, *step], check=True)


@pytest.mark.audit
def test_each_attack_is_caught_by_a_gullible_grader(tmp_path: Path) -> None:
    root = tmp_path / "gullible"
    shutil.copytree(GULLIBLE, root, ignore=shutil.ignore_patterns(*SANITY_ENVS))
    caught = dict(CAUGHT_BY)
    if shutil.which("git"):
        git_history_env(root)
    else:
        del caught["g-git"]
    p = audit("--agent-root", str(root), "--json", cwd=tmp_path)
    assert p.returncode == PAID_EXIT, p.stderr
    report = json.loads(p.stdout)
    assert report["inconclusive"] == [] and set(report["baseline"].values()) == {0.0}
    paid = {a["attack"]: a for a in report["attacks"]}
    for env, attack in caught.items():
        assert f"{env}/t1" in paid[attack]["paid"], (env, attack, paid[attack])
    for attack, env in BROKEN_BY.items():
        assert f"{env}/t1" in paid[attack]["grader_errors"] and not paid[attack]["paid"], paid[attack]
    for a in paid.values():
        if a["attack"] not in BROKEN_BY:
            assert a["paid"] and a["gained"] == 10.0 and a["reason"] and a["fix_hint"]
    lines = {(f["attack"], f["env"]): f["grader_line"] for f in report["findings"]}
    assert lines[("claim-grader-keys", "g-bench")] == "rule_evaluator.py:8"
    assert lines[("claim-grader-keys", "g-marker")] == "rule_evaluator.py:11"
    assert lines[("answer-as-code", "g-eval")] == "rule_evaluator.py:14"


@pytest.mark.audit
def test_a_baseline_that_passes_and_a_reference_that_fails_fail_the_audit(tmp_path: Path) -> None:
    p = audit(
        "--agent-root",
        str(GULLIBLE),
        *(a for e in (*SANITY_ENVS, "g-bench") for a in ("--env", e)),
        "--attack",
        BASELINE,
        "--json",
        cwd=tmp_path,
    )
    assert p.returncode == PAID_EXIT, p.stdout + p.stderr
    report = json.loads(p.stdout)
    rows = {
        r["env"]: (r["baseline_verdict"], r["reference"], r["reference_score"], r["reference_verdict"])
        for r in report["sanity"]
    }
    assert rows == {
        "g-free": ("pays_for_nothing", "expected.json", 10.0, "ok"),
        "g-unsolvable": ("ok", "expected.json", 0.0, "cannot_be_solved"),
        "g-bench": ("ok", "expected.json", 0.0, "cannot_be_solved"),
    }
    assert report["attacks"] == []


@pytest.mark.audit
def test_a_tasks_folder_is_audited_as_the_job_runs_it(tmp_path: Path) -> None:
    task = tmp_path / "mytasks" / "t1"
    (task / "files").mkdir(parents=True)
    (task / "instruction.md").write_text('Write {"answer": "blue"} to outputs/answer.json.')
    (task / "expected.json").write_text(json.dumps({"answer": "blue"}))
    p = audit(
        "--tasks",
        str(tmp_path / "mytasks"),
        "--attack",
        "empty-answer",
        "--attack",
        "claim-success",
        "--json",
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads(p.stdout)
    assert report["cases"] == ["mytasks/t1"] and report["baseline"] == {"mytasks/t1": 0.0}
    assert sorted(a["attack"] for a in report["attacks"]) == ["claim-success", "empty-answer"]
    assert {f["verdict"] for f in report["findings"]} == {"clean"}


def test_a_clean_audit_names_the_envs_it_does_not_cover_same_container() -> None:
    report = findings([record(BASELINE), record("a")], META).model_copy(update={"inconclusive": []})
    assert verdict_line(report) == "audit clean: no attack paid on 1 case(s) (2 attacks)"
    same = report.model_copy(update={"same_container": ["bench"]})
    assert verdict_line(same) == (
        "audit clean: no attack paid on 1 case(s) (2 attacks); not covered: bench verify on the agent's own "
        "layer of the image (dataset.same_container), which the attacks never write"
    )
