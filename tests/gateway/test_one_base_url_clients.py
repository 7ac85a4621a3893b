"""The real inspect_ai and verifiers clients driving the gateway through ONE base URL (``/v1``,
no session in the path): each inspect sample and each verifiers rollout is its own session,
named by the header the client sends (``x-session-id``); inspect's sessions then graded by
``launcher.py grade`` with the gsm8k env's evaluator. Needs the ``clients`` extra."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from rollout.cli.feed import build_parser as feed_parser
from rollout.cli.feed import export
from rollout.cli.grade import main as grade_main
from rollout.servers.viewer.app import create_app
from rollout.servers.viewer.db import open_queries
from rollout.servers.viewer.stats import HiddenFields
from store import Store, utcnow
from tests.fake_upstream import FakeRequest, FakeUpstream, Reply, chat_completion
from tests.gateway.conftest import Gateway

REPO = Path(__file__).resolve().parents[2]

# Each client runs in a process of its own: both configure logging, leave event loops, sockets and
# streams open and import warnings of their own, none of which may reach the tests after these.
INSPECT = """
    import json, sys
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate, user_message

    task = Task(dataset=[Sample(input="q1", target="fake"), Sample(input="q2", target="fake")],
                solver=[generate(), user_message("again"), generate()], scorer=includes())
    # inspect's openrouter provider sends x-session-id: <sample uuid> with every call of a sample
    (log,) = eval(task, model="openrouter/m", model_base_url=sys.argv[1] + "/v1", epochs=2, max_retries=0,
                  log_dir=sys.argv[2])
    print(json.dumps({"status": log.status, "ids": [s.uuid for s in log.samples or []]}))
"""

INSPECT_GSM8K = """
    import json, sys
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate

    task = Task(dataset=[Sample(input="q-right", target="33"), Sample(input="q-wrong", target="33")],
                solver=[generate()], scorer=includes())
    (log,) = eval(task, model="openrouter/m", model_base_url=sys.argv[1] + "/v1", max_retries=0, log_dir=sys.argv[2])
    print(json.dumps({"status": log.status, "ids": {s.input: s.uuid for s in log.samples or []},
                      "scores": {s.input: s.scores["includes"].value for s in log.samples or []}}))
"""

VERIFIERS = """
    import asyncio, json, sys
    import verifiers as vf
    from datasets import Dataset
    from verifiers.types import ClientConfig

    class TwoTurns(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            return [{"role": "user", "content": "again"}]

    data = Dataset.from_list([{"question": "q1", "answer": "a"}, {"question": "q2", "answer": "b"}])
    env = TwoTurns(dataset=data, eval_dataset=data, max_turns=2,
                   rubric=vf.Rubric(funcs=[lambda completion, answer, **kw: 1.0]))
    # what `vf-eval` sets by default: X-Session-ID = the rollout's trajectory id
    client = ClientConfig(api_base_url=sys.argv[1] + "/v1", api_key_var="GATEWAY_API_KEY", max_retries=0,
                          extra_headers_from_state={"X-Session-ID": "trajectory_id"})
    out = asyncio.run(env.evaluate(client=client, model="m", num_examples=2, rollouts_per_example=2,
                                   max_concurrent=4, on_progress=[], state_columns=["trajectory_id"]))
    print(json.dumps({"status": "success", "ids": [o["trajectory_id"] for o in out["outputs"]]}))
"""


async def _client(script: str, gw: Gateway, tmp_path: Path) -> dict[str, object]:
    """Run ``script`` (the gateway's URL and a log folder as arguments) in a process of its own;
    the JSON object on its last stdout line."""
    path = tmp_path / "client.py"
    path.write_text(textwrap.dedent(script))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "INSPECT_DISPLAY": "none",
        "OPENROUTER_API_KEY": "unused",
        "GATEWAY_API_KEY": "unused",
    }  # the gateway has no auth here
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(path),
        gw.url,
        str(tmp_path / "logs"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()[-3000:]
    result: dict[str, object] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def _sessions(gw: Gateway) -> dict[str, list[tuple[int, str | None]]]:
    """Each recorded session: its steps' ``(seq, meta_json.session_header)``, as the store reads them."""
    sids = [row["session_id"] for row in gw.sql("SELECT DISTINCT session_id FROM session_steps")]
    return {
        sid: [(s.seq, (s.meta_json or {}).get("session_header")) for s in await gw.steps(sid)] for sid in sids
    }


async def test_each_inspect_sample_is_its_own_session(
    gw: Gateway, upstream: FakeUpstream, tmp_path: Path
) -> None:
    pytest.importorskip("inspect_ai", reason="the `clients` extra (inspect-ai) is not installed")
    result = await _client(INSPECT, gw, tmp_path)
    uuids = set(result["ids"])  # type: ignore[call-overload]
    assert result["status"] == "success" and len(uuids) == 4  # 2 samples x 2 epochs
    assert await _sessions(gw) == {u: [(1, "x-session-id"), (2, "x-session-id")] for u in uuids}
    assert {r.path for r in upstream.requests} == {"/v1/chat/completions"} and len(upstream.requests) == 8


async def test_each_verifiers_rollout_is_its_own_session(
    gw: Gateway, upstream: FakeUpstream, tmp_path: Path
) -> None:
    pytest.importorskip("verifiers", reason="the `clients` extra (verifiers) is not installed")
    result = await _client(VERIFIERS, gw, tmp_path)
    trajectories = set(result["ids"])  # type: ignore[call-overload]
    assert len(trajectories) == 4  # 2 examples x 2 rollouts
    assert await _sessions(gw) == {t: [(1, "x-session-id"), (2, "x-session-id")] for t in trajectories}
    assert len(upstream.requests) == 8


def _answer_by_question(req: FakeRequest) -> Reply | None:
    """gsm8k case 0's answer (33) to the question ``q-right``, a wrong one (7) to any other."""
    body = req.json if isinstance(req.json, dict) else {}
    if req.path != "/v1/chat/completions" or body.get("stream"):
        return None
    last = str(body["messages"][-1]["content"])
    return Reply.json(chat_completion("so #### 33" if "q-right" in last else "so #### 7"))


async def test_inspect_samples_graded_by_an_envs_evaluator(
    gw: Gateway, upstream: FakeUpstream, tmp_path: Path
) -> None:
    pytest.importorskip("inspect_ai", reason="the `clients` extra (inspect-ai) is not installed")
    upstream.add_rule(_answer_by_question)
    since = utcnow()
    result = await _client(INSPECT_GSM8K, gw, tmp_path)
    ids: dict[str, str] = result["ids"]  # type: ignore[assignment]
    assert result["status"] == "success" and sorted(ids) == ["q-right", "q-wrong"]
    assert result["scores"] == {"q-right": "C", "q-wrong": "I"}
    for question, sid in ids.items():  # the run is over: close its sessions, give inspect's own score
        assert (await gw.http().post(f"/v1/sessions/{sid}/close")).status_code == 200
        r = await gw.http().post(
            f"/v1/sessions/{sid}/score",
            json={"reward": 1.0 if question == "q-right" else 0.0, "reason": "inspect includes"},
        )
        assert r.status_code == 200, r.text
    db = gw.settings.storage_config.db_url
    grade = [
        "--env",
        "gsm8k",
        "--agent-root",
        str(REPO / "env"),
        "--db-path",
        db,
        "--since",
        since.isoformat(),
        "--case",
        "0",
        "--job-id",
        "inspect-gsm8k",
        "--grader-isolation",
        "none",
        "--out",
        str(tmp_path / "g.jsonl"),
    ]
    assert await asyncio.to_thread(grade_main, grade) == 0
    right, wrong = ids["q-right"], ids["q-wrong"]

    store = Store(db)
    try:
        rows = {r.session_id: r for r in await store.job_sessions("inspect-gsm8k")}
    finally:
        await store.close()
    assert {s: (r.env_name, r.case_id, r.status, r.eval_status, r.reward) for s, r in rows.items()} == {
        right: ("gsm8k", "0", "succeeded", "scored", 10.0),
        wrong: ("gsm8k", "0", "succeeded", "scored", 0.0),
    }
    jsonl = [json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines()]
    assert sorted((r["session_id"], r["score"]) for r in jsonl) == sorted([(right, 10.0), (wrong, 0.0)])

    engine, queries = await open_queries(db)
    app = create_app(queries, HiddenFields(REPO / "env"))
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://viewer"
        ) as viewer:
            job = await viewer.get("/jobs/inspect-gsm8k")
            listing = await viewer.get("/jobs/inspect-gsm8k/sessions")
            page = await viewer.get(f"/sessions/{wrong}")
    finally:
        await engine.dispose()
    assert job.status_code == listing.status_code == page.status_code == 200
    assert "gsm8k" in job.text and "5.00" in job.text  # the mean of 10 and 0
    for sid, shown in (
        (right, '<span class="score pass">10.00</span>'),
        (wrong, '<span class="score zero">0.00</span>'),
    ):
        row = listing.text.split(f'<tr data-session="{sid}">', 1)[1].split("</tr>", 1)[0]
        assert shown in row
    assert 'id="client-score">client score: 0 (inspect includes)' in page.text

    out = tmp_path / "export.jsonl"
    args = feed_parser().parse_args(
        ["export", "--job-id", "inspect-gsm8k", "--db-path", db, "--out", str(out)]
    )
    assert await export(args) == 0
    exported = {r["session_id"]: r for r in (json.loads(line) for line in out.read_text().splitlines())}
    assert {s: (r["score"], r["case_id"], r["valid"]) for s, r in exported.items()} == {
        right: (10.0, "0", True),
        wrong: (0.0, "0", True),
    }
