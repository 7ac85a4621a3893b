"""The scripts env: generated instances of one skill, split train/eval by a field, disjoint by
construction; each instance's script writes the answer its hidden ``expected`` holds; the grader
reads the answer file against that field only, so a forged or recomputed-from-edited-data answer
scores 0. The launcher test runs it end to end with a scripted model (sandbox, runtime, grader)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from env.scripts import generate
from env.scripts.runtime import write_files
from rollout.core.envs import load_cases, load_env_config
from tests.fake_upstream import FakeRequest, FakeUpstream, Reply, chat_completion
from tests.test_launcher import REPO, gateway_config, launch, rows

ENV = REPO / "env" / "scripts"


def _grade(row: dict[str, Any], workspace: Path) -> dict[str, Any]:
    from env.scripts.rule_evaluator import evaluate

    return evaluate(SimpleNamespace(env_params={"dataset": row}, workspace=str(workspace)), None, None)


def test_the_dataset_is_the_generators_output_split_disjoint_by_construction() -> None:
    assert (ENV / "data" / "cases.jsonl").read_text(encoding="utf-8") == generate.render()
    cases = load_cases(load_env_config(ENV / "env.yaml"))
    train = [c for c in cases if c.row["split"] == "train"]
    evals = [c for c in cases if c.row["split"] == "eval"]
    assert (len(train), len(evals), len(cases)) == (5, 12, 17)
    names = [set(c.row["files"]) for c in cases]
    assert len(set().union(*names)) == 2 * len(cases)  # no script or data file in two instances
    assert all(
        c.public_row().keys() == {"id", "split", "instruction", "files"} for c in cases
    )  # expected hidden
    assert {c.row["instruction"].split("\n")[1] for c in cases} == {
        f"./{n}" for ns in names for n in ns if n.endswith(".sh")
    }


def test_each_script_writes_its_expected_answer_and_only_that_answer_scores(tmp_path: Path) -> None:
    for row in generate.instances():
        ws = tmp_path / str(row["id"])
        ws.mkdir()
        write_files(row["files"], ws)  # type: ignore[arg-type]
        assert _grade(row, ws)["score"] == 0  # nothing run yet: no answer file
        script = next(n for n in row["files"] if n.endswith(".sh"))  # type: ignore[union-attr]
        subprocess.run([f"./{script}"], cwd=ws, check=True, capture_output=True, timeout=30)
        assert json.loads((ws / "outputs" / "answer.json").read_text()) == row["expected"]
        assert _grade(row, ws) == {
            "score": 10,
            "reason": "all 1 expected keys match",
            "artifacts": {"answer": row["expected"]},
        }
        data = next(n for n in row["files"] if n.endswith(".txt"))  # type: ignore[union-attr]
        (ws / data).write_text("1000\n")  # the agent edits the data and reruns: the hidden answer decides
        subprocess.run([f"./{script}"], cwd=ws, check=True, capture_output=True, timeout=30)
        assert _grade(row, ws)["score"] == 0


def test_a_file_name_that_is_not_plain_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a plain file name"):
        write_files({"../x.sh": "echo"}, tmp_path)
    assert not (tmp_path.parent / "x.sh").exists()


def _agent(mode: str) -> Any:
    def answer(req: FakeRequest) -> Reply | None:
        messages = req.json["messages"] if isinstance(req.json, dict) else []
        if len(messages) > 2:  # the command ran: submit
            return Reply.json(chat_completion("```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"))
        command = re.search(r"```bash\n(.*?)\n```", messages[-1]["content"], re.DOTALL)
        assert command is not None
        text = {
            "solve": command.group(1),
            "forge": "mkdir -p outputs && echo '{\"lines\": 5}' > outputs/answer.json",
        }[mode]
        return Reply.json(chat_completion(f"```bash\n{text}\n```"))

    return answer


@pytest.mark.parametrize("mode", ["solve", "forge"])
def test_the_env_runs_in_the_sandbox_and_is_graded_on_the_hidden_answer(tmp_path: Path, mode: str) -> None:
    """A model that runs the shown command passes a train and an eval instance; one that writes a
    guessed answer of the right shape scores 0."""
    db = tmp_path / "t.db"

    async def go() -> tuple[int, str, str]:
        async with FakeUpstream() as up:
            up.add_rule(_agent(mode))
            return await launch(
                "--agent-root",
                str(REPO / "env"),
                "--env",
                "scripts",
                "--case",
                "gauge-batch",
                "--case",
                "measure-list",
                "--llm-model",
                "fake",
                "--enable-evaluation",
                "--gateway-config",
                str(gateway_config(tmp_path / "gw.yaml", up.base_url, db)),
                "--db-path",
                f"sqlite://{db}",
                "--out",
                str(tmp_path / "out.jsonl"),
                cwd=tmp_path,
            )

    code, out, err = asyncio.run(go())
    assert code == 0, err
    scores = dict(rows(db, "SELECT case_id, reward FROM job_environments ORDER BY case_id"))
    assert scores == (
        {"gauge-batch": 10.0, "measure-list": 10.0}
        if mode == "solve"
        else {"gauge-batch": 0.0, "measure-list": 0.0}
    )
