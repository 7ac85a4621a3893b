"""The in-sandbox harness wrapper (``python -m rollout.contract.harness_runtime``) as a real subprocess: the
files it writes, the CLI's environment and output, the answer file and the result line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from rollout.contract.protocol import SimulationStartRequest, model_json

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = """
    import sys
    from rollout.contract.harness import Harness, HarnessLaunch

    CLI = '''
    import json, os, pathlib, sys
    cfg = json.loads(pathlib.Path(os.environ["HOME"], ".tiny", "config.json").read_text())
    print("tiny cli says hello")                        # the CLI's stdout: the harness log, not the result
    print("tiny cli warns", file=sys.stderr)
    mode = cfg["mode"]
    if mode == "answer":
        pathlib.Path("outputs").mkdir()
        pathlib.Path("outputs/answer.json").write_text(json.dumps(
            {"model": cfg["model"], "url": os.environ["TINY_URL"], "cwd": os.getcwd(), "home": os.environ["HOME"],
             "instruction": cfg["instruction"], "params": cfg["params"], "steps": cfg["steps"]}))
    elif mode == "garbage":
        pathlib.Path("outputs").mkdir()
        pathlib.Path("outputs/answer.json").write_text("not json")
    sys.exit(cfg["exit"])
    '''

    class Tiny(Harness):
        name = "tiny"
        version = "1"
        unavailable_exit_codes = frozenset({2})

        def launch(self, ctx):
            mode, code = ctx.params["mode"], ctx.params["exit"]
            where = "/etc/tiny.json" if mode == "outside" else f"{ctx.home}/.tiny/config.json"
            config = {"mode": mode, "exit": code, "model": ctx.model, "instruction": ctx.instruction,
                      "params": ctx.params, "steps": ctx.max_steps}
            import json
            if ctx.params.get("no_answer_file"):  # a task graded by its own tests (Harbor)
                print(f"solution_dir={ctx.solution_dir}", file=sys.stderr)
                return HarnessLaunch(argv=[sys.executable, "-c", f"import sys; sys.exit({code})"], answer_path=None)
            return HarnessLaunch(argv=[sys.executable, "-c", CLI], env={"TINY_URL": ctx.session_url},
                                 files={where: json.dumps(config)})

    HARNESS = Tiny()
"""


def _request(params: dict[str, Any], dataset: dict[str, Any] | None = None) -> str:
    return model_json(
        SimulationStartRequest(
            job_id="j",
            session_id="s1",
            agent_name="toy",
            agent_id="toy-0",
            group_id="g",
            gateway_base_url="http://127.0.0.1:41800/v1/sessions/s1",
            model="route-a",
            max_steps=6,
            env_params={
                **params,
                "dataset": {"id": "t1", "instruction": "Do the thing."} if dataset is None else dataset,
            },
        )
    )


def _run(
    tmp_path: Path,
    params: dict[str, Any],
    dataset: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    plugin = tmp_path / "tiny"
    plugin.mkdir(exist_ok=True)
    (plugin / "harness.py").write_text(textwrap.dedent(PLUGIN))
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "rollout.contract.harness_runtime", str(plugin), str(tmp_path / "cache")],
        input=_request(params, dataset),
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "sk-test", **(extra_env or {})},
    )


def test_the_wrapper_runs_the_cli_and_reports_its_answer(tmp_path: Path) -> None:
    p = _run(tmp_path, {"mode": "answer", "exit": 0, "max_tokens": 9})
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 1  # the result line only: the CLI's stdout went to the log
    result = json.loads(p.stdout)
    assert (result["session_id"], result["status"], result["error_text"], result["error_class"]) == (
        "s1",
        "succeeded",
        None,
        None,
    )
    answer = result["metrics"].pop("answer")
    assert result["metrics"] == {"harness": "tiny", "harness_exit": 0}
    home = answer.pop("home")
    assert answer == {
        "model": "route-a",
        "url": "http://127.0.0.1:41800/v1/sessions/s1",
        "cwd": str(tmp_path / "ws"),
        "instruction": "Do the thing.",
        "params": {"mode": "answer", "exit": 0, "max_tokens": 9},
        "steps": 6,
    }
    assert (
        not Path(home).is_relative_to(tmp_path / "ws") and not Path(home).exists()
    )  # private, removed after
    assert "tiny cli says hello" in p.stderr and "tiny cli warns" in p.stderr
    assert "tiny 1: " in p.stderr and "tiny exited with 0; answer: present" in p.stderr


def test_a_lone_surrogate_in_the_case_and_the_answer_is_kept_as_its_escape(tmp_path: Path) -> None:
    """The start request and the result line carry a lone surrogate as its JSON escape (pydantic's
    own JSON neither writes nor reads one): the instruction reaches the CLI, its answer comes back."""
    p = _run(tmp_path, {"mode": "answer", "exit": 0}, {"id": "t1", "instruction": "Do \ud800 it."})
    assert p.returncode == 0, p.stderr
    assert "\\ud800" in p.stdout
    result = json.loads(p.stdout)
    assert result["status"] == "succeeded" and result["metrics"]["answer"]["instruction"] == "Do \ud800 it."


def test_no_answer_and_the_unavailable_exit_code_is_an_infrastructure_failure(tmp_path: Path) -> None:
    p = _run(tmp_path, {"mode": "none", "exit": 2})
    result = json.loads(p.stdout)
    assert (result["status"], result["error_class"]) == ("failed", "upstream_unavailable")
    assert result["metrics"] == {"harness": "tiny", "harness_exit": 2, "answer": None}
    assert result["error_text"] == "outputs/answer.json is missing; tiny exited with code 2"


def test_an_answer_that_is_not_json_is_null_and_the_session_failed(tmp_path: Path) -> None:
    p = _run(tmp_path, {"mode": "garbage", "exit": 1})
    result = json.loads(p.stdout)
    assert (result["status"], result["error_class"]) == ("failed", None)  # exit 1 is not "unavailable"
    assert result["metrics"] == {"harness": "tiny", "harness_exit": 1, "answer": None}
    assert result["error_text"].startswith("outputs/answer.json is unreadable or not JSON")


def test_a_bad_launch_prints_no_result_and_says_why(tmp_path: Path) -> None:
    p = _run(tmp_path, {"mode": "outside", "exit": 0})
    assert (p.returncode, p.stdout) == (1, "")
    assert "harness file '/etc/tiny.json': must be an absolute path under" in p.stderr
    p = _run(tmp_path, {"mode": "answer", "exit": 0}, dataset={"id": "x", "question": "2+2?"})
    assert (p.returncode, p.stdout) == (1, "")
    assert "the case has no instruction (a harness runs task-directory envs only)" in p.stderr


def test_without_an_answer_file_the_exit_status_decides(tmp_path: Path) -> None:
    done = json.loads(_run(tmp_path, {"no_answer_file": True, "mode": "-", "exit": 0}).stdout)
    assert (done["status"], done["error_text"], done["error_class"]) == ("succeeded", None, None)
    assert done["metrics"] == {"harness": "tiny", "harness_exit": 0, "answer": None}
    down = json.loads(_run(tmp_path, {"no_answer_file": True, "mode": "-", "exit": 2}).stdout)
    assert (down["status"], down["error_text"], down["error_class"]) == (
        "failed",
        "tiny exited with code 2",
        "upstream_unavailable",
    )


def test_the_solution_folder_is_named_only_when_the_launcher_gives_it(tmp_path: Path) -> None:
    p = _run(tmp_path, {"no_answer_file": True, "mode": "-", "exit": 0})
    assert "solution_dir=None" in p.stderr
    p = _run(
        tmp_path, {"no_answer_file": True, "mode": "-", "exit": 0}, extra_env={"ROLLOUT_SOLUTION_DIR": "/s"}
    )
    assert "solution_dir=/s" in p.stderr


def test_an_env_without_answer_files_is_not_read_for_one(tmp_path: Path) -> None:
    """A Harbor env says ``answer_file: false``: a harness that writes no answer file succeeds on exit 0."""
    done = json.loads(_run(tmp_path, {"answer_file": False, "mode": "none", "exit": 0}).stdout)
    assert (done["status"], done["error_text"]) == ("succeeded", None)


def test_a_fifo_as_the_answer_file_is_refused_without_blocking(tmp_path: Path) -> None:
    (tmp_path / "ws" / "outputs").mkdir(parents=True)
    os.mkfifo(tmp_path / "ws" / "outputs" / "answer.json")
    result = json.loads(_run(tmp_path, {"mode": "none", "exit": 0}).stdout)
    assert (result["status"], result["error_text"]) == ("failed", "outputs/answer.json is not a regular file")
