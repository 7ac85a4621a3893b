"""The viewer on a job that ran harnesses: the harness next to the model in the session list, the
group page and the summary (a row per env, harness, model), read from a real store."""

from __future__ import annotations

from pathlib import Path

import httpx

from store import JobEnvironment, Store
from tests.viewer.conftest import Viewer


async def _store(db: Path) -> None:
    store = Store(f"sqlite://{db}")
    await store.init()
    rows = [
        JobEnvironment(
            session_id=f"s{i}",
            job_id="hj",
            env_name="tasks",
            case_id="t0",
            llm_model="m",
            harness=harness,
            group_id=f"g-{harness}",
            sample_index=k,
            status="succeeded",
            reward=score,
            eval_status="scored",
            finished=True,
            outcome="succeeded",
        )
        for i, (harness, k, score) in enumerate(
            [("bash-agent", 0, 10.0), ("bash-agent", 1, 0.0), ("codex", 0, 10.0), (None, 0, 0.0)]
        )
    ]
    await store.add_job_sessions(rows)
    await store.close()


async def test_the_harness_shows_where_sessions_and_groups_are_listed(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    await _store(db)
    (tmp_path / "envs").mkdir()
    viewer = Viewer(db, tmp_path / "envs", tmp_path)
    try:
        async with httpx.AsyncClient(base_url=viewer.url, timeout=60) as http:
            sessions = (await http.get("/jobs/hj/sessions")).text
            group = (await http.get("/groups/g-codex")).text
            job = (await http.get("/jobs/hj")).text
    finally:
        viewer.stop()
    assert "<th>harness</th><th>model</th>" in sessions
    for sid, shown in (("s0", "bash-agent"), ("s2", "codex"), ("s3", "-")):
        row = sessions[sessions.index(f'data-session="{sid}"') :]
        row = row[: row.index("</tr>")]
        assert f"<td>{shown}</td><td>m</td>" in row
    assert "case t0 · harness codex · m · 1 samples" in group
    summary = job[job.index('class="grid summary"') :]
    summary = summary[: summary.index("</table>")]
    assert "<th>env</th><th>harness</th><th>model</th>" in summary
    cells = [line.split("</td><td>")[:4] for line in summary.split("<tr><td>")[1:]]
    assert [c[:3] for c in cells] == [
        ["tasks", "(env)", "m"],
        ["tasks", "bash-agent", "m"],
        ["tasks", "codex", "m"],
    ]
    assert [c[3] for c in cells] == ["1", "2", "1"]  # sessions per (env, harness, model)
