"""The harness x model matrix: planned rows and groups, flags and start-config keys, the envs a
harness can run, the records and the table rows per (env, harness, model)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml

from rollout.cli.run import parse_args, regrade_options
from rollout.core.envs import load_cases, load_env_config
from rollout.core.plan import group_id, session_rows
from rollout.core.setup import SetupError
from rollout.grading.trajectory import to_trajectory
from rollout.jobs.prepare import harness_envs, load_harnesses
from rollout.results.records import record_of
from rollout.results.report import render_table, summarize
from store import JobEnvironment, SessionResult


def _task_env(root: Path, name: str = "tasks", n: int = 2) -> Path:
    d = root / name
    for i in range(n):
        t = d / "tasks" / f"t{i}"
        t.mkdir(parents=True)
        (t / "instruction.md").write_text(f"task {i}")
        (t / "expected.json").write_text(json.dumps({"x": i}))
    (d / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": name,
                "dataset": {"format": "task_dirs", "path": "tasks"},
                "runtime": {"command": ["true"]},
            }
        )
    )
    return d / "env.yaml"


def _jsonl_env(root: Path, name: str = "qa") -> Path:
    d = root / name
    (d / "data").mkdir(parents=True)
    (d / "data" / "cases.jsonl").write_text('{"q": 1}\n')
    (d / "env.yaml").write_text(
        yaml.safe_dump(
            {"name": name, "dataset": {"path": "data/cases.jsonl"}, "runtime": {"command": ["true"]}}
        )
    )
    return d / "env.yaml"


def test_every_env_case_harness_model_sample_is_a_session_and_groups_are_per_case_harness_model(
    tmp_path: Path,
) -> None:
    cfg = load_env_config(_task_env(tmp_path))
    envs = [(cfg, load_cases(cfg))]
    rows = session_rows("J", ["a", "b"], envs, 3, None, ["bash-agent", "codex"])
    assert len(rows) == 2 * 2 * 2 * 3 and len({r.session_id for r in rows}) == 24
    groups: dict[str, set[tuple[str, str | None, str]]] = {}
    for r in rows:
        groups.setdefault(r.group_id, set()).add((r.case_id, r.harness, r.llm_model))
    assert all(len(keys) == 1 for keys in groups.values()) and len(groups) == 8
    assert Counter(r.group_id for r in rows) == {g: 3 for g in groups}
    r0 = next(r for r in rows if (r.case_id, r.harness, r.llm_model) == ("t1", "codex", "b"))
    assert (
        r0.group_id
        == uuid.uuid5(uuid.NAMESPACE_URL, "J/tasks/t1/codex/b").hex[:16]
        == group_id("J", "tasks", "t1", "codex", "b")
    )
    assert sorted(r.sample_index for r in rows if r.group_id == r0.group_id) == [0, 1, 2]
    # without a harness and with one model: the env's own runtime, groups as before
    plain = session_rows("J", "a", envs, 2, None)
    assert {r.harness for r in plain} == {None} and len(plain) == 4
    assert {r.group_id for r in plain if r.case_id == "t0"} == {
        uuid.uuid5(uuid.NAMESPACE_URL, "J/tasks/t0").hex[:16]
    }
    # several models without a harness: a group per (case, model)
    two = session_rows("J", ["a", "b"], envs, 1, None)
    assert len({r.group_id for r in two}) == 4


def test_flags_and_start_config_make_lists(tmp_path: Path) -> None:
    opts, _ = parse_args(
        ["--llm-model", "a", "--llm-model", "b", "--harness", "bash-agent", "--harness", "./mine"]
    )
    assert (opts.llm_model, opts.harness) == (["a", "b"], ["bash-agent", "./mine"])
    start = tmp_path / "start.yaml"
    start.write_text(yaml.safe_dump({"llm_model": "qwen", "harness": "bash-agent"}))
    opts, _ = parse_args(["--agent-start-config", str(start)])
    assert (opts.llm_model, opts.harness) == (["qwen"], ["bash-agent"])
    opts, _ = parse_args([])
    assert (opts.llm_model, opts.harness) == ([], [])
    with pytest.raises(SetupError, match="--harness cannot be used with it"):
        regrade_options(parse_args(["--regrade", "--job-id", "x", "--harness", "bash-agent"])[1])


def test_only_task_directory_envs_run_a_harness(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tasks, qa = load_env_config(_task_env(tmp_path)), load_env_config(_jsonl_env(tmp_path))
    kept = harness_envs([(qa, load_cases(qa)), (tasks, load_cases(tasks))])
    assert [cfg.name for cfg, _ in kept] == ["tasks"]
    assert [r.getMessage() for r in caplog.records if r.name == "rollout.notice"] == [
        "warning: --harness runs task-directory envs only (dataset.format: task_dirs or harbor); skipping qa"
    ]
    with pytest.raises(SetupError, match="none of the selected envs is a task-directory env .*skipped qa"):
        harness_envs([(qa, load_cases(qa))])


def test_harness_flags_are_checked(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match="--harness nope: no such harness .bundled: .*bash-agent"):
        load_harnesses(["nope"])
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "harness.py").write_text(
        "from rollout.harness import Harness\nclass H(Harness):\n    name = 'bash-agent'\nHARNESS = H()\n"
    )
    with pytest.raises(SetupError, match="two harnesses are named 'bash-agent'"):
        load_harnesses(["bash-agent", str(mine)])
    assert list(load_harnesses(["bash-agent", "bash-agent"])) == ["bash-agent"]


def _row(
    harness: str | None, model: str, sample: int, reward: float, metrics: dict[str, object]
) -> JobEnvironment:
    return JobEnvironment(
        session_id=f"{harness}-{model}-{sample}",
        job_id="J",
        env_name="tasks",
        case_id="t0",
        llm_model=model,
        harness=harness,
        group_id=group_id("J", "tasks", "t0", harness, model),
        sample_index=sample,
        status="succeeded",
        reward=reward,
        eval_status="scored",
        finished=True,
        outcome="succeeded",
        result={"session_id": "x", "status": "succeeded", "metrics": metrics},
    )


def test_records_and_table_have_a_row_per_env_harness_model() -> None:
    answer = {"x": 0}
    rows = [
        _row("bash-agent", "a", 0, 10.0, {"harness": "bash-agent", "harness_exit": 0, "answer": answer}),
        _row("bash-agent", "a", 1, 0.0, {"harness": "bash-agent", "harness_exit": 1, "answer": None}),
        _row("bash-agent", "b", 0, 0.0, {"harness": "bash-agent", "harness_exit": 0, "answer": {"x": 9}}),
        _row(None, "a", 0, 10.0, {"answer": "not a harness metric"}),
    ]
    records = [record_of(r, SessionResult.of_row(r), to_trajectory(r.session_id, [])) for r in rows]
    assert [(r.harness, r.harness_exit, r.answer) for r in records] == [
        ("bash-agent", 0, answer),
        ("bash-agent", 1, None),
        ("bash-agent", 0, {"x": 9}),
        (None, None, None),
    ]
    line = json.loads(records[0].model_dump_json())
    assert (line["harness"], line["harness_exit"], line["answer"]) == ("bash-agent", 0, answer)
    assert [r.metrics for r in records] == [  # the runtime's own metrics, for every session
        {"harness": "bash-agent", "harness_exit": 0, "answer": answer},
        {"harness": "bash-agent", "harness_exit": 1, "answer": None},
        {"harness": "bash-agent", "harness_exit": 0, "answer": {"x": 9}},
        {"answer": "not a harness metric"},
    ]
    summary = summarize(records)
    assert [(s.env_name, s.harness, s.model, s.sessions, s.pass_at_1) for s in summary] == [
        ("tasks", None, "a", 1, 1.0),
        ("tasks", "bash-agent", "a", 2, 0.5),
        ("tasks", "bash-agent", "b", 1, 0.0),
    ]
    lines = render_table(summary).splitlines()
    assert lines[0].split()[:4] == ["env", "harness", "model", "sess"]
    assert [line.split()[:4] for line in lines[2:5]] == [
        ["tasks", "(env)", "a", "1"],
        ["tasks", "bash-agent", "a", "2"],
        ["tasks", "bash-agent", "b", "1"],
    ]
    assert "harness (env): the env's own runtime" in " ".join(lines[5:])
    # a job without harnesses keeps today's table
    assert render_table(summarize(records[3:])).splitlines()[0].split()[:3] == ["env", "model", "sess"]


async def test_a_harness_that_cannot_be_installed_stops_the_job_before_any_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    from rollout.jobs.options import JobOptions
    from rollout.jobs.run import run_job

    monkeypatch.setenv("ROLLOUT_HARNESS_CACHE", str(tmp_path / "cache"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "harness.py").write_text(
        "from rollout.harness import Harness, HarnessUnavailable\n"
        "class H(Harness):\n    name, version = 'broken', '1'\n"
        "    def install(self, cache_dir):\n        raise HarnessUnavailable('npm is not installed')\n"
        "HARNESS = H()\n"
    )
    gw = tmp_path / "gw.yaml"
    db = tmp_path / "t.db"
    gw.write_text(yaml.safe_dump({"llm_routes": {"m": {"base_url": "http://127.0.0.1:9/v1"}}}))
    opts = JobOptions(
        agent_configs=[_task_env(tmp_path / "envs")],
        harness=[str(broken)],
        gateway_config=gw,
        db_path=f"sqlite://{db}",
        job_id="jb",
        sandbox="none",
    )
    with pytest.raises(SetupError, match="^harness broken cannot be used here: npm is not installed$"):
        await run_job(opts)
    con = sqlite3.connect(db)
    assert con.execute("select count(*) from job_environments").fetchone() == (0,)
    con.close()
    assert not (tmp_path / "cache" / "broken-1").exists()
    with pytest.raises(SetupError, match=r"--llm-model 'nope': not a route of the gateway config \(m\)"):
        await run_job(opts.model_copy(update={"llm_model": ["m", "nope"]}))


def test_a_harness_whose_api_the_route_does_not_speak_is_refused_before_any_session() -> None:
    """claude-code speaks Anthropic Messages: on an OpenAI-API route the gateway would refuse every
    call of its sessions, so the job is refused at setup instead of scoring zeros."""
    from gateway.settings import GatewaySettings
    from rollout.jobs.prepare import check_harness_apis

    gw = GatewaySettings.model_validate(
        {
            "llm_routes": {
                "oai": {"base_url": "http://127.0.0.1:9/v1"},
                "claude": {"base_url": "http://127.0.0.1:9", "api": "anthropic"},
            }
        }
    )
    loaded = load_harnesses(["claude-code", "oracle"])
    with pytest.raises(
        SetupError, match=r"--harness claude-code speaks anthropic_messages .*route\(s\) 'oai' speak"
    ):
        check_harness_apis(gw, ["claude", "oai"], loaded)
    check_harness_apis(gw, ["claude"], loaded)  # the oracle calls no model: any route


def test_retried_counts_an_infrastructure_failure_never_a_stop() -> None:
    """A session cut off by a stop or Ctrl-C and finished by ``--resume`` was not retried: its
    earlier attempt is ``interrupted``; one after an infrastructure failure was."""
    from store.models import SessionAttempt

    row = _row(None, "a", 0, 10.0, {})

    def retried(*earlier: str) -> bool:
        attempts = [
            *(
                SessionAttempt(session_id=row.session_id, attempt=i + 1, job_id="J", status="x", outcome=o)
                for i, o in enumerate(earlier)
            ),
            SessionAttempt(
                session_id=row.session_id,
                attempt=len(earlier) + 1,
                job_id="J",
                status="succeeded",
                outcome="succeeded",
            ),
        ]
        return record_of(row, SessionResult.of_row(row), to_trajectory(row.session_id, []), attempts).retried

    assert retried() is False
    assert retried("interrupted") is False
    assert retried("interrupted", "cancelled") is False
    assert retried("upstream_unavailable") is True
    assert retried("interrupted", "upstream_unavailable") is True
