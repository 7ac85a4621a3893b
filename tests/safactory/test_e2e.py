"""Safactory's evaluation-guide command line, on a Safactory-shaped env folder (its task and start
YAMLs, its runner and evaluator shapes), through the real launcher, gateway and sandbox: the
reward stored is the evaluator's score on the 0..10 scale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.fake_upstream import FakeUpstream
from tests.rollout.sandbox_helpers import require_bwrap
from tests.rollout.test_images import build_base_image
from tests.test_launcher import gateway_config, launch, rows

FIXTURES = Path(__file__).parent / "fixtures"


async def test_the_guides_command_runs_a_safactory_env_folder(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "mybench", tmp_path / "env" / "mybench")
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, tmp_path / "other.db")
        code, out, err = await launch(
            "--agent-config",
            "env/mybench/mybench_config.yaml",
            "--agent-start-config",
            "env/mybench/mybench_start.yaml",
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--enable-evaluation",
            "--db-path",
            "sqlite://env_trajs.db",
            "--pool-size",
            "1",
            "--job-id",
            "sf",
            cwd=tmp_path,
        )
        assert code == 0, err
        assert len(up.requests) == 2
    db = tmp_path / "env_trajs.db"  # relative to the working directory, as Safactory means it
    assert db.is_file() and not (tmp_path / "other.db").exists()
    got = rows(
        db,
        "SELECT case_id, status, eval_status, reward, eval_detail FROM job_environments "
        "WHERE job_id = 'sf' ORDER BY case_id",
    )
    assert [(c, s, e, round(r, 6)) for c, s, e, r, _ in got] == [
        ("0", "succeeded", "scored", 9.1),
        ("1", "succeeded", "scored", 5.0),
    ]
    results = [
        json.loads(r)
        for (r,) in rows(db, "SELECT result FROM job_environments WHERE job_id = 'sf' ORDER BY case_id")
    ]
    assert [(r["total_reward"], r["metrics"]["task_id_env"]) for r in results] == [
        (0.0, "case-001"),
        (0.0, "case-002"),
    ]
    detail = json.loads(got[0][4])
    assert detail["artifacts"] == {"task_id": "case-001", "steps": 1, "last": True}
    steps = rows(db, "SELECT count(*) FROM session_steps WHERE job_id = 'sf'")
    assert steps == [(2,)]


async def test_the_guides_own_files_are_refused_one_line_per_key(tmp_path: Path) -> None:
    env = tmp_path / "env" / "mybench"
    shutil.copytree(FIXTURES / "mybench", env)
    shutil.copy(FIXTURES / "doc_mybench_config.yaml", env / "mybench_config.yaml")
    shutil.copy(FIXTURES / "doc_mybench_start.yaml", env / "mybench_start.yaml")
    (env / "mybench_start.yaml").write_text(
        (env / "mybench_start.yaml").read_text().replace("./mybench/", "./")
    )
    code, _, err = await launch(
        "--agent-config",
        "env/mybench/mybench_config.yaml",
        "--agent-start-config",
        "env/mybench/mybench_start.yaml",
        "--db-path",
        "sqlite://env_trajs.db",
        "--pool-size",
        "1",
        cwd=tmp_path,
    )
    assert code == 1
    lines = [ln for ln in err.splitlines() if "mybench_" in ln and "ignored" not in ln]
    assert len(lines) == 1, err  # env_image is the env's image; the bind mounts cannot be had
    assert "container.mounts: host folders are not bound into the sandbox here" in lines[0]
    assert "Traceback" not in err and "http" not in err


IMAGE_RUNNER = """
import json, os, sys
request = json.loads(sys.stdin.read())
print(json.dumps({"session_id": request["session_id"], "status": "succeeded",
                  "metrics": {"cwd": os.getcwd(), "host_tools": os.path.exists("/usr/bin/buildah"),
                              "greeting": os.environ.get("GREETING"), "bench_passed": True, "bench_score": 1}}))
"""


@pytest.fixture(scope="module")
def stand_in_image() -> str:
    """The stand-in base image in the local container store (tests/rollout/test_images.py)."""
    return build_base_image()


async def test_a_task_config_with_env_image_runs_its_runner_inside_the_image(
    tmp_path: Path, stand_in_image: str
) -> None:
    require_bwrap()
    env = tmp_path / "env" / "imgbench"
    shutil.copytree(FIXTURES / "mybench", env)
    (env / "runner.py").write_text(IMAGE_RUNNER)
    (env / "rule_evaluator.py").write_text(
        "def evaluate(request, spec, trajectory):\n"
        "    metrics = getattr(request.start_result, 'metrics', {}) or {}\n"
        "    return {'score': 10.0 if metrics.get('cwd') == '/workspace/MyBench' else 0.0, 'reason': 'cwd'}\n"
    )
    (env / "imgbench_config.yaml").write_text(
        "environments:\n  - env_name: imgbench\n    env_image: mybench-image:latest\n"
        "    dataset: ./datasets/cases.jsonl\n    hidden_fields: [bench_score]\n"
        "    env_params: {evaluation: {rule_evaluator: env/imgbench/rule_evaluator.py}}\n"
    )
    (env / "imgbench_start.yaml").write_text(  # Safactory's shape: the runner copied into the container
        "agent_name: imgbench\ncontainer:\n  workdir: /workspace/MyBench\n  runner_entrypoint:\n"
        "    source: ./runner.py\n    target: /tmp/safactory-runner.py\n    command: python /tmp/safactory-runner.py\n"
        "  env: {GREETING: hello}\n"
    )
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, tmp_path / "other.db")
        code, _, err = await launch(
            "--agent-config",
            "env/imgbench/imgbench_config.yaml",
            "--agent-start-config",
            "env/imgbench/imgbench_start.yaml",
            "--image",
            f"mybench-image:latest={stand_in_image}",
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--enable-evaluation",
            "--db-path",
            "sqlite://env_trajs.db",
            "--pool-size",
            "1",
            "--job-id",
            "sfi",
            cwd=tmp_path,
        )
        assert code == 0, err[-3000:]
    got = rows(
        tmp_path / "env_trajs.db",
        "SELECT case_id, status, eval_status, reward, result FROM job_environments "
        "WHERE job_id = 'sfi' ORDER BY case_id",
    )
    assert [(c, s, e, r) for c, s, e, r, _ in got] == [
        ("0", "succeeded", "scored", 10.0),
        ("1", "succeeded", "scored", 10.0),
    ]
    metrics = json.loads(got[0][4])["metrics"]
    assert (metrics["cwd"], metrics["host_tools"], metrics["greeting"]) == (
        "/workspace/MyBench",
        False,
        "hello",
    )
