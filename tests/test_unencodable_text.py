"""Text no UTF-8 can carry (a lone UTF-16 surrogate, the JSON escape ``"\\ud800"``) and NUL, end to
end: in a client's request, in the model's answer (streamed and not), in a dataset's case id, in
a runtime's result metrics and error text, in an evaluator's reason and artifacts. One job through
the real launcher, gateway and fake upstream, on SQLite and PostgreSQL; then every reader: the
JSONL and the summary table, the viewer's session page, the feed (a trainer's client reading past
that group, pages and SSE), the export (JSONL, Parquet), the HTML report, ``--regrade`` and
``--resume``. The rule: docs/storage.md, "Text that is not UTF-8"."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import yaml

from rollout.results.feed_schema import FeedGroupOut
from rollout.servers.feed.client import FeedClient
from store import Store
from tests.fake_upstream import FakeRequest, FakeUpstream, Reply, chat_completion, chat_stream
from tests.test_launcher import REPO, gateway_config, launch

ANSWER = "bad \ud800 answer"
STREAMED = "streamed \udc00 answer"
QUESTION = "say \ud800 and \x00"

RUNTIME = r"""
import json
import httpx
from env.runtime_kit import run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    row = req.env_params["dataset"]
    url = req.gateway_base_url + "/chat/completions"
    body = {"model": req.model, "messages": [{"role": "user", "content": row["q"]}]}
    # the request's bytes hold the escapes (json.dumps' default), as any client may send them
    plain = httpx.post(url, content=json.dumps(body).encode(), headers={"content-type": "application/json"},
                       timeout=60)
    streamed = httpx.post(url, content=json.dumps({**body, "stream": True}).encode(),
                          headers={"content-type": "application/json"}, timeout=60)
    text = plain.json()["choices"][0]["message"]["content"]
    relayed = b"\\ud800" in plain.content and b"\\udc00" in streamed.content
    if row.get("fail"):
        return SimulationStartResult(session_id=req.session_id, status="failed", step_count=2,
                                     error_text="tool \udfff broke\x00", metrics={"text": text})
    return SimulationStartResult(session_id=req.session_id, status="succeeded", step_count=2,
                                 metrics={"text": text, "relayed": relayed, "q": row["q"]})

run_runtime(main)
"""

EVALUATOR = r"""
def evaluate(request, spec, trajectory):
    return {"score": 10, "reason": "saw \x00 " + trajectory.final_response,
            "artifacts": {"final": trajectory.final_response}}
"""


OWN_RESULT_LINE = r"""
import json, sys
req = json.loads(sys.stdin.read())
# a runtime that writes its own result line: escapes of a lone surrogate and of NUL in its metrics
print(json.dumps({"session_id": req["session_id"], "status": "succeeded", "step_count": 0,
                  "metrics": {"seen": req["env_params"]["dataset"]["id"], "nul": "\x00", "lone": "\udbff"}}))
"""

NO_STEPS_EVALUATOR = r"""
def evaluate(request, spec, trajectory):
    return {"score": 10, "reason": "case " + request.env_params["dataset"]["id"]}
"""


def make_env(
    root: Path, cases: list[dict[str, object]], runtime: str = RUNTIME, evaluator: str = EVALUATOR
) -> Path:
    env_dir = root / "toy"
    (env_dir / "data").mkdir(parents=True)
    (env_dir / "runtime.py").write_text(runtime)
    (env_dir / "rule_evaluator.py").write_text(evaluator)
    (env_dir / "data" / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
    cfg = {
        "name": "toy",
        "dataset": {"format": "jsonl", "path": "data/cases.jsonl", "id_field": "id"},
        "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 60},
        "max_steps": 4,
    }
    (env_dir / "env.yaml").write_text(yaml.safe_dump(cfg))
    return env_dir


def answer(req: FakeRequest) -> Reply | None:
    """A lone surrogate in every answer: as JSON, and as SSE chunks when streamed."""
    if not req.path.endswith("/chat/completions"):
        return None
    if isinstance(req.json, dict) and req.json.get("stream"):
        return Reply.sse(chat_stream(chat_completion(STREAMED), include_usage=False))
    return Reply.json(chat_completion(ANSWER))


@contextmanager
def serving(*args: str, cwd: Path, ready: str) -> Iterator[str]:
    """``launcher.py ARGS --port 0`` as a subprocess; yields the URL of its first stdout line
    (``<ready> URL ...``)."""
    log = cwd / f"{args[0]}.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "launcher.py"), *args, "--port", "0"],
            cwd=str(cwd),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(ready), f"{line!r} {log.read_text(errors='replace')}"
        yield line.split()[len(ready.split())].rstrip("/")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "launcher.py"), *args],
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


async def test_lone_surrogates_in_requests_and_answers_reach_every_reader(
    tmp_path: Path, store_url: str
) -> None:
    """A request holding a lone surrogate and NUL, answers holding one (JSON and SSE), metrics,
    an error text and an evaluator's reason and artifacts holding them: the job ends, and the
    JSONL, the table, the viewer, the feed, the export and the report read it."""
    env_root = tmp_path / "envs"
    make_env(env_root, [{"id": "asks", "q": QUESTION}, {"id": "plain", "q": "hi", "fail": True}])
    out = tmp_path / "out.jsonl"
    async with FakeUpstream() as up:
        up.add_rule(answer)
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, store_url)
        code, stdout, stderr = await launch(
            "--agent-root",
            str(env_root),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            store_url,
            "--enable-evaluation",
            "--pool-size",
            "2",
            "--rl-group-size",
            "2",
            "--job-id",
            "bytes",
            "--out",
            str(out),
            cwd=tmp_path,
        )
        forwarded = [r.body for r in up.requests if r.path.endswith("/chat/completions")]

    assert code == 0, stderr
    # the summary table, on a terminal that carries UTF-8 only
    assert "toy" in stdout and "pass@" in stdout
    # the gateway forwards the request's bytes as they came: the escapes, never the text re-encoded
    assert len(forwarded) == 8 and sum(b"say \\ud800 and \\u0000" in b for b in forwarded) == 4

    # the JSONL: every line strict JSON, the model's text kept exactly (as escapes)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 4
    by_case: dict[str, list[dict[str, object]]] = {}
    for r in records:
        by_case.setdefault(str(r["case_id"]), []).append(r)
    assert sorted(by_case) == ["asks", "plain"]
    for r in records:
        assert (r["status"], r["eval_status"], r["score"]) == (
            ("succeeded", "scored", 10.0) if r["case_id"] != "plain" else ("failed", "scored", 10.0)
        )
        steps = r["trajectory"]
        assert [s["content"] for s in steps] == [ANSWER, STREAMED]  # type: ignore[index]
        assert r["reason"] == "saw \\u0000 streamed \\udc00 answer"
    a = by_case["asks"][0]
    assert a["trajectory"][0]["messages"] == [{"role": "user", "content": QUESTION}]  # type: ignore[index]
    assert by_case["plain"][0]["error"] == "tool \\udfff broke\\u0000"

    # the store keeps the JSON values exactly: request, answer, metrics, artifacts
    store = Store(store_url)
    await store.init()
    try:
        steps = await store.trajectory(str(a["session_id"]))
        assert [s.messages for s in steps][0] == [{"role": "user", "content": QUESTION}]
        assert steps[0].response["choices"][0]["message"]["content"] == ANSWER
        assert steps[1].response["choices"][0]["message"]["content"] == STREAMED
        (env,) = await store.job_sessions_by_id([str(a["session_id"])])
        assert env.result is not None and env.eval_detail is not None
        assert env.result["metrics"] == {"text": ANSWER, "relayed": True, "q": QUESTION}
        assert env.eval_detail["artifacts"] == {"final": STREAMED}
    finally:
        await store.close()

    # the viewer's session page of that session
    with serving(
        "view", "--db-path", store_url, "--agent-root", str(env_root), cwd=tmp_path, ready="viewer on"
    ) as url:
        async with httpx.AsyncClient(timeout=60) as http:
            page = await http.get(f"{url}/sessions/{a['session_id']}")
            job = await http.get(f"{url}/jobs/bytes/sessions")
            report = await http.get(f"{url}/jobs/bytes/report")
    assert page.status_code == 200, page.text
    assert "bad \ufffd answer" in page.text  # HTML carries UTF-8 only: U+FFFD in text
    assert "bad \\ud800 answer" in page.text  # and the escape in the JSON values it shows
    assert job.status_code == 200 and report.status_code == 200

    # the feed: a trainer's client reads both groups, the surrogate's kept as escapes on the wire
    with serving("feed", "--db-path", store_url, cwd=tmp_path, ready="feed on") as url:

        def read_all() -> list[FeedGroupOut]:
            with FeedClient(url) as client:
                return list(client.groups("bytes", wait_s=0))

        groups = await asyncio.to_thread(read_all)
        raw = (await asyncio.to_thread(httpx.get, f"{url}/v1/jobs/bytes/groups", timeout=60)).content
        async with httpx.AsyncClient(timeout=60) as http:  # the SSE stream of the same groups, to its end
            events = (await http.get(f"{url}/v1/jobs/bytes/groups/stream")).text
    assert sorted(g.case_id for g in groups) == ["asks", "plain"]
    assert b"bad \\ud800 answer" in raw
    datas = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: ")]
    assert [d.get("case_id") for d in datas[:-1]] == [g.case_id for g in groups] and datas[-1]["done"] is True
    texts = {s.steps[0].content for g in groups for s in g.samples if s.steps is not None}
    assert texts == {ANSWER}

    # export and the HTML report
    ex = run(
        "export",
        "--db-path",
        store_url,
        "--job-id",
        "bytes",
        "--out",
        str(tmp_path / "x.jsonl"),
        cwd=tmp_path,
    )
    assert ex.returncode == 0, ex.stderr
    rows = [json.loads(line) for line in (tmp_path / "x.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 4 and {r["steps"][0]["content"] for r in rows} == {ANSWER}
    ex = run(
        "export",
        "--db-path",
        store_url,
        "--job-id",
        "bytes",
        "--format",
        "parquet",
        "--out",
        str(tmp_path / "x.parquet"),
        cwd=tmp_path,
    )
    assert ex.returncode == 0, ex.stderr
    table = pq.read_table(tmp_path / "x.parquet").to_pylist()
    # a Parquet string is UTF-8: U+FFFD; its JSON-valued columns keep the escape
    assert {s["steps"][0]["content"] for s in table} == {"bad \ufffd answer"}
    assert {json.loads(s["steps"][0]["messages"])[0]["content"] for s in table} == {QUESTION, "hi"}
    rep = run(
        "report", "--db-path", store_url, "--job-id", "bytes", "--out", str(tmp_path / "r.html"), cwd=tmp_path
    )
    assert rep.returncode == 0, rep.stderr
    assert (tmp_path / "r.html").read_text(encoding="utf-8")

    # graded again from the store: the evaluator reads the same steps, the JSONL is written
    code, stdout, stderr = await launch(
        "--regrade",
        "--job-id",
        "bytes",
        "--db-path",
        store_url,
        "--agent-root",
        str(env_root),
        "--out",
        str(tmp_path / "regraded.jsonl"),
        cwd=tmp_path,
    )
    assert code == 0, stderr
    regraded = [
        json.loads(line) for line in (tmp_path / "regraded.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert {r["reason"] for r in regraded} == {"saw \\u0000 streamed \\udc00 answer"}


async def test_a_case_id_and_a_result_line_holding_a_lone_surrogate(tmp_path: Path, store_url: str) -> None:
    """A dataset case id holding a lone surrogate (and one holding NUL), and a runtime that prints
    its own result line with their escapes in its metrics: the case id is stored escaped (one id
    in the store, the JSONL, the feed), its dataset row and the metrics exactly; the job ends."""
    env_root = tmp_path / "envs"
    make_env(env_root, [{"id": "a\ud800"}, {"id": "b\x00"}], OWN_RESULT_LINE, NO_STEPS_EVALUATOR)
    out = tmp_path / "out.jsonl"
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, store_url)
        code, stdout, stderr = await launch(
            "--agent-root",
            str(env_root),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            store_url,
            "--enable-evaluation",
            "--pool-size",
            "2",
            "--rl-group-size",
            "2",
            "--job-id",
            "ids",
            "--out",
            str(out),
            cwd=tmp_path,
        )
    assert code == 0, stderr
    assert "toy" in stdout and "pass@" in stdout
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    # a text column keeps a lone surrogate or NUL as its escape: the case id is that, everywhere
    assert sorted(r["case_id"] for r in records) == ["a\\ud800", "a\\ud800", "b\\u0000", "b\\u0000"]
    assert {(r["status"], r["score"]) for r in records} == {("succeeded", 10.0)}
    assert {r["reason"] for r in records} == {"case a\\ud800", "case b\\u0000"}
    # two groups (a case's samples), told apart
    assert len({r["group_id"] for r in records}) == 2
    store = Store(store_url)
    await store.init()
    try:
        envs = await store.job_sessions_by_id([str(r["session_id"]) for r in records])
        # a job cut short: its stored case ids match the dataset's again, so --resume runs the rest
        await store.update_job_session(envs[0].session_id, finished=False, status="cancelled")
    finally:
        await store.close()
    async with FakeUpstream() as up:
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, store_url)
        code, _, stderr = await launch(
            "--agent-root",
            str(env_root),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            store_url,
            "--enable-evaluation",
            "--job-id",
            "ids",
            "--resume",
            "--out",
            str(tmp_path / "again.jsonl"),
            cwd=tmp_path,
        )
    assert code == 0, stderr
    again = {r["session_id"]: r for r in map(json.loads, (tmp_path / "again.jsonl").read_text().splitlines())}
    assert len(again) == 4 and again[envs[0].session_id]["attempts"][-1]["attempt"] == 2
    for env in envs:
        assert env.env_params is not None and env.result is not None
        raw_id = env.env_params["dataset"]["id"]
        assert raw_id in ("a\ud800", "b\x00")  # the dataset row, exactly
        assert env.result["metrics"] == {"seen": raw_id, "nul": "\x00", "lone": "\udbff"}
    ex = run(
        "export", "--db-path", store_url, "--job-id", "ids", "--out", str(tmp_path / "x.jsonl"), cwd=tmp_path
    )
    assert ex.returncode == 0, ex.stderr
    rows = [json.loads(line) for line in (tmp_path / "x.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sorted(r["case_id"] for r in rows) == ["a\\ud800", "a\\ud800", "b\\u0000", "b\\u0000"]
