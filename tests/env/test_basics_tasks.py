"""The shipped basics tasks: the workspace env's grading, reference solutions that score 10, wrong
answers that score 0, no expected value in any instruction, and the env's config."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.env.helpers import ENV_ROOT, eval_request, eval_spec, load_evaluator, trajectory

TASKS = ENV_ROOT / "basics" / "tasks"
TASK_IDS = sorted(p.name for p in TASKS.iterdir() if p.is_dir())
basics_eval = load_evaluator("basics")


def _workspace(task_id: str, tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(TASKS / task_id / "files", ws)  # what the launcher does (copytree keeps modes)
    return ws


def _expected(task_id: str) -> dict:
    return json.loads((TASKS / task_id / "expected.json").read_text())


def _grade(task_id: str, ws: Path) -> dict:
    row = {
        "id": task_id,
        "instruction": (TASKS / task_id / "instruction.md").read_text(),
        "expected": _expected(task_id),
        "files_dir": str(TASKS / task_id / "files"),
    }
    return basics_eval.evaluate(
        eval_request("basics", row, workspace=str(ws)), eval_spec("basics"), trajectory()
    )


def _command_in(instruction: str) -> str | None:
    """The command of the instruction's ```bash block, if it shows one."""
    if "```bash\n" not in instruction:
        return None
    return instruction.split("```bash\n", 1)[1].split("\n```", 1)[0]


def test_the_grader_is_the_workspace_grader() -> None:
    import env.workspace.rule_evaluator as workspace_grader

    assert basics_eval.evaluate is workspace_grader.evaluate  # imported, not copied
    assert TASK_IDS == ["read_name", "run_script", "tally"]


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_no_instruction_holds_an_expected_value(task_id: str) -> None:
    instruction = (TASKS / task_id / "instruction.md").read_text()
    for value in _expected(task_id).values():
        assert str(value) not in instruction


@pytest.mark.parametrize("task_id", ["run_script", "tally"])
def test_the_shown_command_solves_the_task_and_nothing_else_does(task_id: str, tmp_path: Path) -> None:
    ws = _workspace(task_id, tmp_path)
    assert _grade(task_id, ws) == {
        "score": 0,
        "reason": "outputs/answer.json is missing",
        "artifacts": {"answer": None},
    }
    command = _command_in((TASKS / task_id / "instruction.md").read_text())
    assert command is not None and command.startswith("./")
    subprocess.run(["bash", "-c", command], cwd=ws, check=True, capture_output=True)
    answer = json.loads((ws / "outputs" / "answer.json").read_text())
    assert answer == _expected(task_id)  # the script computes the expected value from the task's files
    assert _grade(task_id, ws)["score"] == 10


def test_read_name_scores_10_only_for_the_exact_name(tmp_path: Path) -> None:
    ws = _workspace("read_name", tmp_path)
    (ws / "outputs").mkdir()
    name = (ws / "name.txt").read_text().strip()
    for answer, score in (
        ({"name": name}, 10),
        ({"name": name.split()[0]}, 0),
        ({"name": name.lower()}, 0),
        ({"answer": name}, 0),
    ):
        (ws / "outputs" / "answer.json").write_text(json.dumps(answer))
        assert _grade("read_name", ws)["score"] == score, answer


def test_a_wrong_number_scores_0(tmp_path: Path) -> None:
    ws = _workspace("tally", tmp_path)
    (ws / "outputs").mkdir()
    (ws / "outputs" / "answer.json").write_text(json.dumps({"winner": "tea", "votes": 2}))
    assert _grade("tally", ws) == {
        "score": 0,
        "reason": "mismatch at answer.votes: expected 3, got 2",
        "artifacts": {"answer": {"winner": "tea", "votes": 2}},
    }


def test_env_yaml_and_cases() -> None:
    from rollout.core.envs import load_cases, load_env_config

    config = yaml.safe_load((ENV_ROOT / "basics" / "env.yaml").read_text())
    assert config["runtime"]["command"] == ["{python}", "-m", "env.task_runtime"]
    assert config["params"]["protocol"] == "text"
    assert (config["max_steps"], config["group_size"]) == (3, 4)
    cfg = load_env_config(ENV_ROOT / "basics" / "env.yaml")
    cases = load_cases(cfg)
    assert [c.case_id for c in cases] == TASK_IDS
    assert set(cases[0].public_row()) == {"id", "instruction"}
