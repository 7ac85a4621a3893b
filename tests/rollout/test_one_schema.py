"""One record per session: the launcher's JSONL and ``launcher.py export`` come from one builder
(``rollout.results.session_fields``) and agree on every shared field, for a real job."""

from __future__ import annotations

import json
from pathlib import Path

from rollout.jobs.run import run_job
from rollout.results.session_fields import SCHEMA_VERSION, SessionFields
from rollout.servers.feed.export import export_job
from store import Store
from store.feed import FeedQueries
from tests.fake_upstream import FakeUpstream
from tests.rollout.test_attribution import EVALUATOR, make_env, options

CALLS_THE_MODEL = """
import json
from pathlib import Path
from env.runtime_kit import chat_completion, openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    client = openai_client(req)
    for _ in range(2):
        chat_completion(client, model="fake", messages=[{"role": "user", "content": "hi"}])
    if req.env_params["dataset"]["kind"] == "right":
        Path("outputs").mkdir(exist_ok=True)
        Path("outputs/answer.json").write_text(json.dumps({"answer": 42}))
    return SimulationStartResult(session_id=req.session_id, status="succeeded")

run_runtime(main)
"""


async def test_the_export_and_the_jsonl_agree_on_every_shared_field(tmp_path: Path) -> None:
    make_env(tmp_path / "envs", "answers", ["right", "wrong"], EVALUATOR)
    (tmp_path / "envs" / "answers" / "runtime.py").write_text(CALLS_THE_MODEL)
    async with FakeUpstream() as up:
        await run_job(options(tmp_path, up, job_id="one"))
    jsonl = {r["session_id"]: r for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    store = Store(f"sqlite://{tmp_path / 't.db'}")
    await store.init()
    try:
        await export_job(FeedQueries(store.reader), "one", "jsonl", tmp_path / "x.jsonl")
    finally:
        await store.close()
    exported = {r["session_id"]: r for r in map(json.loads, (tmp_path / "x.jsonl").read_text().splitlines())}
    assert set(jsonl) == set(exported) and len(jsonl) == 2
    shared = list(SessionFields.model_fields)
    for sid, row in jsonl.items():
        assert {k: row[k] for k in shared} == {k: exported[sid][k] for k in shared}
    right = next(r for r in jsonl.values() if r["case_id"] == "right0")
    assert (
        right["schema_version"],
        right["score"],
        right["reward"],
        right["eval_status"],
        right["step_count"],
    ) == (SCHEMA_VERSION, 10.0, 1.0, "scored", 2)
    assert right["usage"]["total_tokens"] > 0 and right["duration_s"] > 0
    assert right["started_at"] < right["finished_at"]
    assert [t["seq"] for t in right["step_timings"]] == [1, 2]
    assert all(t["latency_ms"] is not None and t["latency_ms"] >= 0 for t in right["step_timings"])
    assert right["eval_reason"] == right["reason"]
