"""rollout.servers.feed.client: the cursor file, errors, and iteration that survives a restart of the feed."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rollout.servers.feed.client import CursorFile, FeedClient, FeedError, FeedUnavailable
from store import Store
from tests.feed.helpers import ENV, REPO, finish, make_job


def test_cursor_file_roundtrip_and_bad_content(tmp_path: Path) -> None:
    cf = CursorFile(tmp_path / "sub" / "c")
    assert cf.load() == 0
    cf.save(7)
    cf.save(12)
    assert cf.load() == 12 and (tmp_path / "sub" / "c").read_text() == "12\n"
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["c"]  # no temporary file left
    (tmp_path / "sub" / "c").write_text("twelve")
    with pytest.raises(ValueError, match="does not hold a feed cursor"):
        cf.load()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_feed_is_an_error_after_the_grace_time() -> None:
    with socket.socket() as held:  # bound, never listening: no other process can serve the port meanwhile
        held.bind(("127.0.0.1", 0))
        with (
            FeedClient(f"http://127.0.0.1:{held.getsockname()[1]}", unavailable_s=0.5) as c,
            pytest.raises(FeedUnavailable, match="is unreachable"),
        ):
            c.progress("j")


def start_feed(db: Path, port: int) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "launcher.py"),
            "feed",
            "--db-path",
            f"sqlite://{db}",
            "--port",
            str(port),
            "--poll-interval-s",
            "0.05",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert p.stdout is not None and p.stdout.readline().startswith("feed on http://127.0.0.1:")
    return p


def stop_feed(p: subprocess.Popen[str]) -> None:
    p.kill()
    p.wait()
    if p.stdout is not None:
        p.stdout.close()


async def test_iteration_goes_on_across_a_restart_of_the_feed(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    store = Store(f"sqlite://{db}")
    await store.init()
    ids = await make_job(store, "j", {"a": 1, "b": 1, "c": 1})
    await finish(store, ids["a"][0], 1)
    await finish(store, ids["b"][0], 2)
    port = _free_port()
    feed = await asyncio.to_thread(start_feed, db, port)
    got_first, go_on = threading.Event(), threading.Event()
    seen: list[tuple[int | None, str]] = []
    cursor = CursorFile(tmp_path / "cursor")

    def consume() -> None:
        with FeedClient(f"http://127.0.0.1:{port}", unavailable_s=120) as c:
            for g in c.groups("j", cursor_file=cursor, wait_s=1, limit=1):
                seen.append((g.cursor, g.group_id))
                if len(seen) == 1:
                    got_first.set()
                    go_on.wait(120)

    reader = asyncio.create_task(asyncio.to_thread(consume))
    try:
        assert await asyncio.to_thread(got_first.wait, 120)
        await asyncio.to_thread(stop_feed, feed)
        go_on.set()  # the client's next request meets no feed: it retries
        await finish(store, ids["c"][0], 3)
        feed = await asyncio.to_thread(start_feed, db, port)
        await asyncio.wait_for(reader, 120)
    finally:
        go_on.set()
        stop_feed(feed)
        await store.close()
    assert seen == [(1, "a"), (2, "b"), (3, "c")]
    assert cursor.load() == 3


async def test_an_unknown_job_is_a_feed_error(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    store = Store(f"sqlite://{db}")
    await store.init()
    await store.close()
    port = _free_port()
    feed = await asyncio.to_thread(start_feed, db, port)
    try:
        with FeedClient(f"http://127.0.0.1:{port}") as c:
            with pytest.raises(FeedError) as ei:
                await asyncio.to_thread(c.progress, "nope")
            assert str(ei.value) == "GET /v1/jobs/nope: HTTP 404 unknown_job: no job 'nope' in this store"
            with pytest.raises(FeedError, match="HTTP 400 invalid_request: .*query parameter 'after'"):
                await asyncio.to_thread(c.page, "nope", -1)
            with pytest.raises(ValueError, match=r"^min_valid must be an integer >= 1 .*not 0$"):
                c.page("nope", min_valid=0)  # refused before any request
    finally:
        stop_feed(feed)
