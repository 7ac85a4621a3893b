"""The trajectory store: URLs, JSON fidelity, concurrent writers, clean shutdown, checkpoints.

Tests taking ``store_url`` run once on SQLite and once on PostgreSQL (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from store import GatewaySession, JobEnvironment, SessionResult, SessionStep, Store, json_dumps, parse_db_url
from store.engine import DbUrlError, sqlite_path
from wire.text import column_text, display_text, json_text


def _step(sid: str, seq: int, model: str = "m") -> SessionStep:
    return SessionStep(
        session_id=sid,
        seq=seq,
        step_id=seq,
        llm_model=model,
        endpoint="chat.completions",
        response={"choices": [{"message": {"content": f"answer {seq}"}}]},
    )


def test_parse_db_url_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert (
        parse_db_url("sqlite://env_trajs.db")
        == f"sqlite+aiosqlite:///{(tmp_path / 'env_trajs.db').resolve()}"
    )
    abs_db = (tmp_path / "abs" / "x.db").resolve()
    abs_db.parent.mkdir()
    assert parse_db_url(f"sqlite://{abs_db}") == f"sqlite+aiosqlite:///{abs_db}"
    assert parse_db_url(f"sqlite:///{abs_db}") == f"sqlite+aiosqlite:///{abs_db}"
    assert parse_db_url("postgresql://u:p@h/db") == "postgresql+asyncpg://u:p@h/db"
    # a plain path is a SQLite file, relative to the working directory
    assert parse_db_url(str(abs_db)) == f"sqlite+aiosqlite:///{abs_db}"
    assert parse_db_url("abs/x.db") == f"sqlite+aiosqlite:///{abs_db}"
    # a SQLite file whose folder does not exist is refused, whichever way it is written
    for url in (str(tmp_path / "no" / "x.db"), f"sqlite://{tmp_path}/no/x.db", "no/x.db"):
        with pytest.raises(
            DbUrlError, match=f"the folder {tmp_path.resolve()}/no of the SQLite file does not exist"
        ):
            parse_db_url(url)
    with pytest.raises(DbUrlError, match="unsupported storage URL"):
        parse_db_url("mysql://h/db")
    with pytest.raises(DbUrlError, match="in-memory"):
        parse_db_url("sqlite://:memory:")


async def test_a_sqlite_path_that_is_a_folder_or_has_url_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder is refused up front; ``?``, ``%`` and ``#`` in a path name that very file, not a
    URL query or an escape."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    with pytest.raises(DbUrlError, match="adir is a folder, not a SQLite file"):
        parse_db_url("adir")
    for name in ("a?b.db", "a%20b.db", "c#d.db"):
        url = parse_db_url(name)
        assert sqlite_path(url) == tmp_path.resolve() / name and parse_db_url(url) == url
        store = Store(name)
        try:
            await store.init()
            await store.add_job_sessions(
                [
                    JobEnvironment(
                        session_id="s1", job_id="j", env_name="e", case_id="0", llm_model="m", group_id="g"
                    )
                ]
            )
        finally:
            await store.close()
        con = sqlite3.connect(tmp_path / name)
        try:
            assert con.execute("SELECT env_id FROM job_environments").fetchall() == [("s1",)]
        finally:
            con.close()
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["a%20b.db", "a?b.db", "c#d.db"]


def test_json_dumps_keeps_strict_json() -> None:
    # json.loads accepts NaN, but a JSON column must hold strict JSON (PostgreSQL rejects NaN).
    text = json_dumps({"a": float("nan"), "b": [float("inf"), 1.5], "c": "é"})
    assert json.loads(text) == {"a": "nan", "b": ["inf", 1.5], "c": "é"}
    assert "NaN" not in text


async def test_roundtrip_and_reward_writeback(store_url: str) -> None:
    store = Store(store_url)
    await store.init()
    try:
        await store.add_job_sessions(
            [
                JobEnvironment(
                    session_id="s1", job_id="j", env_name="e", case_id="0", llm_model="m", group_id="g"
                )
            ]
        )
        # inserting the same session again is a no-op (resume safety)
        assert (
            await store.add_job_sessions(
                [
                    JobEnvironment(
                        session_id="s1", job_id="j", env_name="e", case_id="0", llm_model="m", group_id="g"
                    )
                ]
            )
            == 0
        )
        await store.write_batch(
            [_step("s1", 1), _step("s1", 2)],
            [GatewaySession(session_id="s1", total_steps=2, step_counts={"m": 2})],
        )
        await store.write_batch([], [GatewaySession(session_id="s1", status="closed", total_steps=2)])
        await store.finish_job_session(
            "s1", SessionResult(reward=7.5, evaluation={"status": "scored"}, status="succeeded")
        )
        steps = await store.trajectory("s1")
        assert [s.seq for s in steps] == [1, 2]
        assert (steps[0].reward, steps[1].reward, steps[1].step_reward) == (None, 7.5, 7.5)
        assert steps[1].is_terminal and steps[1].meta_json == {"evaluation": {"status": "scored"}}
        gs = await store.load_gateway_session("s1")
        assert gs is not None and (gs.status, gs.total_steps) == ("closed", 2)
        (row,) = await store.job_sessions("j")
        assert (row.finished, row.reward, row.status) == (True, 7.5, "succeeded")
        assert await store.job_sessions("j", unfinished_only=True) == []
    finally:
        await store.close()


async def test_64_concurrent_sessions_two_engines_and_a_poller(store_url: str) -> None:
    """64 sessions x 20 steps written through two independent stores (two writer
    connections, as gateway and launcher have), while a reader polls and rewards are written:
    no "database is locked", every row present."""
    url = store_url
    a, b = Store(url), Store(url)
    await a.init()
    await b.init()
    stop = asyncio.Event()
    polls = 0

    async def poller() -> None:
        nonlocal polls
        while not stop.is_set():
            await a.trajectory("s0")
            polls += 1
            await asyncio.sleep(0.05)

    async def session(i: int) -> None:
        store = a if i % 2 else b
        sid = f"s{i}"
        await store.add_job_sessions(
            [
                JobEnvironment(
                    session_id=sid, job_id="j", env_name="e", case_id=str(i), llm_model="m", group_id="g"
                )
            ]
        )
        for k in range(1, 21):
            await store.write_batch([_step(sid, k)], [GatewaySession(session_id=sid, total_steps=k)])
        await store.finish_job_session(sid, SessionResult(reward=float(i % 11), status="succeeded"))

    try:
        poll_task = asyncio.create_task(poller())
        await asyncio.gather(*(session(i) for i in range(64)))
        stop.set()
        await poll_task
        rows = await a.job_sessions("j")
        assert len(rows) == 64 and all(r.finished for r in rows)
        assert sorted(r.reward for r in rows) == sorted(float(i % 11) for i in range(64))
        total = sum([len(await a.trajectory(f"s{i}")) for i in range(64)])
        assert total == 64 * 20
        assert polls > 0
    finally:
        await a.close()
        await b.close()


WRITER = textwrap.dedent("""
    import asyncio, sys
    from store import Store, SessionStep, GatewaySession
    async def main(url, sid):
        s = Store(url); await s.init()
        for k in range(1, 151):
            await s.write_batch([SessionStep(session_id=sid, seq=k, step_id=k, llm_model="m",
                                             endpoint="chat.completions")],
                                [GatewaySession(session_id=sid, total_steps=k)])
        await s.close()
    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


def test_two_processes_write_at_once(store_url: str) -> None:
    """Gateway and launcher are two processes on one store: both must succeed."""
    url = store_url
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, url, f"p{i}"], stderr=subprocess.PIPE)
        for i in range(3)
    ]
    errs = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errs

    async def count() -> int:
        s = Store(url)
        try:
            return sum([len(await s.trajectory(f"p{i}")) for i in range(3)])
        finally:
            await s.close()

    assert asyncio.run(count()) == 450


async def test_close_leaves_no_non_daemon_threads(store_url: str) -> None:
    """After close() no aiosqlite (or writer) thread keeps the interpreter alive."""
    before = {t.ident for t in threading.enumerate()}
    store = Store(store_url)
    await store.init()
    await store.write_batch([_step("x", 1)], [])
    await store.trajectory("x")
    await store.close()
    await asyncio.sleep(0.1)
    leftover = [t for t in threading.enumerate() if t.ident not in before and not t.daemon and t.is_alive()]
    assert leftover == []


async def test_checkpoint_folds_wal_into_main_file(tmp_path: Path) -> None:
    """After checkpoint() a copy of the .db file alone holds every row."""
    src = tmp_path / "w.db"
    store = Store(f"sqlite://{src}")
    await store.init()
    await store.write_batch([_step("x", k) for k in range(1, 6)], [])
    await store.checkpoint()
    copy = tmp_path / "copy.db"
    copy.write_bytes(src.read_bytes())
    other = Store(f"sqlite://{copy}")
    try:
        assert len(await other.trajectory("x")) == 5
    finally:
        await other.close()
        await store.close()


def test_postgresql_without_its_driver_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncpg is an optional extra: without it a postgresql:// URL fails at once, naming the
    missing driver and the extra (never an ImportError from deep inside SQLAlchemy)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "asyncpg" else real(name, *a)
    )
    with pytest.raises(DbUrlError, match=r"needs the asyncpg driver.*rollout-factory\[postgres\]"):
        Store("postgresql://user@db.example/trajs")


async def test_store_identity_hides_the_password_and_peer_url_keeps_it() -> None:
    store = Store("postgresql://u:secret@db.example:5433/trajs")
    try:
        assert (store.kind, store.identity()) == ("postgresql", "postgresql://db.example:5433/trajs")
        assert store.peer_url() == "postgresql://u:secret@db.example:5433/trajs"
    finally:
        await store.close()


async def test_an_unreachable_postgresql_is_unavailable_and_a_refused_row_is_not(store_url: str) -> None:
    """``is_unavailable`` tells a database that failed as a whole (here: nothing listens) from a
    row it refused (a duplicate key), on both backends."""
    from store import is_unavailable

    if store_url.startswith("postgres"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # closed again below: nothing listens there
        down = Store(f"postgresql://postgres@127.0.0.1:{port}/none")
        try:
            with pytest.raises(Exception) as ei:
                await down.ping()
            assert is_unavailable(ei.value), repr(ei.value)
        finally:
            await down.close()
    store = Store(store_url)
    await store.init()
    try:
        step = _step("s", 1)
        await store.write_batch([step], [])
        with pytest.raises(Exception) as ei:
            await store.write_batch(
                [
                    SessionStep(
                        record_id=step.record_id,
                        session_id="s",
                        seq=2,
                        step_id=2,
                        llm_model="m",
                        endpoint="e",
                    )
                ],
                [],
            )
        assert not is_unavailable(ei.value), repr(ei.value)
    finally:
        await store.close()


def test_text_rules_for_what_no_utf8_carries() -> None:
    """Lone surrogates and NUL: a text column's escape, JSON's escapes, U+FFFD for display."""
    assert column_text("a\ud800b\x00c\udfff") == "a\\ud800b\\u0000c\\udfff"
    assert column_text("é ok") == "é ok" and column_text(column_text("a\ud800")) == "a\\ud800"
    assert json_text({"x": "é\ud800"}) == '{"x": "\\u00e9\\ud800"}' and json_text({"x": "é"}) == '{"x": "é"}'
    assert json.loads(json_text(["\ud800\x00"])) == ["\ud800\x00"]
    assert display_text("a\ud800\udfffé") == "a\ufffd\ufffdé"
    assert json.loads(json_dumps({"x": "\udbff"})) == {"x": "\udbff"}


async def test_text_no_utf8_carries_is_stored_on_both_backends(store_url: str) -> None:
    """A lone surrogate or NUL in any text column (SQLite's driver cannot encode a surrogate,
    PostgreSQL refuses both) is stored as its escape, in every write path (ORM insert, UPDATE,
    the gateway's batch writer); in a JSON column it is kept exactly (as JSON escapes)."""
    lone = "x\ud800y\x00z"
    store = Store(store_url)
    await store.init()
    try:
        await store.add_job_sessions(
            [
                JobEnvironment(
                    session_id="s1",
                    job_id="j",
                    env_name="e",
                    case_id=lone,
                    llm_model="m",
                    group_id="g",
                    env_params={"q": lone},
                )
            ]
        )
        step = _step("s1", 1)
        step.finish_reason = "stop\udfff"
        step.messages = [{"role": "user", "content": lone}]
        step.response = {"choices": [{"message": {"content": lone}}]}
        await store.write_batch([step], [GatewaySession(session_id="s1", total_steps=1, close_reason=lone)])
        await store.update_job_session("s1", error_text=lone, result={"metrics": {"text": lone}})
        (row,) = await store.job_sessions("j")
        escaped = "x\\ud800y\\u0000z"
        assert row.error_text == escaped and row.result == {"metrics": {"text": lone}}
        await store.finish_job_session(
            "s1",
            SessionResult(
                reward=1.0,
                evaluation={"status": "scored", "artifacts": {"a": lone}},
                eval_reason=lone,
                status="succeeded",
                error=lone,
                runtime_result={"metrics": {"text": lone}},
            ),
        )
        (row,) = await store.job_sessions("j")
        assert (row.case_id, row.error_text, row.eval_reason) == (escaped, escaped, escaped)
        assert row.env_params == {"q": lone} and row.result == {"metrics": {"text": lone}}
        (st,) = await store.trajectory("s1")
        assert st.finish_reason == "stop\\udfff" and st.messages == [{"role": "user", "content": lone}]
        assert st.response == {"choices": [{"message": {"content": lone}}]}
        assert st.meta_json is not None and st.meta_json["evaluation"]["artifacts"] == {"a": lone}
        gs = await store.load_gateway_session("s1")
        assert gs is not None and gs.close_reason == escaped
    finally:
        await store.close()


def test_the_read_only_uri_of_a_sqlite_file(tmp_path: Path) -> None:
    """Read-only openings (``launcher.py view``, ``report``, ``export`` on a file this process cannot
    write): the path quoted into the URI, ``immutable`` unless a live WAL is beside it."""
    from store.engine import read_only_uri, sqlite_read_only

    db = tmp_path / "a b?#%.db"
    sqlite3.connect(db).close()
    quoted = str(tmp_path).replace(" ", "%20") + "/a%20b%3F%23%25.db"
    assert read_only_uri(db) == f"file:{quoted}?mode=ro&immutable=1"
    assert sqlite3.connect(read_only_uri(db), uri=True).execute("select 1").fetchone() == (1,)
    (tmp_path / "a b?#%.db-wal").touch()
    assert read_only_uri(db).endswith("?mode=ro&immutable=1")  # a WAL without its index: not live
    (tmp_path / "a b?#%.db-shm").touch()
    assert read_only_uri(db) == f"file:{quoted}?mode=ro"
    assert not sqlite_read_only(db) and not sqlite_read_only(tmp_path / "missing.db")
