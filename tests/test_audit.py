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

from rollout.audit.audit import INCONCLUSIVE_EXIT, PAID_EXIT, exit_code, findings
from rollout.audit.battery import ATTACK_ROOT, BASELINE, Attack, attack_folders, battery, load_attack
from rollout.audit.report import html_section, table_rows, verdict_line
from rollout.contract.harness import HarnessUnavailable, load_harness_file
from rollout.core.setup import SetupError
from rollout.jobs.job import JobOptions, load_envs
from rollout.results.report import SessionRecord
from rollout.sandbox.bwrap import SandboxUnavailable
from rollout.sandbox.harness_cache import install, load_harness
from rollout.sandbox.runner import sandbox_support

REPO = Path(__file__).resolve().parents[1]
GULLIBLE = REPO / "tests" / "fixtures" / "gullible"
CAUGHT_BY = {
    "g-empty": "empty-answer", "g-malformed": "malformed-answer", "g-link": "answer-link", "g-fifo": "answer-fifo",
    "g-huge": "huge-answer", "g-metrics": "claim-success", "g-eq": "always-equal", "g-exit": "exit-early",
    "g-harbor": "exit-early", "g-hooks": "planted-hooks", "g-tests": "tests-tampered", "g-path": "shadow-path",
    "g-leaky": "read-hidden", "g-git": "read-hidden", "g-echo": "echo-instruction",
    "g-candidates": "every-candidate", "g-overlap": "longest-answer",
}
"""Each gullible env (tests/fixtures/gullible/, g-git made by the test) and the attack that must pay there."""


def record(harness: str, case: str = "t1", score: float | None = 0.0, eval_status: str | None = "scored",
           reason: str = "r") -> SessionRecord:
    return SessionRecord(session_id=f"{harness}-{case}", job_id="j", env_name="e", case_id=case, group_id="g",
                         model="m", sample_index=0, status="succeeded", score=score, eval_status=eval_status,
                         reason=reason, harness=harness)


META = {BASELINE: ("", "", ""), "a": ("does a", "seen", "fix a"), "b": ("does b", "seen", "fix b")}


def test_an_attack_above_the_baseline_pays_one_equal_to_it_does_not() -> None:
    report = findings([record(BASELINE, score=2.0), record("a", score=7.5, reason="runtime says passed"),
                       record("b", score=2.0)], META)
    a, b = report.attacks
    assert (a.attack, a.paid, a.gained, a.reason, a.fix_hint) == ("a", ["e/t1"], 5.5, "runtime says passed", "fix a")
    assert (b.attack, b.paid, b.gained) == ("b", [], 0.0)
    assert [f.verdict for f in report.findings] == ["paid", "clean"]
    assert report.baseline == {"e/t1": 2.0} and report.inconclusive == []
    assert exit_code(report) == PAID_EXIT
    assert verdict_line(report).startswith("audit FAILED: 1 attack(s) paid on 1 case(s): a")
    assert table_rows(report) == [["a", "e/t1", "+5.5", "runtime says passed", "fix a"], ["b", "clean", "", "", ""]]


def test_a_grader_error_is_no_pay_and_an_ungraded_session_is_inconclusive() -> None:
    report = findings([record(BASELINE), record("a", score=0.0, eval_status="error", reason="KeyError"),
                       record("b", score=None, eval_status="infra_error")], META)
    assert [f.verdict for f in report.findings] == ["grader_error", "not_graded"]
    assert report.attacks[0].grader_errors == ["e/t1"] and not report.attacks[0].paid
    assert report.inconclusive == ["e/t1"] and exit_code(report) == INCONCLUSIVE_EXIT
    assert table_rows(report)[0][1] == "clean (grader error on e/t1)"


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
    assert [h.name for h in battery(["claim-success", "do-nothing", "claim-success"])] == [BASELINE, "claim-success"]
    # every attack of the battery is caught by some gullible grader of the tests below
    assert set(names) - {BASELINE} == set(CAUGHT_BY.values())


def test_a_harness_that_is_not_an_attack_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HarnessUnavailable, match="not an attack"):
        load_attack(str(REPO / "harnesses" / "oracle"))
    with pytest.raises(HarnessUnavailable, match=r"^--attack nosuch: no such attack \(bundled: always-equal, ") as e:
        load_attack("nosuch")
    assert BASELINE not in str(e.value)
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "harness.py").write_text("from rollout.audit.battery import Attack\n\nclass A(Attack):\n"
                                       "    name = 'bad'\n    runtime = '../run.py'\n\nHARNESS = A()\n")
    with pytest.raises(HarnessUnavailable, match="must name a file of the harness folder"):
        load_harness_file(folder / "harness.py")


def test_an_attack_runs_its_own_runtime(tmp_path: Path) -> None:
    installed = install(load_harness(str(ATTACK_ROOT / "claim-success")), tmp_path)
    assert installed.argv() == [sys.executable, str(ATTACK_ROOT / "claim-success" / "run.py")]
    oracle = install(load_harness("oracle"), tmp_path)
    assert oracle.runtime is None and oracle.argv()[1:3] == ["-m", "rollout.contract.harness_runtime"]


@pytest.mark.parametrize(("flag", "value", "said"), [("--pool-size", "0", "0 is below 1"),
                                                   ("--eval-timeout", "nan", "'nan' is not a finite number")])
def test_bad_numbers_are_usage_errors_naming_the_flag(flag: str, value: str, said: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from rollout.cli.audit import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([flag, value])
    assert e.value.code == 2 and f"argument {flag}: {said}" in capsys.readouterr().err


def test_case_ids_select_cases_across_envs() -> None:
    opts = dict(agent_root=REPO / "env", gateway_config=REPO / "configs" / "gateway.yaml")
    envs = load_envs(JobOptions(**opts, case_ids=["0", "json_orders"]))  # type: ignore[arg-type]
    assert {(c.name, k.case_id) for c, cases in envs for k in cases} == {("gsm8k", "0"), ("workspace", "json_orders")}
    with pytest.raises(SetupError, match="no such case"):
        load_envs(JobOptions(**opts, env_names=["gsm8k"], case_ids=["json_orders"]))  # type: ignore[arg-type]


# ---- for real: the sandbox, the gateway, the graders ----

def audit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        sandbox_support()
    except SandboxUnavailable as e:
        pytest.skip(f"no sandbox here: {e}")
    return subprocess.run([sys.executable, str(REPO / "launcher.py"), "audit", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=900, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO), "ROLLOUT_HARNESS_CACHE": str(cwd / "cache")})


@pytest.mark.audit
def test_the_bundled_envs_are_clean(tmp_path: Path) -> None:
    cases = ["read_name", "0", "count_errors", "fix_median", "json_orders"]  # one or two per bundled env
    p = audit("--agent-root", str(REPO / "env"), *(a for c in cases for a in ("--case", c)),
              "--report", str(tmp_path / "audit.html"), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "audit clean: no attack paid on 5 case(s) (15 attacks)" in p.stdout
    rows = {line.split()[0]: line.split()[1] for line in p.stdout.splitlines()[2:17]}
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
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "reference"], ["rm", "-rq", "outputs"],
                 ["commit", "-qm", "the task"]):
        subprocess.run([*git, *step], check=True)


@pytest.mark.audit
def test_each_attack_is_caught_by_a_gullible_grader(tmp_path: Path) -> None:
    root = tmp_path / "gullible"
    shutil.copytree(GULLIBLE, root)
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
    for a in paid.values():
        assert a["paid"] and a["gained"] == 10.0 and a["reason"] and a["fix_hint"]


@pytest.mark.audit
def test_a_tasks_folder_is_audited_as_the_job_runs_it(tmp_path: Path) -> None:
    task = tmp_path / "mytasks" / "t1"
    (task / "files").mkdir(parents=True)
    (task / "instruction.md").write_text("Write {\"answer\": \"blue\"} to outputs/answer.json.")
    (task / "expected.json").write_text(json.dumps({"answer": "blue"}))
    p = audit("--tasks", str(tmp_path / "mytasks"), "--attack", "empty-answer", "--attack", "claim-success",
              "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads(p.stdout)
    assert report["cases"] == ["mytasks/t1"] and report["baseline"] == {"mytasks/t1": 0.0}
    assert sorted(a["attack"] for a in report["attacks"]) == ["claim-success", "empty-answer"]
    assert {f["verdict"] for f in report["findings"]} == {"clean"}
