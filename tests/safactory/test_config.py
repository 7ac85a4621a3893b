"""Safactory's documented task and start YAMLs: mapped onto env configs, or refused one line per key."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from rollout.cli.run import parse_args
from rollout.core.envs import EnvConfigError, load_env_config
from rollout.core.safactory import load_agent_config, load_agent_configs

FIXTURES = Path(__file__).parent / "fixtures"
MYBENCH = FIXTURES / "mybench"


def test_the_runnable_pair_maps_onto_an_env_config() -> None:
    [cfg] = load_agent_config(MYBENCH / "mybench_config.yaml", MYBENCH / "mybench_start.yaml")
    assert cfg.name == "mybench"
    assert cfg.command() == [sys.executable, str((MYBENCH / "runner.py").resolve())]  # target -> source
    assert cfg.dataset_path() == (MYBENCH / "datasets" / "cases.jsonl").resolve()
    assert cfg.group_size == 1
    assert cfg.params["task_family"] == "mybench" and cfg.params["evaluation"]["rule_evaluator_timeout_s"] == 60
    assert cfg.runtime.env == {"PYTHONDONTWRITEBYTECODE": "1", "NO_PROXY": "host.docker.internal,localhost,127.0.0.1,::1",
                               "no_proxy": "host.docker.internal,localhost,127.0.0.1,::1"}
    assert cfg.env_dir == MYBENCH.resolve()
    assert cfg.runtime.safactory_env  # its runner gets the SAFACTORY_* variables
    assert cfg.dataset_path() in cfg.hidden_paths()  # the runner never sees the dataset


def test_the_documented_pair_is_refused_one_line_per_key() -> None:
    with pytest.raises(EnvConfigError) as e:
        load_agent_config(FIXTURES / "doc_mybench_config.yaml", FIXTURES / "doc_mybench_start.yaml")
    lines = str(e.value).splitlines()
    cfg, start = (FIXTURES / "doc_mybench_config.yaml").resolve(), (FIXTURES / "doc_mybench_start.yaml").resolve()
    assert lines == [
        f"{cfg}: environments[0].env_image: container images do not run here; remove it to run the runner "
        "with this machine's tools in the bwrap sandbox",
        f"{start}: container.mounts: host folders are not bound into the sandbox here; remove mounts "
        "(the runner's files stay in its workspace, kept with the session)",
    ]


def test_the_agents_map_picks_the_env_by_name(tmp_path: Path) -> None:
    config = tmp_path / "mybench_config.yaml"
    config.write_text((MYBENCH / "mybench_config.yaml").read_text())
    (tmp_path / "datasets").mkdir()
    [cfg] = load_agent_config(config, FIXTURES / "doc_multi_agent_start.yaml")
    assert cfg.command() == [sys.executable, str((MYBENCH / "runner.py").resolve())]
    other = tmp_path / "other_config.yaml"
    other.write_text("environments:\n  - env_name: mybnch\n    dataset: ./datasets/cases.jsonl\n")
    with pytest.raises(EnvConfigError, match=r"agents: no agent 'mybnch' \(the env_name\) \(did you mean 'mybench'\?\)"):
        load_agent_config(other, FIXTURES / "doc_multi_agent_start.yaml")


def test_the_sandbox_form_is_refused_by_its_key() -> None:
    with pytest.raises(EnvConfigError) as e:
        load_agent_config(MYBENCH / "mybench_config.yaml", FIXTURES / "doc_sandbox_start.yaml")
    assert str(e.value) == (f"{(FIXTURES / 'doc_sandbox_start.yaml').resolve()}: sandbox: Brainbox sandbox instances "
                            "do not run here (runners run in the local bwrap sandbox); remove sandbox")


def test_a_mismatched_agent_name_and_typos_name_the_key(tmp_path: Path) -> None:
    start = tmp_path / "start.yaml"
    start.write_text("agent_name: other\ncontainer: {runner_entrypoint: {command: python x.py}}\n")
    with pytest.raises(EnvConfigError, match="agent_name: 'other' does not match env_name 'mybench'; set agent_name: mybench"):
        load_agent_config(MYBENCH / "mybench_config.yaml", start)
    config = tmp_path / "c.yaml"
    config.write_text("environments:\n  - env_name: mybench\n    env_nums: 2\n    dataset: d.parquet\n"
                      "    dataset_load_mode: parquet_row_ref\n")
    start.write_text("agent_name: mybench\ncontainer: {workdri: /x, runner_entrypoint: {command: python x.py}}\n")
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
        "    command: \"pip install -q requests && python /tmp/safactory-geo3k/runner.py\"\n")
    [cfg] = load_agent_config(tmp_path / "geo" / "mybench_config.yaml", tmp_path / "geo" / "start.yaml")
    assert cfg.command() == ["/bin/sh", "-c", f"pip install -q requests && python {(tmp_path / 'geo').resolve()}/runner.py"]


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
    assert [c.name for c in load_agent_configs([env, MYBENCH / "mybench_config.yaml"], start)] == ["e", "mybench"]


def test_a_start_config_of_either_kind_on_the_command_line(tmp_path: Path) -> None:
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text("sandbox: none\npool_size: 3\n")  # flag defaults: --sandbox's value, not Safactory's sandbox:
    opts, _ = parse_args(["--agent-start-config", str(defaults)])
    assert (opts.sandbox, opts.pool_size, opts.agent_start_config) == ("none", 3, None)
    start = MYBENCH / "mybench_start.yaml"
    opts, _ = parse_args(["--agent-config", str(MYBENCH / "mybench_config.yaml"), "--agent-start-config", str(start),
                          "--pool-size", "1", "--db-path", "sqlite://env_trajs.db"])
    assert (opts.agent_start_config, opts.pool_size, opts.db_path) == (start, 1, "sqlite://env_trajs.db")


def test_dockers_own_keys_are_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="rollout.core.safactory"):
        load_agent_config(MYBENCH / "mybench_config.yaml", MYBENCH / "mybench_start.yaml")
    assert [r.getMessage() for r in caplog.records] == [
        f"{(MYBENCH / 'mybench_start.yaml').resolve()}: container.workdir, container.idle_command, container.extra_args: "
        "ignored (Docker only: the runner runs in the session's workspace, in the sandbox)"]
