"""What a job runs and how it tells a runtime so, without running it: ``--case`` (nearest ids),
``--tasks`` folders as envs, ``--timeout``, ``evaluation: none`` and a missing evaluator, the
case id and instruction given to a runtime and a harness, ``launcher.py --help`` and ``list``."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from rollout.cli.run import COMMANDS, build_parser, job_options, main
from rollout.contract.harness_runtime import context
from rollout.contract.protocol import SimulationStartRequest
from rollout.core.envs import (
    EXPECTED_JSON_EVALUATOR,
    EnvConfigError,
    load_cases,
    load_env_config,
    session_config,
    task_folder_env,
)
from rollout.core.plan import select_cases
from rollout.core.setup import SetupError
from rollout.grading.evaluator_loader import env_evaluator
from rollout.jobs.options import JobOptions
from rollout.jobs.prepare import check_evaluators, load_envs, select_envs
from rollout.sandbox.bwrap import INSTRUCTION, SandboxSpec, Support, bwrap_command
from rollout.sandbox.runner import case_instruction, task_env

REPO = Path(__file__).resolve().parents[2]
BASICS = REPO / "env" / "basics" / "tasks"
HARBOR = REPO / "env" / "harbor_tasks" / "tasks"


def opts(**kw: object) -> JobOptions:
    return JobOptions(gateway_config=REPO / "configs" / "gateway.yaml", **kw)  # type: ignore[arg-type]


def test_case_runs_the_named_cases_across_envs_and_an_unknown_id_names_the_nearest() -> None:
    envs = load_envs(opts(agent_root=REPO / "env", case_ids=["tally", "0"]))
    assert {(c.name, k.case_id) for c, cases in envs for k in cases} == {("basics", "tally"), ("gsm8k", "0")}
    with pytest.raises(SetupError) as ei:
        load_envs(opts(agent_root=REPO / "env", env_names=["basics"], case_ids=["taly", "read_name", "zzz"]))
    assert str(ei.value) == "--case: no such case 'taly' (nearest: tally); 'zzz' in env(s) basics"
    everything = load_envs(opts(agent_root=REPO / "env"))
    assert select_cases(everything, []) is everything  # no --case: every case


def test_an_unknown_case_that_is_a_rows_own_id_field_says_how_to_make_it_the_id(tmp_path: Path) -> None:
    env = tmp_path / "envs" / "mine"
    env.mkdir(parents=True)
    (env / "env.yaml").write_text("name: mine\ndataset: {path: cases.jsonl}\nruntime: {command: [x]}\n")
    (env / "cases.jsonl").write_text('{"id": "big", "answer": 42}\n{"id": "small", "answer": 1}\n')
    envs = load_envs(opts(agent_root=tmp_path / "envs"))
    assert [c.case_id for _, cases in envs for c in cases] == ["0", "1"]
    with pytest.raises(SetupError) as ei:
        select_cases(envs, ["big"])
    assert str(ei.value) == (
        "--case: no such case 'big' in env(s) mine; env mine numbers its cases by line: its rows' "
        "'id' is not their id unless its env.yaml says dataset.id_field: id"
    )
    with pytest.raises(SetupError) as ei:  # an answer's value is no id: no hint
        select_cases(envs, ["42"])
    assert str(ei.value) == "--case: no such case '42' in env(s) mine"


def test_a_folder_of_expected_json_tasks_is_an_env_graded_by_the_bundled_rule(tmp_path: Path) -> None:
    shutil.copytree(BASICS, tmp_path / "mybench" / "tasks")
    cfg = task_folder_env(tmp_path / "mybench" / "tasks")
    assert (cfg.name, cfg.dataset.format, cfg.runtime.command) == (
        "mybench",
        "task_dirs",
        ["{python}", "-m", "env.task_runtime"],
    )
    assert cfg.from_tasks_flag and env_evaluator(tmp_path, cfg) == EXPECTED_JSON_EVALUATOR
    assert [c.case_id for c in load_cases(cfg)] == ["read_name", "run_script", "tally"]
    assert cfg.dataset_path() in cfg.hidden_paths()  # expected.json never reaches the runtime
    assert load_cases(cfg)[0].public_row().keys() == {"id", "instruction"}
    other = task_folder_env(tmp_path / "mybench")  # not called tasks: its own name
    assert other.name == "mybench" and other.own_evaluator == EXPECTED_JSON_EVALUATOR
    # an env.yaml cannot claim the evaluator of a --tasks env
    assert not load_env_config(REPO / "env" / "basics" / "env.yaml").from_tasks_flag
    with pytest.raises(EnvConfigError, match="not a folder"):
        task_folder_env(tmp_path / "nowhere")


def test_a_folder_of_harbor_tasks_is_graded_by_their_tests(tmp_path: Path) -> None:
    cfg = task_folder_env(HARBOR)
    assert (cfg.name, cfg.dataset.format, cfg.params) == ("harbor_tasks", "harbor", {"answer_file": False})
    assert env_evaluator(tmp_path, cfg) is None  # the env/harbor_tasks name finds nothing: its tests grade
    envs = load_envs(
        opts(tasks=[HARBOR, BASICS], agent_root=tmp_path)
    )  # --tasks: the agent root is not scanned
    assert [c.name for c, _ in envs] == ["harbor_tasks", "basics"]


def test_the_oracle_on_a_task_without_a_reference_solution_is_refused_before_the_job(tmp_path: Path) -> None:
    """Its session could only fail, and the failure is not the agent's: refused with the cases named."""
    tasks = tmp_path / "mybench"
    shutil.copytree(HARBOR, tasks)
    assert [
        c.case_id for _, cases in select_envs(opts(tasks=[tasks], harness=["oracle"]))[0] for c in cases
    ] == [
        "count_errors",
        "fix_median",
    ]
    (tasks / "fix_median" / "solution" / "solve.sh").unlink()
    with pytest.raises(SetupError) as ei:
        select_envs(opts(tasks=[tasks], harness=["oracle"]))
    assert str(ei.value) == (
        "--harness oracle runs each case's reference solution (a Harbor task's solution/solve.sh); 1 case "
        "has none: mybench/fix_median (select cases that have one with --case, or drop --harness oracle)"
    )
    chosen = opts(tasks=[tasks], harness=["oracle"], case_ids=["count_errors"])
    assert select_envs(chosen)[0]  # the case that has one runs
    assert select_envs(opts(tasks=[tasks], harness=["bash-agent"]))[0]  # other harnesses need none


def test_timeout_overrides_the_envs_and_a_harbor_tasks_own() -> None:
    args = build_parser().parse_args(["--timeout", "7.5", "--case", "a", "--case", "b", "--tasks", "t"])
    o = job_options(args)
    assert (o.timeout, o.case_ids, o.tasks) == (7.5, ["a", "b"], [Path("t")])
    with pytest.raises(SetupError, match=r"^--timeout: Input should be greater than 0 \(got 0\.0\)$"):
        job_options(build_parser().parse_args(["--timeout", "0"]))
    harbor = task_folder_env(HARBOR)
    case = next(c for c in load_cases(harbor) if c.row.get("agent_timeout_s"))
    assert session_config(harbor, case).runtime.timeout_s == case.row["agent_timeout_s"]
    assert session_config(harbor, case, 7.5).runtime.timeout_s == 7.5
    basics = load_env_config(REPO / "env" / "basics" / "env.yaml")
    assert session_config(basics, load_cases(basics)[0], 3.0).runtime.timeout_s == 3.0
    assert session_config(basics, load_cases(basics)[0]).runtime.timeout_s == 300


def test_a_missing_evaluator_is_a_setup_error_unless_the_env_is_ungraded(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    (root / "plain" / "tasks").parent.mkdir(parents=True)
    shutil.copytree(BASICS, root / "plain" / "tasks")
    (root / "plain" / "env.yaml").write_text(
        "dataset: {format: task_dirs, path: tasks}\n"
        "runtime: {command: ['{python}', '-m', 'env.task_runtime']}\n"
    )
    plain = load_env_config(root / "plain" / "env.yaml")
    with pytest.raises(SetupError) as ei:
        check_evaluators(root, [plain, task_folder_env(HARBOR)])  # a Harbor env needs none
    assert str(ei.value) == (
        f"--enable-evaluation: no evaluator: env 'plain' needs {root}/plain/rule_evaluator.py; "
        "or set `evaluation: none` in its env.yaml to run it ungraded"
    )
    (root / "plain" / "env.yaml").write_text((root / "plain" / "env.yaml").read_text() + "evaluation: none\n")
    ungraded = load_env_config(root / "plain" / "env.yaml")
    check_evaluators(root, [ungraded])
    (root / "plain" / "rule_evaluator.py").write_text("def evaluate(r, s, t):\n    return 10\n")
    assert env_evaluator(root, ungraded) is None  # none: not graded even with an evaluator beside it
    assert env_evaluator(root, plain) == root / "plain" / "rule_evaluator.py"
    with pytest.raises(EnvConfigError, match="evaluation"):
        (root / "plain" / "env.yaml").write_text(
            (root / "plain" / "env.yaml").read_text() + "evaluation: maybe\n"
        )
        load_env_config(root / "plain" / "env.yaml")


def test_the_runtime_and_the_harness_are_told_their_case(tmp_path: Path) -> None:
    req = SimulationStartRequest(
        job_id="j",
        session_id="s",
        agent_name="a",
        agent_id="a-0",
        group_id="g",
        gateway_base_url="http://127.0.0.1:1/v1/sessions/s",
        model="m",
        env_params={"dataset": {"id": "t1", "instruction": "do it"}},
        case_id="t1",
    )
    assert case_instruction(req) == "do it"
    assert task_env(req) == {"ROLLOUT_CASE_ID": "t1"}
    told = req.model_copy(update={"instruction_path": INSTRUCTION})
    assert task_env(told) == {"ROLLOUT_CASE_ID": "t1", "ROLLOUT_INSTRUCTION_PATH": INSTRUCTION}
    ctx = context(told, tmp_path, tmp_path, tmp_path)
    assert (ctx.instruction, ctx.case_id, ctx.instruction_path) == ("do it", "t1", INSTRUCTION)
    assert case_instruction(req.model_copy(update={"env_params": {"dataset": {"q": "1+1"}}})) is None
    # the instruction file is bound read-only at INSTRUCTION, only when there is one
    spec = SandboxSpec(
        workspace=tmp_path,
        code=[],
        files=[],
        bridge_socket=tmp_path / "gw.sock",
        status_fd=3,
        tmp_bytes=None,
        instruction=tmp_path / "instruction.md",
    )
    argv = bwrap_command(Support(bwrap="bwrap"), spec, ["true"])
    i = argv.index(INSTRUCTION)
    assert argv[i - 2 : i + 1] == ["--ro-bind", str(tmp_path / "instruction.md"), INSTRUCTION]
    bare = dataclasses.replace(spec, instruction=None)
    assert INSTRUCTION not in bwrap_command(Support(bwrap="bwrap"), bare, ["true"])


def test_help_lists_every_command_and_the_flag_style_run_is_unchanged(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as ei:
        main(["--help"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    for verb in ("list", "view", "report", "feed", "export", "serve", "train", "audit"):
        assert [line for line in out.splitlines() if line.startswith(f"  {verb} ")], verb
    assert {c for c, _ in COMMANDS} == {
        "list",
        "view",
        "report",
        "feed",
        "export",
        "serve",
        "train",
        "audit",
        "grade",
        "images",
    }
    assert "--case ID" in out and "--tasks DIR" in out and "--timeout S" in out and "3 infrastructure" in out
    assert build_parser().parse_args(["--env", "basics", "--pool-size", "2"]).pool_size == 2


def test_list_prints_envs_cases_harnesses_and_routes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--agent-root", str(REPO / "env")]) == 0
    out = capsys.readouterr().out
    table = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  ")}
    assert out.splitlines()[1].split() == [
        "env",
        "format",
        "cases",
        "samples",
        "max",
        "steps",
        "timeout",
        "graded",
        "by",
    ]
    assert table["basics"] == [
        "task_dirs",
        "3",
        "4",
        "3",
        "300",
        "s",
        str(REPO / "env/basics/rule_evaluator.py"),
    ]
    assert table["harbor_tasks"] == ["harbor", "2", "1", "2", "per", "task", "600", "s", "tests"]
    assert table["workspace"][:6] == ["task_dirs", "5", "1", "12", "600", "s"]
    assert "  oracle " in out and "local (default)" in out
    assert main(["list", "--agent-root", str(REPO / "env"), "--env", "basics", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    [basics] = listing["envs"]
    assert basics["case_ids"] == ["read_name", "run_script", "tally"] and basics["cases"] == 3
    assert (basics["group_size"], basics["max_steps"], basics["timeout_s"]) == (4, 3, 300.0)
    assert "task_timeout_s" not in basics
    assert main(["list", "--agent-root", str(REPO / "env"), "--env", "harbor_tasks", "--json"]) == 0
    [harbor] = json.loads(capsys.readouterr().out)["envs"]
    assert (harbor["group_size"], harbor["max_steps"], harbor["timeout_s"], harbor["task_timeout_s"]) == (
        1,
        2,
        300.0,
        [600.0, 600.0],
    )
    assert basics["grader"].endswith("env/basics/rule_evaluator.py")
    assert "bash-agent" in [h["name"] for h in listing["harnesses"]]
    assert [(r["route"], r["default"]) for r in listing["routes"]][0] == ("local", True)
    assert main(["list", "--tasks", str(BASICS), "--json"]) == 0
    [tasks] = json.loads(capsys.readouterr().out)["envs"]
    assert (tasks["name"], tasks["grader"]) == ("basics", str(EXPECTED_JSON_EVALUATOR))
    assert main(["list", "--agent-root", str(REPO / "env"), "--env", "nope"]) == 1
    assert "error: --env: no such env 'nope' (envs here: " in capsys.readouterr().err


def test_list_takes_a_safactory_pair_and_a_broken_env_asked_for_is_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mybench = REPO / "tests" / "safactory" / "fixtures" / "mybench"
    assert (
        main(
            [
                "list",
                "--agent-config",
                str(mybench / "mybench_config.yaml"),
                "--agent-start-config",
                str(mybench / "mybench_start.yaml"),
                "--env",
                "mybench",
                "--json",
            ]
        )
        == 0
    )
    [env] = json.loads(capsys.readouterr().out)["envs"]
    assert (env["name"], env["format"], env["case_ids"]) == ("mybench", "jsonl", ["0", "1"])
    broken = tmp_path / "tasks" / "t1"
    broken.mkdir(parents=True)
    (broken / "instruction.md").write_text("do it")
    (broken / "expected.json").write_text("{}")
    assert main(["list", "--tasks", str(tmp_path / "tasks")]) == 1
    assert "  error: " in capsys.readouterr().out


def test_list_into_a_closed_pipe_exits_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import os
    import sys

    read, write = os.pipe()
    os.close(read)  # `| head` that has read all it wanted
    with os.fdopen(write, "w") as closed:
        monkeypatch.setattr(sys, "stdout", closed)
        assert main(["list", "--agent-root", str(REPO / "env")]) == 0
    assert capsys.readouterr().err == ""


def test_a_regrade_takes_tasks_folders_and_refuses_case_and_timeout() -> None:
    from rollout.cli.run import regrade_options

    assert regrade_options(
        build_parser().parse_args(["--regrade", "--job-id", "j", "--tasks", "t"])
    ).tasks == [Path("t")]
    with pytest.raises(SetupError) as ei:
        regrade_options(
            build_parser().parse_args(["--regrade", "--job-id", "j", "--case", "x", "--timeout", "3"])
        )
    assert (
        str(ei.value)
        == "--regrade runs no session and calls no model: --case, --timeout cannot be used with it"
    )


def test_another_tools_task_flag_is_refused_not_read_as_tasks(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--task", "c1"], ["--task=c1"]):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(argv)
        assert e.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            "launcher.py: error: --task is not a flag of the launcher: --case ID runs one case (repeatable), "
            "--tasks DIR a folder of task folders"
        )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--pool", "2"])  # no prefix of --pool-size either
    assert "unrecognized arguments: --pool 2" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["export", "--job", "j"], ["report", "--job", "j"]])
def test_the_commands_take_no_abbreviated_flag(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from rollout.cli import feed, viewer

    build = feed.build_parser if argv[0] == "export" else viewer.build_parser
    with pytest.raises(SystemExit) as e:
        build().parse_args(argv)
    assert e.value.code == 2 and "unrecognized arguments: --job j" in capsys.readouterr().err


def test_a_word_that_is_no_command_is_named_with_the_nearest_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["exprot", "--job-id", "j"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "launcher.py: error: no command 'exprot' (did you mean 'export'?); the commands: list, view,"
    )
    assert err.endswith("a job takes flags only (launcher.py --help)")
    assert main(["frobnicate"]) == 2
    assert "no command 'frobnicate'; the commands:" in capsys.readouterr().err


def test_max_steps_0_is_run_but_said_at_start(caplog: pytest.LogCaptureFixture) -> None:
    """--max-steps 0 is the gateway's zero budget (every session truncated at its first call):
    allowed, but a warning says so before anything runs."""
    from rollout.jobs.prepare import prepare

    caplog.set_level("WARNING", logger="rollout.notices")
    prepare(opts(max_steps=0, env_names=["basics"], sandbox="none"))
    assert any("--max-steps 0: no model call is allowed" in r.getMessage() for r in caplog.records)
    caplog.clear()
    prepare(opts(max_steps=1, env_names=["basics"], sandbox="none"))
    assert not any("--max-steps" in r.getMessage() for r in caplog.records)


def test_an_evaluator_beside_an_env_named_otherwise_is_pointed_at(tmp_path: Path) -> None:
    """Evaluators are found by the env's name: one beside an env.yaml whose ``name:`` differs from
    its folder is not used, and the error says why and what to rename."""
    root = tmp_path / "envs"
    shutil.copytree(BASICS, root / "echo2" / "tasks")
    (root / "echo2" / "env.yaml").write_text(
        "name: echo_renamed\ndataset: {format: task_dirs, path: tasks}\n"
        "runtime: {command: ['{python}', '-m', 'env.task_runtime']}\n"
    )
    (root / "echo2" / "rule_evaluator.py").write_text("def evaluate(r, s, t):\n    return 10\n")
    with pytest.raises(SetupError) as ei:
        check_evaluators(root, [load_env_config(root / "echo2" / "env.yaml")])
    assert (
        f"env 'echo_renamed' needs {root}/echo_renamed/rule_evaluator.py (its env.yaml is in echo2/, but "
        "evaluators are found by the env's name: rename the folder to echo_renamed/ or its name: to 'echo2')"
    ) in str(ei.value)
