"""Sessions without a job (a client named them on the gateway by path or header: ``gateway_sessions``
and ``session_steps`` rows, no launcher row) in the viewer, in process on a real SQLite store: the
home page's entry, their list (paging, sorts), their page (steps, gateway state, no score), search
links, and text a client wrote escaped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from rollout.servers.viewer.app import PAGE_SIZE, create_app
from rollout.servers.viewer.db import open_queries
from rollout.servers.viewer.stats import HiddenFields
from store import GatewaySession, JobEnvironment, SessionResult, SessionStep, Store
from store.queries import ViewerQueries
from store.search import StepSearch

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EVIL = "<img src=x onerror=alert(1)>"  # a gateway session id holds no "/"


def _step(sid: str, seq: int, text: str) -> SessionStep:
    return SessionStep(
        session_id=sid,
        seq=seq,
        step_id=seq,
        llm_model="qwen",
        endpoint="chat.completions",
        messages=[{"role": "user", "content": f"question {seq} {EVIL}"}],
        response={"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]},
        finish_reason="stop",
        prompt_tokens=4,
        completion_tokens=2,
        total_tokens=6,
        meta_json={"session_header": "x-session-id"},
    )


async def _fill(db: Path, n: int, *, with_job: bool) -> None:
    store = Store(f"sqlite://{db}")
    await store.init()
    try:
        if with_job:
            await store.add_job_sessions(
                [
                    JobEnvironment(
                        session_id="launched",
                        job_id="j",
                        env_name="e",
                        case_id="c",
                        llm_model="qwen",
                        group_id="g",
                        sample_index=0,
                    )
                ]
            )
            await store.write_batch([], [GatewaySession(session_id="launched", route="qwen", job_id="j")])
        gws = [
            GatewaySession(
                session_id=f"vf-{i:03d}",
                route="qwen",
                total_steps=i % 3,
                max_steps=5,
                status="closed" if i % 2 else "active",
                created_at=T0 + timedelta(minutes=i),
                updated_at=T0 + timedelta(minutes=i),
            )
            for i in range(n)
        ]
        gws.append(
            GatewaySession(
                session_id=f"odd?#{EVIL}",
                route=f"r{EVIL}",
                total_steps=2,
                close_reason=EVIL,
                created_at=T0 - timedelta(days=1),
                updated_at=T0 - timedelta(days=1),
            )
        )
        steps = [
            _step("vf-001", 1, "first answer zebrafish"),
            _step("vf-001", 2, "second answer"),
            _step(f"odd?#{EVIL}", 1, f"odd answer zebrafish {EVIL}"),
        ]
        await store.write_batch(steps, gws)
    finally:
        await store.close()


@pytest.fixture
async def queries(tmp_path: Path) -> AsyncIterator[ViewerQueries]:
    db = tmp_path / "t.db"
    await _fill(db, PAGE_SIZE + 5, with_job=True)
    engine, q = await open_queries(f"sqlite://{db}")
    yield q
    await engine.dispose()


async def _client(db: Path, tmp_path: Path) -> tuple[httpx.AsyncClient, StepSearch, object]:
    engine, q = await open_queries(f"sqlite://{db}")
    search = StepSearch(engine)
    await search.ensure()
    await search.refresh()
    app = create_app(q, HiddenFields(tmp_path / "no-envs"), search=search)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://viewer"), search, engine


@pytest.fixture
async def viewer(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    db = tmp_path / "only.db"
    await _fill(db, 3, with_job=False)
    client, search, engine = await _client(db, tmp_path)
    async with client:
        yield client
    await search.close()
    await engine.dispose()  # type: ignore[attr-defined]


async def test_queries_list_only_sessions_without_a_launcher_row(queries: ViewerQueries) -> None:
    n = PAGE_SIZE + 5 + 1
    assert await queries.jobless_count() == n
    first = await queries.jobless_page(limit=PAGE_SIZE)
    assert first.total == n and len(first.rows) == PAGE_SIZE
    rest = await queries.jobless_page(offset=PAGE_SIZE, limit=PAGE_SIZE)
    ids = [r["session_id"] for r in first.rows + rest.rows]
    assert "launched" not in ids and len(ids) == len(set(ids)) == n
    assert ids[0] == f"vf-{PAGE_SIZE + 4:03d}" and ids[-1] == f"odd?#{EVIL}"  # newest first by default
    oldest = await queries.jobless_page(descending=False, limit=2)
    assert [r["session_id"] for r in oldest.rows] == [f"odd?#{EVIL}", "vf-000"]
    row = next(r for r in first.rows + rest.rows if r["session_id"] == "vf-001")
    assert (row["steps"], row["tokens"], row["route"], row["status"], row["max_steps"]) == (
        2,
        12,
        "qwen",
        "closed",
        5,
    )
    assert (
        next(r for r in rest.rows if r["session_id"] == "vf-000")["tokens"] is None
    )  # no step: unknown, not 0
    by_steps = await queries.jobless_page(sort="steps", limit=3)
    assert [r["total_steps"] for r in by_steps.rows] == [2, 2, 2]
    with pytest.raises(KeyError):
        await queries.jobless_page(sort="reward")


async def test_home_page_of_a_store_with_only_jobless_sessions_links_their_list(
    viewer: httpx.AsyncClient,
) -> None:
    home = await viewer.get("/")
    assert home.status_code == 200
    assert "holds no job yet" not in home.text
    assert 'href="/gateway-sessions">4 sessions without a job</a>' in home.text
    listing = await viewer.get("/gateway-sessions")
    assert listing.status_code == 200
    assert listing.text.index('data-session="vf-002"') < listing.text.index('data-session="vf-000"')
    assert 'href="/sessions/odd%3F%23%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E"' in listing.text
    assert EVIL not in listing.text and "&lt;img src=x onerror=alert(1)&gt;" in listing.text
    asc = await viewer.get("/gateway-sessions?sort=created&dir=asc")
    assert asc.text.index('data-session="vf-000"') < asc.text.index('data-session="vf-002"')
    assert (await viewer.get("/gateway-sessions?sort=reward")).status_code == 400
    assert (await viewer.get("/gateway-sessions?page=2")).status_code == 404
    assert (await viewer.get("/gateway-sessions?job=x")).status_code == 400


async def test_a_jobless_session_page_shows_steps_gateway_state_and_no_score(
    viewer: httpx.AsyncClient,
) -> None:
    r = await viewer.get("/sessions/vf-001")
    assert r.status_code == 200
    assert 'id="step-1"' in r.text and 'id="step-2"' in r.text and "first answer zebrafish" in r.text
    assert 'id="no-job"' in r.text and "no score" in r.text
    assert "no reward until <code>launcher.py grade</code> grades it as a new job" in r.text
    assert 'id="client-score"' not in r.text  # no client scored it
    assert 'id="gateway-state"' in r.text and "<th>max_steps</th><td>5</td>" in r.text
    odd = await viewer.get("/sessions/odd%3F%23%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E")
    assert odd.status_code == 200
    assert EVIL not in odd.text and "odd answer zebrafish &lt;img src=x onerror=alert(1)&gt;" in odd.text
    step = await viewer.get("/sessions/vf-001/steps/2")
    assert step.status_code == 200 and "second answer" in step.text
    missing = await viewer.get("/sessions/nope")
    assert missing.status_code == 404 and "no session &#39;nope&#39; in this store" in missing.text


async def test_search_links_open_jobless_sessions(viewer: httpx.AsyncClient) -> None:
    r = await viewer.get("/search", params={"q": "zebrafish"})
    assert r.status_code == 200
    assert 'href="/sessions/vf-001#step-1"' in r.text
    assert 'href="/sessions/odd%3F%23%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E#step-1"' in r.text
    assert EVIL not in r.text and "no job" in r.text
    assert (await viewer.get("/sessions/vf-001")).status_code == 200


async def test_search_on_a_store_holding_a_lone_surrogate(tmp_path: Path) -> None:
    """A step holding ``"\\ud800"`` (stored as its JSON escape): the search page answers 200, finds the
    other steps, and shows that one with U+FFFD."""
    db = tmp_path / "odd.db"
    await _fill(db, 3, with_job=False)
    store = Store(f"sqlite://{db}")
    await store.init()
    try:
        await store.write_batch([_step("vf-002", 1, "zebrafish \ud800 lone")], [])
    finally:
        await store.close()
    client, search, engine = await _client(db, tmp_path)
    async with client:
        r = await client.get("/search", params={"q": "zebrafish"})
        lone = await client.get("/search", params={"q": "lone"})
    await search.close()
    await engine.dispose()  # type: ignore[attr-defined]
    assert r.status_code == 200
    for sid in ("vf-001", "vf-002", "odd%3F%23%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E"):
        assert f'href="/sessions/{sid}#step-1"' in r.text, sid
    assert lone.status_code == 200 and "zebrafish \ufffd <mark>lone</mark>" in lone.text


async def test_a_client_score_is_shown_apart_from_the_graders_reward(tmp_path: Path) -> None:
    db = tmp_path / "scored.db"
    await _fill(db, 2, with_job=True)
    store = Store(f"sqlite://{db}")
    try:
        await store.set_client_score("vf-001", 7.5, f"inspect: includes {EVIL}")
        await store.set_client_score("launched", 2.0, None)
        await store.finish_job_session(
            "launched",
            SessionResult(
                status="succeeded", outcome="succeeded", attempts=1, reward=10.0, eval_status="scored"
            ),
        )
    finally:
        await store.close()
    client, search, engine = await _client(db, tmp_path)
    async with client:
        jobless = await client.get("/sessions/vf-001")
        launched = await client.get("/sessions/launched")
        unscored = await client.get("/sessions/vf-000")
    await search.close()
    await engine.dispose()  # type: ignore[attr-defined]
    assert jobless.status_code == launched.status_code == 200
    verdict, rest = (
        jobless.text.split('id="client-score">', 1)[0],
        jobless.text.split('id="client-score">', 1)[1],
    )
    assert "no score" in verdict and "7.5" not in verdict  # the grader's verdict stays empty
    assert rest.startswith("client score: 7.5 (inspect: includes &lt;img src=x onerror=alert(1)&gt;) ")
    assert "provenance client" in rest
    assert 'id="client-score">client score: 2 <span' in launched.text
    assert launched.text.index('id="verdict"') < launched.text.index('id="client-score"')
    assert 'id="client-score"' not in unscored.text
