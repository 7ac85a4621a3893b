"""``launcher.py grade``: sessions a client named on the gateway (one base URL, ``X-Session-ID``)
attached to the gsm8k env and graded by its evaluator as a new job, their case taken from the first
request's ``metadata`` or given for all; refusals (a session of a job, an open one, no selection)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from rollout.cli.grade import main as grade_main
from rollout.core.setup import SetupError
from rollout.jobs.grade_sessions import GradeOptions, grade_sessions
from store import Store
from tests.fake_upstream import FakeUpstream, Reply, chat_completion
from tests.gateway.conftest import Gateway, make_settings, serve

ENV_ROOT = Path(__file__).resolve().parents[2] / "env"


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[tuple[Gateway, FakeUpstream]]:
    async with FakeUpstream() as up:
        g = await serve(make_settings(up, f"sqlite://{tmp_path}/gw.db"))
        try:
            yield g, up
        finally:
            await g.stop()


async def _sample(g: Gateway, sid: str, metadata: dict[str, str] | None, close: bool = True) -> None:
    """One sample of a client configured once: base URL /v1, the session in X-Session-ID."""
    client = AsyncOpenAI(base_url=f"{g.url}/v1", api_key="unused", default_headers={"X-Session-ID": sid})
    extra: dict[str, Any] = {"metadata": metadata} if metadata is not None else {}
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], **extra)
    await client.close()
    if close:
        assert (await g.http().post(f"/v1/sessions/{sid}/close")).status_code == 200


def _opts(g: Gateway, **kw: Any) -> GradeOptions:
    return GradeOptions(
        env_name="gsm8k",
        db_path=g.settings.storage_config.db_url,
        agent_root=ENV_ROOT,
        grader_isolation="none",
        out=Path(g.settings.storage_config.db_url[9:]).parent / "o.jsonl",
        **kw,
    )


async def test_sessions_without_a_job_are_graded_as_a_new_job(gw: tuple[Gateway, FakeUpstream]) -> None:
    g, up = gw
    up.script(
        "/v1/chat/completions",
        [
            Reply.json(chat_completion("so #### 33")),
            Reply.json(chat_completion("#### 7")),
            Reply.json(chat_completion("#### 1")),
        ],
    )
    await _sample(g, "right", {"case_id": "0", "run": "r1"})
    await _sample(g, "wrong", {"case_id": "1", "run": "r1"})
    await _sample(g, "other", {"case_id": "1", "run": "r2"})
    result = await grade_sessions(_opts(g, tag=("run", "r1"), case_field="case_id", job_id="inspect-1"))
    got = sorted(
        (r.session_id, r.case_id, r.sample_index, r.status, r.eval_status, r.score) for r in result.records
    )
    assert got == [
        ("right", "0", 0, "succeeded", "scored", 10.0),
        ("wrong", "1", 1, "succeeded", "scored", 0.0),
    ]
    store = Store(g.settings.storage_config.db_url)
    try:
        rows = {r.session_id: r for r in await store.job_sessions("inspect-1")}
        assert {s: (r.env_name, r.finished, r.reward) for s, r in rows.items()} == {
            "right": ("gsm8k", True, 10.0),
            "wrong": ("gsm8k", True, 0.0),
        }
        steps = await store.trajectory("right")
        assert [(s.job_id, s.env_name, s.group_id, s.reward) for s in steps] == [
            ("inspect-1", "gsm8k", rows["right"].group_id, 10.0)
        ]
    finally:
        await store.close()
    with pytest.raises(SetupError, match="session 'right' is already in job 'inspect-1'"):
        await grade_sessions(_opts(g, session_ids=["right"], case_id="0"))


async def test_grade_refuses_open_sessions_unless_asked(gw: tuple[Gateway, FakeUpstream]) -> None:
    g, up = gw
    up.script("/v1/chat/completions", [Reply.json(chat_completion("#### 33"))])
    await _sample(g, "open", None, close=False)
    with pytest.raises(SetupError, match="session 'open' is still active"):
        await grade_sessions(_opts(g, session_ids=["open"], case_id="0"))
    result = await grade_sessions(_opts(g, session_ids=["open"], case_id="0", include_active=True))
    assert [(r.session_id, r.case_id, r.score) for r in result.records] == [("open", "0", 10.0)]


async def test_grade_command_line_refusals(
    gw: tuple[Gateway, FakeUpstream], capsys: pytest.CaptureFixture[str]
) -> None:
    g, _ = gw
    await _sample(g, "s", None)
    db = g.settings.storage_config.db_url
    common = ["--env", "gsm8k", "--agent-root", str(ENV_ROOT), "--db-path", db]
    assert await asyncio.to_thread(grade_main, [*common, "--case", "0"]) == 1
    assert "select the sessions: --session ID, --tag KEY=VALUE or --since/--until" in capsys.readouterr().err
    assert await asyncio.to_thread(grade_main, [*common, "--session", "s", "--case-field", "case_id"]) == 1
    assert (
        "session 's': its first request's metadata has no 'case_id' naming a case" in capsys.readouterr().err
    )
    assert await asyncio.to_thread(grade_main, [*common, "--session", "s", "--case", "no-such"]) == 1
    assert "env gsm8k has no case 'no-such'" in capsys.readouterr().err
    assert await asyncio.to_thread(grade_main, [*common, "--session", "nope", "--case", "0"]) == 1
    assert "no session 'nope'" in capsys.readouterr().err


async def test_the_time_window_selects_by_first_call(gw: tuple[Gateway, FakeUpstream]) -> None:
    g, up = gw
    up.script(
        "/v1/chat/completions",
        [Reply.json(chat_completion("#### 33")), Reply.json(chat_completion("#### 33"))],
    )
    await _sample(g, "early", None)
    await _sample(g, "late", None)
    with sqlite3.connect(
        g.settings.storage_config.db_url[len("sqlite://") :]
    ) as db:  # first calls a day apart
        db.execute(
            "UPDATE gateway_sessions SET created_at = ? WHERE session_id = 'early'", ("2026-01-01 10:00:00",)
        )
        db.execute(
            "UPDATE gateway_sessions SET created_at = ? WHERE session_id = 'late'", ("2026-01-02 10:00:00",)
        )
    noon = datetime(2026, 1, 1, 12, tzinfo=UTC)
    late = await grade_sessions(_opts(g, since=noon, case_id="0", job_id="after-noon"))
    assert [(r.session_id, r.score) for r in late.records] == [("late", 10.0)]
    early = await grade_sessions(_opts(g, until=noon, case_id="0", job_id="before-noon"))
    assert [(r.session_id, r.score) for r in early.records] == [("early", 10.0)]
