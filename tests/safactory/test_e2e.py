"""Safactory's evaluation-guide command line, on a Safactory-shaped env folder (its task and start
YAMLs, its runner and evaluator shapes), through the real launcher, gateway and sandbox: the
reward stored is the evaluator's score on the 0..10 scale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.fake_upstream import FakeUpstream
from tests.test_launcher import gateway_config, launch, rows

FIXTURES = Path(__file__).parent / "fixtures"


async def test_the_guides_command_runs_a_safactory_env_folder(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "mybench", tmp_path / "env" / "mybench")
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, tmp_path / "other.db")
        code, out, err = await launch(
            "--agent-config", "env/mybench/mybench_config.yaml",
            "--agent-start-config", "env/mybench/mybench_start.yaml",
            "--gateway-config", str(cfg), "--llm-model", "fake", "--enable-evaluation",
            "--db-path", "sqlite://env_trajs.db", "--pool-size", "1", "--job-id", "sf", cwd=tmp_path)
        assert code == 0, err
        assert len(up.requests) == 2
    db = tmp_path / "env_trajs.db"  # relative to the working directory, as Safactory means it
    assert db.is_file() and not (tmp_path / "other.db").exists()
    got = rows(db, "SELECT case_id, status, eval_status, reward, eval_detail FROM job_environments "
                   "WHERE job_id = 'sf' ORDER BY case_id")
    assert [(c, s, e, round(r, 6)) for c, s, e, r, _ in got] == [
        ("0", "succeeded", "scored", 9.1), ("1", "succeeded", "scored", 5.0)]
    results = [json.loads(r) for (r,) in rows(db, "SELECT result FROM job_environments WHERE job_id = 'sf' "
                                                  "ORDER BY case_id")]
    assert [(r["total_reward"], r["metrics"]["task_id_env"]) for r in results] == [(0.0, "case-001"), (0.0, "case-002")]
    detail = json.loads(got[0][4])
    assert detail["artifacts"] == {"task_id": "case-001", "steps": 1, "last": True}
    steps = rows(db, "SELECT count(*) FROM session_steps WHERE job_id = 'sf'")
    assert steps == [(2,)]


async def test_the_guides_own_files_are_refused_one_line_per_key(tmp_path: Path) -> None:
    env = tmp_path / "env" / "mybench"
    shutil.copytree(FIXTURES / "mybench", env)
    shutil.copy(FIXTURES / "doc_mybench_config.yaml", env / "mybench_config.yaml")
    shutil.copy(FIXTURES / "doc_mybench_start.yaml", env / "mybench_start.yaml")
    (env / "mybench_start.yaml").write_text((env / "mybench_start.yaml").read_text().replace("./mybench/", "./"))
    code, _, err = await launch("--agent-config", "env/mybench/mybench_config.yaml",
                                "--agent-start-config", "env/mybench/mybench_start.yaml",
                                "--db-path", "sqlite://env_trajs.db", "--pool-size", "1", cwd=tmp_path)
    assert code == 1
    lines = [ln for ln in err.splitlines() if "mybench_" in ln and "ignored" not in ln]
    assert len(lines) == 2, err
    assert "environments[0].env_image: container images do not run here" in lines[0]
    assert "container.mounts: host folders are not bound into the sandbox here" in lines[1]
    assert "Traceback" not in err and "http" not in err
