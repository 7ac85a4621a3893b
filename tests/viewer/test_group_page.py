"""A group of text-protocol sessions in the viewer (in process, a real SQLite store) and in
``report --bundle``: the group page shows the command output each sample got back as a user
message, the session page folds the raw rows, and the bundle has the group pages and each kept
workspace's file list. The 1400 px layout with 4 and 6 samples: tests/viewer/test_browser_reading.py."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from rollout.servers.viewer.app import create_app
from rollout.servers.viewer.bundle import write_bundle
from rollout.servers.viewer.db import open_queries
from rollout.servers.viewer.stats import HiddenFields
from tests.viewer.group_store import GROUP, JOB, command, fill, output, sid


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "notes").mkdir(parents=True)
    (ws / "notes" / "a.txt").write_text("one\ntwo\n")
    (ws / "answer.json").write_text('{"lines": 2}')
    return ws


@pytest.fixture
async def store(tmp_path: Path) -> Path:
    db = tmp_path / "g.db"
    await fill(db, 4, workspace(tmp_path))
    return db


@pytest.fixture
async def viewer(store: Path, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    engine, queries = await open_queries(f"sqlite://{store}")
    app = create_app(queries, HiddenFields(tmp_path / "no-envs"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://viewer") as c:
        yield c
    await engine.dispose()


def fed_back(page: str) -> list[str]:
    """The texts of the user messages a group page shows, in page order."""
    return [
        html.unescape(t)
        for t in re.findall(
            r'<details class="tool-result user-output">.*?<pre>(.*?)</pre></details>', page, re.S
        )
    ]


def samples_of(page: str) -> list[str]:
    return page.split('<div class="sample" ')[1:]


async def test_the_group_page_shows_what_a_text_protocol_agent_got_back(viewer: httpx.AsyncClient) -> None:
    r = await viewer.get(f"/groups/{GROUP}")
    assert r.status_code == 200
    parts = samples_of(r.text)
    assert len(parts) == 4
    for k, part in enumerate(parts):
        steps = part.split('<div class="gstep')[1:]
        assert len(steps) == 2
        assert fed_back(steps[0]) == [output(k)]  # after step 1's command: its output
        assert fed_back(steps[1]) == []  # nothing came back after the last answer
        assert html.escape(command(k), quote=False) in steps[0]
        assert f'href="/sessions/{sid(k)}?group={GROUP}"' in part
    assert 'class="samples" id="samples"' in r.text and "scroll-hint" not in r.text
    assert 'style="grid-template-columns' not in r.text


async def test_the_session_page_folds_the_raw_rows_after_the_trajectory(viewer: httpx.AsyncClient) -> None:
    page = (await viewer.get(f"/sessions/{sid(0)}")).text
    raw = page.index(
        '<details class="raw-rows" id="raw-rows"><summary>raw rows '
        '<small class="muted">session_workspaces (1)</small></summary>'
    )
    assert page.index('id="verdict"') < page.index("<h2>Trajectory</h2>") < raw
    assert page.index("<h2>session_workspaces</h2>") > raw
    assert page.count("<h2>session_workspaces</h2>") == 1
    assert 'id="raw-rows"' not in (await viewer.get(f"/sessions/{sid(1)}")).text  # no such row: no box


async def test_the_bundle_has_group_pages_and_the_kept_files(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    index = await write_bundle(f"sqlite://{store}", JOB, out, HiddenFields(tmp_path / "no-envs"))
    assert sorted(p.name for p in (out / "groups").iterdir()) == [f"{GROUP}.html"]
    group = (out / "groups" / f"{GROUP}.html").read_text()
    parts = samples_of(group)
    assert [re.findall(r'<a href="([^"]*)">', p)[0] for p in parts] == [
        f"../sessions/{sid(k)}.html" for k in range(4)
    ]
    assert [fed_back(p) for p in parts] == [[output(k)] for k in range(4)]
    assert "<script" not in group and "unsafe-inline" not in group
    assert all("://" not in u and not u.startswith("/") for u in re.findall(r'(?:href|src)="([^"]*)"', group))
    assert index.read_text().count(f'<a class="group" href="groups/{GROUP}.html">') == 4
    first = (out / "sessions" / f"{sid(0)}.html").read_text()
    assert f'<a id="group-link" href="../groups/{GROUP}.html">{GROUP}</a>' in first
    tree = first.split('<ul class="tree" id="tree">', 1)[1].split("</ul>", 1)[0]
    assert [
        (k, html.unescape(p))
        for k, p in re.findall(r'<li class="kind-(\w+) flat" data-path="([^"]*)">', tree)
    ] == [("file", "answer.json"), ("dir", "notes"), ("file", "notes/a.txt")]
    assert '<span class="file">notes/a.txt</span> <span class="muted">8 B</span>' in tree
    assert "one\ntwo" not in first  # names and sizes only
    second = (out / "sessions" / f"{sid(1)}.html").read_text()
    assert 'id="tree"' not in second and '<span class="muted">none kept</span>' in second
