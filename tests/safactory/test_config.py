"""Safactory's documented task and start YAMLs: mapped onto env configs, or refused one line per key."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from rollout.cli.run import parse_args
from rollout.contract.protocol import SimulationStartRequest
from rollout.core.envs import EnvConfigError, load_cases, load_env_config
from rollout.core.safactory import load_agent_config, load_agent_configs
from rollout.sandbox.runner import run_runtime

FIXTURES = Path(__file__).parent / "fixtures"
MYBENCH = FIXTURES / "mybench"


def test_the_runnable_pair_maps_onto_an_env_config() -> None:
    [cfg] = load_agent_config(MYBENCH / "mybench_config.yaml", MYBENCH / "mybench_start.yaml")
    assert cfg.name == "mybench"
    assert cfg.command() == [sys.executable, str((MYBENCH / "runner.py").resolve())]  # target -> source
    assert cfg.dataset_path() == (MYBENCH / "datasets" / "cases.jsonl").resolve()
    assert cfg.group_size == 1
    assert (
        cfg.params["task_family"] == "mybench" and cfg.params["evaluation"]["rule_evaluator_timeout_s"] == 60
    )
    assert cfg.runtime.env == {
        "PYTHONDONTWRITEBYTECODE": "1",
        "NO_PROXY": "host.docker.internal,localhost,127.0.0.1,::1",
        "no_proxy": "host.docker.internal,localhost,127.0.0.1,::1",
    }
    assert cfg.env_dir == MYBENCH.resolve()
    assert cfg.runtime.safactory_env  # its runner gets the SAFACTORY_* variables
    assert cfg.dataset_path() in cfg.hidden_paths()  # the runner never sees the dataset


def test_the_documented_pair_is_refused_one_line_per_key() -> None:
    with pytest.raises(EnvConfigError) as e:
        load_agent_config(FIXTURES / "doc_mybench_config.yaml", FIXTURES / "doc_mybench_start.yaml")
    lines = str(e.value).splitlines()
    start = (FIXTURES / "doc_mybench_start.yaml").resolve()
    assert lines == [
        f"{start}: container.mounts: host folders are not bound into the sandbox here; remove mounts "
        "(the runner's files stay in its workspace, kept with the session)",
    ]


def test_env_image_is_the_envs_image_with_the_workspace_at_container_workdir(tmp_path: Path) -> None:
    start = tmp_path / "start.yaml"
    start.write_text(
        (FIXTURES / "doc_mybench_start.yaml")
        .read_text()
        .split("  mounts:")[0]
        .replace("./mybench/", str(MYBENCH) + "/")
    )
    [cfg] = load_agent_config(FIXTURES / "doc_mybench_config.yaml", start)
    assert (cfg.image, cfg.workdir) == ("mybench-image:latest", "/workspace/MyBench")
    assert cfg.command() == [sys.executable, str((MYBENCH / "runner.py").resolve())]
    start.write_text(
        "agent_name: mybench\ncontainer:\n  image: other:1\n  workdir: rel\n"
        "  runner_entrypoint: {command: python x.py}\n"
    )
    with pytest.raises(EnvConfigError) as e:
        load_agent_config(FIXTURES / "doc_mybench_config.yaml", start)
    assert str(e.value) == f"{start}: container.workdir: 'rel': must be an absolute path in the image"


def test_the_agents_map_picks_the_env_by_name(tmp_path: Path) -> None:
    config = tmp_path / "mybench_config.yaml"
    config.write_text((MYBENCH / "mybench_config.yaml").read_text())
    (tmp_path / "datasets").mkdir()
    [cfg] = load_agent_config(config, FIXTURES / "doc_multi_agent_start.yaml")
    assert cfg.command() == [sys.executable, str((MYBENCH / "runner.py").resolve())]
    other = tmp_path / "other_config.yaml"
    other.write_text("environments:\n  - env_name: mybnch\n    dataset: ./datasets/cases.jsonl\n")
    with pytest.raises(
        EnvConfigError, match=r"agents: no agent 'mybnch' \(the env_name\) \(did you mean 'mybench'\?\)"
    ):
        load_agent_config(other, FIXTURES / "doc_multi_agent_start.yaml")


def test_the_sandbox_form_is_refused_by_its_key() -> None:
    with pytest.raises(EnvConfigError) as e:
        load_agent_config(MYBENCH / "mybench_config.yaml", FIXTURES / "doc_sandbox_start.yaml")
    assert str(e.value) == (
        f"{(FIXTURES / 'doc_sandbox_start.yaml').resolve()}: sandbox: Brainbox sandbox instances "
        "do not run here (runners run in the local bwrap sandbox); remove sandbox"
    )


def test_a_mismatched_agent_name_and_typos_name_the_key(tmp_path: Path) -> None:
    start = tmp_path / "start.yaml"
    start.write_text("agent_name: other\ncontainer: {runner_entrypoint: {command: python x.py}}\n")
    with pytest.raises(
        EnvConfigError, match="agent_name: 'other' does not match env_name 'mybench'; set agent_name: mybench"
    ):
        load_agent_config(MYBENCH / "mybench_config.yaml", start)
    config = tmp_path / "c.yaml"
    config.write_text(
        "environments:\n  - env_name: mybench\n    env_nums: 2\n    dataset: d.parquet\n"
        "    dataset_load_mode: parquet_row_ref\n"
    )
    start.write_text(
        "agent_name: mybench\ncontainer: {workdri: /x, runner_entrypoint: {command: python x.py}}\n"
    )
    with pytest.raises(EnvConfigError) as e:
        load_agent_config(config, start)
    lines = str(e.value).splitlines()
    assert f"{config}: environments[0].env_nums: unknown key (did you mean 'env_num'?)" in lines
    assert f"{start}: container.workdri: unknown key (did you mean 'workdir'?)" in lines
    assert any("dataset_load_mode: 'parquet_row_ref' is not read here" in ln for ln in lines)
    assert any("dataset: 'd.parquet': only JSONL datasets are read here" in ln for ln in lines)
    assert len(lines) == 4


def test_a_task_config_without_its_start_config_says_what_to_add() -> None:
    with pytest.raises(EnvConfigError, match="needs its start config: add --agent-start-config"):
        load_agent_config(MYBENCH / "mybench_config.yaml", None)


def test_shell_commands_run_under_sh_with_the_source_in_place_of_the_target(tmp_path: Path) -> None:
    shutil.copytree(MYBENCH, tmp_path / "geo", dirs_exist_ok=True)
    (tmp_path / "geo" / "start.yaml").write_text(
        "agent_name: mybench\ncontainer:\n  runner_entrypoint:\n    source: ./\n    target: /tmp/safactory-geo3k\n"
        '    command: "pip install -q requests && python /tmp/safactory-geo3k/runner.py"\n'
    )
    [cfg] = load_agent_config(tmp_path / "geo" / "mybench_config.yaml", tmp_path / "geo" / "start.yaml")
    assert cfg.command() == [
        "/bin/sh",
        "-c",
        f"pip install -q requests && python {(tmp_path / 'geo').resolve()}/runner.py",
    ]


def test_env_yaml_errors_are_one_line_per_problem_with_the_nearest_key(tmp_path: Path) -> None:
    path = tmp_path / "e" / "env.yaml"
    path.parent.mkdir()
    path.write_text("dataset: {path: a.jsonl, formt: jsonl}\nruntim: {}\nmax_steps: abc\n")
    with pytest.raises(EnvConfigError) as e:
        load_env_config(path)
    text = str(e.value)
    assert text.splitlines() == [
        f"{path}: dataset.formt: unknown key (did you mean 'format'?)",
        f"{path}: runtime: required key missing",
        f"{path}: max_steps: Input should be a valid integer, unable to parse string as an integer",
        f"{path}: runtim: unknown key (did you mean 'runtime'?)",
    ]
    assert "http" not in text


def test_a_start_config_with_nothing_to_start_is_refused(tmp_path: Path) -> None:
    env = tmp_path / "env.yaml"
    env.write_text("name: e\ndataset: {path: d.jsonl}\nruntime: {command: [x]}\n")
    start = MYBENCH / "mybench_start.yaml"
    with pytest.raises(EnvConfigError, match="no --agent-config is a Safactory task config"):
        load_agent_configs([env], start)
    with pytest.raises(EnvConfigError, match="add --agent-config <name>_config.yaml"):
        load_agent_configs([], start)
    assert [c.name for c in load_agent_configs([env, MYBENCH / "mybench_config.yaml"], start)] == [
        "e",
        "mybench",
    ]


def test_a_start_config_of_either_kind_on_the_command_line(tmp_path: Path) -> None:
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text(
        "sandbox: none\npool_size: 3\n"
    )  # flag defaults: --sandbox's value, not Safactory's sandbox:
    opts, _ = parse_args(["--agent-start-config", str(defaults)])
    assert (opts.sandbox, opts.pool_size, opts.agent_start_config) == ("none", 3, None)
    start = MYBENCH / "mybench_start.yaml"
    opts, _ = parse_args(
        [
            "--agent-config",
            str(MYBENCH / "mybench_config.yaml"),
            "--agent-start-config",
            str(start),
            "--pool-size",
            "1",
            "--db-path",
            "sqlite://env_trajs.db",
        ]
    )
    assert (opts.agent_start_config, opts.pool_size, opts.db_path) == (start, 1, "sqlite://env_trajs.db")


def test_dockers_own_keys_are_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="rollout.core.safactory"):
        load_agent_config(MYBENCH / "mybench_config.yaml", MYBENCH / "mybench_start.yaml")
    assert [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()] == [
        f"{(MYBENCH / 'mybench_start.yaml').resolve()}: container.workdir, container.idle_command, container.extra_args: "
        "ignored (Docker only: the runner runs in the session's workspace, in the sandbox)"
    ]


SPY_RUNNER = """
import json, os, sys
stdin = sys.stdin.read()
print(json.dumps({"session_id": "s-1", "status": "succeeded",
                  "metrics": {"stdin": stdin, "env": os.environ.get("SAFACTORY_START_REQUEST_JSON", "")}}))
"""


def _pair(tmp_path: Path, entry_extra: str, rows: list[dict[str, object]]) -> tuple[Path, Path]:
    (tmp_path / "runner.py").write_text(SPY_RUNNER)
    (tmp_path / "cases.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "spy_config.yaml"
    config.write_text(f"environments:\n  - env_name: spy\n    dataset: ./cases.jsonl\n{entry_extra}")
    start = tmp_path / "spy_start.yaml"
    start.write_text(
        "agent_name: spy\ncontainer:\n  runner_entrypoint: {command: python runner.py, source: ./runner.py, "
        "target: runner.py}\n"
    )
    return config, start


async def test_a_hidden_field_reaches_the_runner_neither_on_stdin_nor_in_its_variable(tmp_path: Path) -> None:
    config, start = _pair(
        tmp_path, "    hidden_fields: [expected]\n", [{"id": "n1", "input": "q", "expected": "THE-ANSWER"}]
    )
    [cfg] = load_agent_config(config, start)
    [case] = load_cases(cfg)
    assert case.row["expected"] == "THE-ANSWER"  # the evaluator still sees it
    request = SimulationStartRequest(
        job_id="j",
        session_id="s-1",
        agent_name="spy",
        agent_id="spy-0",
        group_id="g",
        gateway_base_url="http://127.0.0.1:9/v1/sessions/s-1",
        model="m",
        env_params={**cfg.params, "dataset": case.public_row()},
    )
    (tmp_path / "ws").mkdir()
    out = await run_runtime(cfg, request, tmp_path / "ws", {}, "none")
    assert out.result is not None, out.error_text
    seen = out.result.metrics
    assert json.loads(seen["stdin"])["env_params"]["dataset"] == {"id": "n1", "input": "q"}
    assert json.loads(seen["env"])["env_params"]["dataset"] == {"id": "n1", "input": "q"}
    assert "THE-ANSWER" not in seen["stdin"] + seen["env"]


def test_an_env_that_hides_nothing_is_one_warning_naming_its_fields(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config, start = _pair(tmp_path, "", [{"id": "n1", "input": "q", "expected": "a"}])
    with caplog.at_level("WARNING", logger="rollout.core.safactory"):
        load_agent_config(config, start)
    assert [r.getMessage() for r in caplog.records] == [
        f"{config}: environments[0]: env spy hides no field: the runner sees every field of its rows "
        "(expected, id, input); hide the answer with hidden_fields: [<field>, ...] in this entry"
    ]
    config.write_text(config.read_text() + "    hidden_fields: expected\n")
    with pytest.raises(
        EnvConfigError, match=r"environments\[0\]\.hidden_fields: Input should be a valid list"
    ):
        load_agent_config(config, start)


def test_the_rows_id_field_is_the_case_id_when_every_row_has_a_unique_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config, start = _pair(
        tmp_path,
        "    hidden_fields: [expected]\n",
        [{"id": "n1", "expected": "a"}, {"id": 7, "expected": "b"}],
    )
    [cfg] = load_agent_config(config, start)
    assert [c.case_id for c in load_cases(cfg)] == ["n1", "7"]
    for rows in ([{"id": "n1"}, {"id": "n1"}], [{"id": "n1"}, {"task": "x"}], [{"id": ""}]):
        (tmp_path / "cases.jsonl").write_text(
            "".join(json.dumps({**r, "expected": "a"}) + "\n" for r in rows)
        )
        with caplog.at_level("WARNING", logger="rollout.core.safactory"):
            [cfg] = load_agent_config(config, start)
        assert [c.case_id for c in load_cases(cfg)] == [str(i) for i in range(len(rows))]
        assert "are not unique non-empty ids: cases are numbered by line" in caplog.text
        caplog.clear()
    (tmp_path / "cases.jsonl").write_text(json.dumps({"task": "x", "expected": "a"}) + "\n")
    with caplog.at_level("WARNING", logger="rollout.core.safactory"):
        [cfg] = load_agent_config(config, start)
    assert [c.case_id for c in load_cases(cfg)] == [
        "0"
    ] and caplog.text == ""  # no id field at all: no warning


def test_a_misspelt_environments_and_a_container_image_say_what_is_meant(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("enviroments:\n  - env_name: mybench\n    dataset: ./cases.jsonl\n")
    with pytest.raises(EnvConfigError) as e:
        load_agent_config(config, MYBENCH / "mybench_start.yaml")
    assert str(e.value) == (
        f"{config}: enviroments: unknown key (did you mean 'environments'? the envs of a "
        "Safactory task config)"
    )
    start = tmp_path / "s.yaml"
    start.write_text(
        "agent_name: mybench\ncontainer:\n  image: mybench:latest\n  runner_entrypoint: {command: python x.py}\n"
    )
    [cfg] = load_agent_config(MYBENCH / "mybench_config.yaml", start)
    assert (cfg.image, cfg.workdir) == (
        "mybench:latest",
        None,
    )  # the start YAML's image when env_image is unset
