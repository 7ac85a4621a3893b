"""Harbor task folders as an env format, end to end: the reader (skips with reasons), the bundled
``harbor_tasks`` env through the real launcher, gateway and sandbox with the ``oracle`` harness (10),
a no-op agent (0) and a cheating agent (0); a verifier timeout is a grading failure; a verifier that
cannot start is an infrastructure failure, retried; an env's evaluator gets the verifier's result."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.core import harbor
from rollout.core.envs import DatasetConfig, EnvConfigError, load_cases, load_env_config, session_config
from tests.fake_upstream import FakeUpstream
from tests.rollout.sandbox_helpers import require_bwrap
from tests.test_launcher import REPO, gateway_config, launch

BUNDLED = REPO / "env" / "harbor_tasks"
FIXTURE_HARNESSES = REPO / "tests" / "fixtures" / "harnesses"
TOML = '[metadata]\ndifficulty = "easy"\n\n[agent]\ntimeout_sec = 45.0\n\n[verifier]\ntimeout_sec = 30\n'
NOOP_RUNTIME = """
from env.runtime_kit import run_runtime
from rollout.contract.protocol import SimulationStartResult
run_runtime(lambda req: SimulationStartResult(session_id=req.session_id, status="succeeded"))
"""


def make_task(
    root: Path,
    name: str,
    *,
    toml: str = TOML,
    test_sh: str = "echo 1 > /logs/verifier/reward.txt\n",
    files: dict[str, str] | None = None,
    solution: str | None = None,
) -> Path:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text(f"Do {name}.\n")
    (task / "task.toml").write_text(toml)
    (task / "tests" / "test.sh").write_text(test_sh)
    for rel, text in (files or {}).items():
        (task / "environment" / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / "environment" / rel).write_text(text)
    if solution is not None:
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(solution)
    return task


def make_env(root: Path, name: str = "hb", *, evaluator: str | None = None, **dataset: Any) -> Path:
    env_dir = root / name
    (env_dir / "tasks").mkdir(parents=True, exist_ok=True)
    (env_dir / "runtime.py").write_text(NOOP_RUNTIME)
    if evaluator is not None:
        (env_dir / "rule_evaluator.py").write_text(evaluator)
    (env_dir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": name,
                "dataset": {"format": "harbor", "path": "tasks", **dataset},
                "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 120},
            }
        )
    )
    return env_dir


# ---------------------------------------------------------------------------------------------
# the reader


def test_a_task_folder_is_read_with_its_timeouts_and_hidden_paths(tmp_path: Path) -> None:
    env_dir = make_env(tmp_path)
    task = make_task(env_dir / "tasks", "t1", files={"a.txt": "x"}, solution="true\n")
    cfg = load_env_config(env_dir / "env.yaml")
    [case] = load_cases(cfg)
    assert case.case_id == "t1" and case.row["instruction"] == "Do t1.\n"
    assert (case.row["agent_timeout_s"], case.row["verifier_timeout_s"]) == (45.0, 30.0)
    assert case.row["metadata"] == {"difficulty": "easy"}
    assert (case.files_dir, case.tests_dir, case.solution_dir) == (
        str(task / "environment"),
        str(task / "tests"),
        str(task / "solution"),
    )
    # the agent sees the instruction and its timeout, never the paths of tests/ or solution/
    assert case.public_row() == {"id": "t1", "instruction": "Do t1.\n", "agent_timeout_s": 45.0}
    assert session_config(cfg, case).runtime.timeout_s == 45.0 and cfg.runtime.timeout_s == 120
    # the tasks folder is hidden from the env's own runtime
    assert (env_dir / "tasks").resolve() in [p.resolve() for p in cfg.hidden_paths()]


def test_defaults_without_timeouts_or_solution(tmp_path: Path) -> None:
    env_dir = make_env(tmp_path)
    make_task(env_dir / "tasks", "t", toml='version = "1.0"\n')
    cfg = load_env_config(env_dir / "env.yaml")
    [case] = load_cases(cfg)
    assert (case.row["agent_timeout_s"], case.row["verifier_timeout_s"]) == (
        None,
        harbor.DEFAULT_VERIFIER_TIMEOUT_S,
    )
    assert case.files_dir is None and case.solution_dir is None
    assert session_config(cfg, case) is cfg


def test_tasks_in_an_image_run_in_it_and_compose_tasks_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "tasks"
    make_task(root, "plain")
    make_task(root, "docker", files={"Dockerfile": "FROM alpine\n"})
    make_task(root, "compose", files={"docker-compose.yaml": "services: {}\n"})
    make_task(root, "image", toml='[environment]\ndocker_image = "org/img:1"\n')
    found = harbor.scan(root)
    assert [(r["id"], r.get("image_context"), r.get("image_ref")) for r in found.rows] == [
        ("docker", str((root / "docker" / "environment").resolve()), None),
        ("image", None, "org/img:1"),
        ("plain", None, None),
    ]
    assert [(t, why.split(":")[0]) for t, why in found.skipped] == [
        ("compose", "environment/docker-compose.yaml runs several containers"),
    ]
    assert "dataset.host_toolchain: true" in found.skipped[0][1]
    on_host = harbor.scan(root, host_toolchain=True).rows
    assert [(r["id"], "image_context" in r or "image_ref" in r) for r in on_host] == [
        ("compose", False),
        ("docker", False),
        ("image", False),
        ("plain", False),
    ]
    # through an env config: skipped tasks are logged, and an env where all are skipped says why
    env_dir = make_env(tmp_path / "e1")
    shutil.copytree(root / "compose", env_dir / "tasks" / "compose")
    with pytest.raises(
        EnvConfigError,
        match="every Harbor task .* is skipped:\n  1 task \\(compose\\): environment/docker-compose",
    ):
        load_cases(load_env_config(env_dir / "env.yaml"))
    shutil.copytree(root / "docker", env_dir / "tasks" / "docker")
    [case] = load_cases(load_env_config(env_dir / "env.yaml"))
    assert case.case_id == "docker" and "image_context" not in case.public_row()
    assert "Harbor task compose skipped: environment/docker-compose.yaml" in caplog.text


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: (t / "instruction.md").unlink(), "needs instruction.md"),
        (lambda t: (t / "task.toml").unlink(), "needs task.toml"),
        (lambda t: (t / "tests" / "test.sh").unlink(), "needs tests/test.sh"),
        (lambda t: (t / "task.toml").write_text("[agent\n"), "not valid TOML"),
        (
            lambda t: (t / "task.toml").write_text("[agent]\ntimeout_sec = -1\n"),
            "timeout_sec must be a positive number",
        ),
        (
            lambda t: (t / "task.toml").write_text('[verifier]\ntimeout_sec = "x"\n'),
            "timeout_sec must be a positive",
        ),
        (lambda t: (t / "task.toml").write_text("metadata = 3\n"), r"\[metadata\] must be a table"),
        (
            lambda t: (
                (t / "environment").mkdir(exist_ok=True),
                (t / "environment" / "etc").symlink_to("/etc"),
            ),
            r"environment/etc is a symbolic link: a task's files are copied as data, never followed",
        ),
    ],
)
def test_an_invalid_task_is_skipped_naming_the_file_and_the_others_run(
    tmp_path: Path, mutate: Any, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    env_dir = make_env(tmp_path)
    mutate(make_task(env_dir / "tasks", "bad"))
    with pytest.raises(
        EnvConfigError, match=f"every Harbor task .* is skipped:\n  1 task \\(bad\\): .*{message}"
    ):
        load_cases(load_env_config(env_dir / "env.yaml"))
    make_task(env_dir / "tasks", "good")
    caplog.clear()
    assert [c.case_id for c in load_cases(load_env_config(env_dir / "env.yaml"))] == ["good"]
    assert re.search(f"Harbor task bad skipped: .*{message}", caplog.text), caplog.text
    assert str(env_dir) not in caplog.text  # the reason names the file in the task, not the path


def test_host_toolchain_is_for_the_harbor_format_only(tmp_path: Path) -> None:
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "e",
                "dataset": {"format": "task_dirs", "path": "tasks", "host_toolchain": True},
                "runtime": {"command": ["true"]},
            }
        )
    )
    with pytest.raises(EnvConfigError, match="host_toolchain applies to format: harbor only"):
        load_env_config(tmp_path / "e" / "env.yaml")


def test_the_bundled_env_loads_its_tasks() -> None:
    cfg = load_env_config(BUNDLED / "env.yaml")
    cases = load_cases(cfg)
    assert [c.case_id for c in cases] == ["count_errors", "fix_median"]
    assert all(c.tests_dir and c.solution_dir and c.files_dir for c in cases)


# ---------------------------------------------------------------------------------------------
# through the launcher


async def run_job(
    tmp_path: Path, *args: str, exit_code: int = 0, tmpdir: Path | None = None
) -> tuple[list[dict[str, Any]], str, str]:
    db, out = tmp_path / "trajs.db", tmp_path / "out.jsonl"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        code, stdout, stderr = await launch(
            *args,
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--out",
            str(out),
            "--retry-backoff-s",
            "0.05",
            cwd=tmp_path,
            env={
                **os.environ,
                "ROLLOUT_HARNESS_CACHE": str(tmp_path / "cache"),
                **({"TMPDIR": str(tmpdir)} if tmpdir is not None else {}),
            },
        )
    assert code == exit_code, stderr
    assert "has no rule_evaluator.py" not in stderr  # a Harbor env is graded by its tests
    return [json.loads(line) for line in out.read_text().splitlines()], stdout, stderr


async def test_oracle_scores_10_no_op_and_cheating_agents_0(tmp_path: Path) -> None:
    require_bwrap()
    records, stdout, _ = await run_job(
        tmp_path,
        "--agent-root",
        str(REPO / "env"),
        "--env",
        "harbor_tasks",
        "--harness",
        "oracle",
        "--harness",
        str(FIXTURE_HARNESSES / "noop"),
        "--harness",
        str(FIXTURE_HARNESSES / "cheat"),
        "--job-id",
        "hb",
        "--pool-size",
        "3",
    )
    got = {(r["harness"], r["case_id"]): r for r in records}
    assert set(got) == {(h, c) for h in ("oracle", "noop", "cheat") for c in ("count_errors", "fix_median")}
    for (h, case), r in got.items():
        assert (r["status"], r["eval_status"], r["outcome"], r["sandbox"], r["step_count"]) == (
            "succeeded",
            "scored",
            "succeeded",
            "bwrap",
            0,
        ), r
        assert r["score"] == (10.0 if h == "oracle" else 0.0), (h, case, r["reason"])
    assert got[("oracle", "fix_median")]["reason"].startswith("verifier reward 1: read from reward.txt")
    assert got[("oracle", "count_errors")]["reason"].startswith("verifier reward 1: read from reward.json")
    assert got[("cheat", "fix_median")]["reason"].startswith("verifier reward 0: read from reward.txt")
    # the cheat saw neither the tests nor the solution of its task
    log = (
        tmp_path / "runs" / "logs" / "hb" / "harness" / f"{got[('cheat', 'fix_median')]['session_id']}-a1.log"
    )
    text = log.read_text()
    assert "ls: cannot access '/tests'" in text and "ls: cannot access '/solution'" in text
    assert "/env/harbor_tasks/tasks/fix_median/solution': No such file" in text
    assert "test_stats" not in text and "solve.sh" not in text
    assert "oracle" in stdout and "harbor_tasks" in stdout


async def test_a_verifier_timeout_is_a_grading_failure_and_an_evaluator_gets_the_verdict(
    tmp_path: Path,
) -> None:
    require_bwrap()
    root = tmp_path / "envs"
    slow = make_env(root, "slow")
    make_task(
        slow / "tasks",
        "sleepy",
        toml="[verifier]\ntimeout_sec = 2\n",
        test_sh="echo 1 > /logs/verifier/reward.txt\nsleep 300\n",
    )
    judged = make_env(
        root,
        "judged",
        evaluator=(
            "def evaluate(request, spec, trajectory):\n"
            "    v = request.verifier\n"
            "    return {'score': 7 * v['reward'], 'reason': f\"{v['status']} exit {v['exit_code']}: {v['stdout_tail']}\"}\n"
        ),
    )
    make_task(judged / "tasks", "half", test_sh="echo said-so\necho 0.5 > /logs/verifier/reward.txt\n")
    # exit code 5: a verifier that times out is a result of the completed run, not an outage; this one
    # times out on the untouched starting workspace too (the control): the verifier is broken
    records, stdout, _ = await run_job(
        tmp_path, "--agent-root", str(root), "--job-id", "to", "--max-broken-graders", "0", exit_code=5
    )
    got = {r["env_name"]: r for r in records}
    assert (got["slow"]["status"], got["slow"]["eval_status"], got["slow"]["score"]) == (
        "succeeded",
        "grader_broken",
        None,
    )
    assert got["slow"]["reason"].startswith(
        "grader broken: it failed on this session (timeout: verifier timed out "
        "after 2 s (killed)) and on the control"
    )
    assert (got["judged"]["eval_status"], got["judged"]["score"]) == ("scored", 3.5)
    assert got["judged"]["reason"] == "rewarded exit 0: said-so\n"
    # the broken verifier is left out of the mean and named on its env's row
    slow_row = next(line for line in stdout.splitlines() if line.startswith("slow "))
    assert slow_row.split()[3:5] == ["0", "-"] and "problems: broken 1" in stdout


async def test_a_verifier_that_cannot_start_is_an_infrastructure_failure_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_bwrap()
    import rollout.jobs.attempt as attempt
    from rollout.grading.verifier import VerifierResult
    from rollout.jobs.pool import Pool
    from tests.rollout.test_attempts import planned_on_a_gateway

    make_task(make_env(tmp_path / "envs") / "tasks", "t")
    real, calls = attempt.verify_session, []

    async def flaky(*args: Any) -> VerifierResult | None:
        calls.append(args[-1])
        if len(calls) == 1:
            return VerifierResult(status="setup_failed", reason="verifier setup failed: no bubblewrap today")
        return await real(*args)

    monkeypatch.setattr(attempt, "verify_session", flaky)
    async with planned_on_a_gateway(tmp_path, "vs") as p:
        pool = Pool(p.store, p.with_opts(pool_size=1, retry_backoff_s=0.01), p.context("vs"), p.envs)
        [record] = await asyncio.wait_for(pool.run(p.rows), 120)
    assert [(a.outcome, a.infra) for a in record.attempts] == [("setup_failed", True), ("succeeded", False)]
    assert "no bubblewrap today" in (record.attempts[0].reason or "")
    assert (record.eval_status, record.score) == ("scored", 10.0)
    assert len(calls) == 2


def test_every_task_skipped_is_one_line_per_reason_with_the_count(tmp_path: Path) -> None:
    env_dir = make_env(tmp_path)
    for i in range(5):
        make_task(env_dir / "tasks", f"c{i}", files={"docker-compose.yaml": "services: {}\n"})
    make_task(env_dir / "tasks", "y", files={"compose.yaml": "services: {}\n"})
    with pytest.raises(EnvConfigError) as e:
        load_cases(load_env_config(env_dir / "env.yaml"))
    hint = (
        "runs several containers: not supported here (set dataset.host_toolchain: true, or --host-toolchain "
        "with --tasks, when the host's tools are enough)"
    )
    assert str(e.value).splitlines() == [
        f"env hb: every Harbor task in {env_dir / 'tasks'} is skipped:",
        f"  5 tasks (c0, c1, c2, ...): environment/docker-compose.yaml {hint}",
        f"  1 task (y): environment/compose.yaml {hint}",
    ]


def test_host_toolchain_flag_runs_a_tasks_folder_on_the_hosts_tools(tmp_path: Path) -> None:
    from rollout.cli.listing import build_parser as list_parser
    from rollout.cli.listing import env_entries
    from rollout.cli.run import parse_args
    from rollout.core.envs import task_folder_env
    from rollout.core.setup import SetupError
    from rollout.jobs.prepare import load_envs

    root = tmp_path / "tasks"
    make_task(root, "compose", files={"docker-compose.yaml": "services: {}\n"})
    make_task(root, "docker", files={"Dockerfile": "FROM alpine\nWORKDIR /app\n"})
    assert [(c.case_id, "image_context" in c.row) for c in load_cases(task_folder_env(root))] == [
        ("docker", True)
    ]
    opts, _ = parse_args(["--tasks", str(root), "--host-toolchain"])
    assert opts.host_toolchain is True
    [(cfg, cases)] = load_envs(opts)
    assert cfg.dataset.host_toolchain is True
    assert [(c.case_id, "image_context" in c.row) for c in cases] == [("compose", False), ("docker", False)]
    entries = env_entries(list_parser().parse_args(["--tasks", str(root), "--host-toolchain"]))
    assert [e["cases"] for e in entries] == [2]
    with pytest.raises(SetupError, match="--host-toolchain applies to the Harbor tasks of --tasks folders"):
        load_envs(parse_args(["--host-toolchain"])[0])


def test_same_container_is_a_flag_of_list_and_audit_too_and_never_beside_the_hosts_tools(
    tmp_path: Path,
) -> None:
    from rollout.audit.audit import AuditOptions
    from rollout.cli.audit import build_parser as audit_parser
    from rollout.cli.listing import build_parser as list_parser
    from rollout.cli.listing import env_entries
    from rollout.cli.options import options_of
    from rollout.cli.run import parse_args
    from rollout.core.setup import SetupError
    from rollout.jobs.prepare import load_envs

    root = tmp_path / "tasks"
    make_task(root, "docker", files={"Dockerfile": "FROM alpine\nWORKDIR /app\n"})
    [entry] = env_entries(list_parser().parse_args(["--tasks", str(root), "--same-container"]))
    assert entry["cases"] == 1
    args = audit_parser().parse_args(["--tasks", str(root), "--same-container"])
    assert options_of(AuditOptions, args).same_container is True
    both = ["--tasks", str(root), "--same-container", "--host-toolchain"]
    with pytest.raises(SetupError, match="there is no image layer to verify on; choose one"):
        load_envs(parse_args(both)[0])
    with pytest.raises(SetupError, match="there is no image layer to verify on; choose one"):
        env_entries(list_parser().parse_args(both))
    with pytest.raises(SetupError, match="--same-container applies to the Harbor tasks of --tasks folders"):
        env_entries(list_parser().parse_args(["--same-container"]))
    with pytest.raises(ValueError, match="there is no image layer to verify on"):
        DatasetConfig(format="harbor", path="x", host_toolchain=True, same_container=True)


async def test_a_host_toolchain_task_sees_its_workspace_at_its_dockerfiles_workdir(tmp_path: Path) -> None:
    require_bwrap()
    root = tmp_path / "tasks"
    make_task(
        root,
        "at_app",
        files={
            "Dockerfile": "FROM python:3\nWORKDIR /srv\nWORKDIR app\nCOPY name.txt .\n",
            "name.txt": "Ada\n",
        },
        solution="bash /solution/greet.sh\n",  # the solution's own files at /solution, as Harbor's oracle has them
        test_sh="cd /app && grep -q Ada greeting.txt && echo 1 > /logs/verifier/reward.txt || "
        "echo 0 > /logs/verifier/reward.txt\n",
    )
    (root / "at_app" / "solution" / "greet.sh").write_text("cd /app && cat name.txt > greeting.txt\n")
    assert harbor.scan(root, host_toolchain=True).rows[0]["workdir"] == "/srv/app"
    (root / "at_app" / "environment" / "Dockerfile").write_text("FROM python:3\nWORKDIR /app\n")
    records, _, stderr = await run_job(
        tmp_path, "--tasks", str(root), "--host-toolchain", "--harness", "oracle", "--job-id", "app"
    )
    [r] = records
    assert (r["eval_status"], r["score"], r["sandbox"]) == ("scored", 10.0, "bwrap"), (r, stderr[-2000:])


def test_the_second_view_of_the_workspace_is_never_bound_over_the_sandboxs_own_paths(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rollout.sandbox.bwrap import Binds

    b = Binds()
    b.ro(Path("/usr"))
    for dest in ("/", "/usr/src/app", "/workspace/app", "/tmp/x", "app"):
        b.also(tmp_path, dest)
    assert b.args == ["--ro-bind", "/usr", "/usr"]
    b.also(tmp_path, "/app")
    assert b.args[3:] == ["--bind", str(tmp_path), "/app"]
    assert "the workspace is not bound at /usr/src/app too: it overlaps /usr" in caplog.text


async def test_a_job_whose_harnesses_call_no_model_starts_no_model_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``--harness oracle`` alone: the managed route's llama.cpp server is not started (seconds
    and a model's memory saved); with a harness that may call one, it is."""
    from gateway.settings import GatewaySettings
    from rollout.jobs import run
    from rollout.jobs.processes import ChildProcess
    from rollout.sandbox.harness_cache import load_harness

    oracle, agent = load_harness("oracle"), load_harness("bash-agent")
    assert run.model_free({"oracle": oracle}) == "harness oracle calls no model"
    assert run.model_free({"oracle": oracle, "bash-agent": agent}) is None and run.model_free({}) is None
    started: list[str] = []

    async def llama(managed: object, log_dir: Path) -> ChildProcess:
        started.append("llama")
        return ChildProcess("llama", None, log_dir / "llama.log", "http://127.0.0.1:1/v1")  # type: ignore[arg-type]

    async def gateway(
        settings: GatewaySettings, log_dir: Path, advertise_url: str | None = None
    ) -> ChildProcess:
        started.append("gateway")
        return ChildProcess("gateway", None, log_dir / "gw.log", "http://127.0.0.1:2/v1/sessions")  # type: ignore[arg-type]

    monkeypatch.setattr(run, "start_llama_server", llama)
    monkeypatch.setattr(run, "start_gateway", gateway)
    gw = GatewaySettings.model_validate(
        {
            "llm_routes": {
                "local": {"base_url": "http://127.0.0.1:8081/v1", "managed": {"kind": "llama_cpp_tokens"}}
            }
        }
    )

    class _Store:
        kind = "sqlite"

        def peer_url(self) -> str:
            return "sqlite:///x.db"

    caplog.set_level("INFO")
    await run.start_services(
        gw, ["local"], _Store(), tmp_path, [], no_model=run.model_free({"oracle": oracle})
    )  # type: ignore[arg-type]
    assert started == ["gateway"]
    assert "route 'local': its model server is not started (harness oracle calls no model)" in caplog.text
    await run.start_services(gw, ["local"], _Store(), tmp_path, [])  # type: ignore[arg-type]
    assert started == ["gateway", "llama", "gateway"]
