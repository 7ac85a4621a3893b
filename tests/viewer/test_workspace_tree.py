"""The kept workspace as a file tree (rollout.servers.viewer.workspace_tree) and its two routes, on
hostile archives: a file named ``<script>``, links to /etc/passwd and inside the archive, ``..``
and absolute names, a 100 MB file, binary bytes, a corrupt archive. Nothing is extracted, no link
is followed, what is served cannot run."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from rollout.core.envs import WorkspaceArchiveConfig
from rollout.jobs.workspace_archive import build_archive
from rollout.servers.viewer.app import create_app
from rollout.servers.viewer.stats import HiddenFields
from rollout.servers.viewer.workspace_tree import (
    MAX_SHOWN_BYTES,
    WorkspaceError,
    clean_path,
    entries,
    read_file,
)

SCRIPT = "<script>alert(1)</script>"


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


class _Zeros(io.RawIOBase):
    """``n`` zero bytes, read lazily (a 100 MB member without 100 MB in memory)."""

    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        k = min(len(b), self.left)
        b[:k] = b"a" * k
        self.left -= k
        return k


@pytest.fixture(scope="module")
def hostile() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in [
            (_info(SCRIPT), SCRIPT.encode()),
            (_info("src", tarfile.DIRTYPE), None),
            (_info("src/main.py"), b"print('hi')\n"),
            (_info("passwd", tarfile.SYMTYPE, "/etc/passwd"), None),
            (_info("inner", tarfile.SYMTYPE, "src/main.py"), None),
            (_info("hard", tarfile.LNKTYPE, "src/main.py"), None),
            (_info("../escape"), b"out"),
            (_info("/abs"), b"abs"),
            (_info("bin.dat"), b"\x7fELF\x00\x01\x02" + bytes(range(256))),
            (_info("fifo", tarfile.FIFOTYPE), None),
        ]:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
        big = _info("big.log")
        big.size = 100 * 1024 * 1024
        tar.addfile(big, io.BufferedReader(_Zeros(big.size)))
    return buf.getvalue()


def test_paths_with_dotdot_absolute_or_nul_are_refused() -> None:
    for bad in ("", "/etc/passwd", "../x", "a/../../x", "a/..", "a\x00b", "."):
        with pytest.raises(WorkspaceError):
            clean_path(bad)
    assert clean_path("./a//b/") == "a/b" and clean_path("<script>") == "<script>"
    assert clean_path("a\\..\\b") == "a\\..\\b"  # a backslash is a name's character, not a separator


def test_entries_list_links_with_their_targets_and_flag_bad_names(hostile: bytes) -> None:
    listed, more = entries(hostile)
    by = {e.path: e for e in listed}
    assert more == 0
    assert by[SCRIPT].kind == "file" and by["src"].kind == "dir" and by["src/main.py"].size == 12
    assert (by["passwd"].kind, by["passwd"].target) == ("link", "/etc/passwd")
    assert (by["inner"].kind, by["inner"].target) == ("link", "src/main.py")
    assert by["hard"].kind == "other" and by["fifo"].kind == "other"
    assert by["../escape"].kind == "other" and by["/abs"].kind == "other"
    assert by["big.log"].size == 100 * 1024 * 1024


def test_read_file_never_follows_links_or_leaves_the_archive(hostile: bytes) -> None:
    assert read_file(hostile, "src/main.py").text == "print('hi')\n"
    assert read_file(hostile, "./src//main.py").text == "print('hi')\n"
    for path, message in (
        ("passwd", "a link to /etc/passwd"),
        ("inner", "a link to src/main.py"),
        ("hard", "a link to src/main.py"),
        ("src", "a folder"),
        ("fifo", "not a regular file"),
        ("nope", "not in the kept workspace"),
    ):
        with pytest.raises(WorkspaceError, match=message):
            read_file(hostile, path)
    for path in ("../escape", "/abs", "/etc/passwd", "src/../../etc/passwd"):
        with pytest.raises(WorkspaceError, match="is not a path in the workspace"):
            read_file(hostile, path)


def test_a_big_file_is_read_only_up_to_the_cap_and_binary_is_not_text(hostile: bytes) -> None:
    big = read_file(hostile, "big.log")
    assert big.truncated and len(big.head) == MAX_SHOWN_BYTES and big.size == 100 * 1024 * 1024
    assert big.text == "a" * MAX_SHOWN_BYTES
    binary = read_file(hostile, "bin.dat")
    assert binary.text is None and not binary.truncated


def test_a_corrupt_archive_is_an_error() -> None:
    with pytest.raises(WorkspaceError, match="cannot be read"):
        entries(b"not a tar")
    with pytest.raises(WorkspaceError, match="cannot be read"):
        read_file(b"\x1f\x8b" + b"\x00" * 40, "a")


def test_a_real_kept_workspace_lists_its_files(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "a.txt").write_text("hello")
    (ws / "out").symlink_to("/etc/passwd")
    kept = build_archive(ws, WorkspaceArchiveConfig())
    assert kept.archive is not None
    assert [(e.path, e.kind) for e in entries(kept.archive)[0]] == [("d", "dir"), ("d/a.txt", "file")]
    assert read_file(kept.archive, "d/a.txt").text == "hello"


class _Queries:
    """The two reads the workspace routes make, on one session whose archive is ``archive``."""

    def __init__(self, archive: bytes) -> None:
        self.archive = archive

    async def session(self, sid: str) -> dict[str, Any] | None:
        return {"env_id": sid, "job_id": "j"} if sid == "s1" else None

    async def workspace(self, sid: str) -> dict[str, Any] | None:
        return (
            {"status": "kept", "reason": None, "archive": self.archive, "file_count": 3, "total_bytes": 1}
            if sid == "s1"
            else None
        )


@pytest.fixture
def client(hostile: bytes, tmp_path: Path) -> TestClient:
    app = create_app(_Queries(hostile), HiddenFields(tmp_path))  # type: ignore[arg-type]
    return TestClient(app, raise_server_exceptions=False)


def test_the_tree_page_escapes_names_and_contents(client: TestClient) -> None:
    page = client.get("/sessions/s1/workspace")
    assert page.status_code == 200
    assert SCRIPT not in page.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert "→ /etc/passwd (link, not followed)" in page.text
    shown = client.get("/sessions/s1/workspace", params={"path": SCRIPT})
    assert (
        shown.status_code == 200
        and SCRIPT not in shown.text
        and shown.text.count("&lt;script&gt;alert(1)") == 3
    )  # tree, title, text
    assert (
        "A binary file: not shown." in client.get("/sessions/s1/workspace", params={"path": "bin.dat"}).text
    )
    big = client.get("/sessions/s1/workspace", params={"path": "big.log"})
    assert f"104857600 bytes, the first {MAX_SHOWN_BYTES} shown" in big.text
    for path in ("passwd", "../escape", "/etc/passwd"):
        bad = client.get("/sessions/s1/workspace", params={"path": path})
        assert bad.status_code == 404 and "root:" not in bad.text
    assert client.get("/sessions/s2/workspace").status_code == 404
    assert client.get("/sessions/s1/workspace", params={"file": "x"}).status_code == 400


def test_the_raw_file_is_plain_text_that_cannot_run(client: TestClient) -> None:
    raw = client.get("/sessions/s1/workspace/raw", params={"path": SCRIPT})
    assert raw.status_code == 200 and raw.text == SCRIPT
    assert raw.headers["content-type"] == "text/plain; charset=utf-8"
    assert raw.headers["x-content-type-options"] == "nosniff"
    assert raw.headers["content-security-policy"] == "default-src 'none'; sandbox"
    assert (
        len(client.get("/sessions/s1/workspace/raw", params={"path": "big.log"}).content) == MAX_SHOWN_BYTES
    )
    assert client.get("/sessions/s1/workspace/raw", params={"path": "passwd"}).status_code == 404
    assert client.get("/sessions/s1/workspace/raw", params={"path": "../escape"}).status_code == 404


def test_a_name_that_is_not_utf8_is_listed_escaped_and_served(tmp_path: Path) -> None:
    """An agent's file (and folder, and link) named with bytes that are not UTF-8: listed with each
    such byte as ``\\xNN``, opened and served by its exact bytes; nothing is hidden from the reviewer."""
    ws = tmp_path / "ws"
    odd_dir = ws / os.fsdecode(b"d\xfe")
    odd_dir.mkdir(parents=True)
    (odd_dir / os.fsdecode(b"bad\xff.txt")).write_text("hidden answer")
    (ws / "plain.txt").write_text("plain")
    (ws / os.fsdecode(b"ln\xfa")).symlink_to(os.fsdecode(b"d\xfe/bad\xff.txt"))
    kept = build_archive(ws, WorkspaceArchiveConfig())
    assert kept.archive is not None
    app = create_app(_Queries(kept.archive), HiddenFields(tmp_path))  # type: ignore[arg-type]
    client = TestClient(app, raise_server_exceptions=False)
    tree = client.get("/sessions/s1/workspace")
    assert tree.status_code == 200
    assert '<a href="?path=d%FE%2Fbad%FF.txt">bad\\xff.txt</a>' in tree.text
    assert (
        '<span class="dir">d\\xfe/</span>' in tree.text
        and "→ d\\xfe/bad\\xff.txt (link, not followed)" in tree.text
    )
    shown = client.get("/sessions/s1/workspace?path=d%FE%2Fbad%FF.txt")
    assert shown.status_code == 200
    assert (
        "<code>d\\xfe/bad\\xff.txt</code>" in shown.text
        and '<pre id="file-text">hidden answer</pre>' in shown.text
    )
    assert 'href="/sessions/s1/workspace/raw?path=d%FE%2Fbad%FF.txt"' in shown.text
    raw = client.get("/sessions/s1/workspace/raw?path=d%FE%2Fbad%FF.txt")
    assert (raw.status_code, raw.text) == (200, "hidden answer")
    link = client.get("/sessions/s1/workspace?path=ln%FA")
    assert (
        link.status_code == 404
        and "ln\\xfa is a link to d\\xfe/bad\\xff.txt: only regular files are shown" in link.text
    )
    # the escaped spelling names no entry (a file could be named so literally)
    assert client.get("/sessions/s1/workspace/raw", params={"path": "d\\xfe/bad\\xff.txt"}).status_code == 404
    listed = entries(kept.archive)[0]
    assert [(e.shown_path, e.kind, e.shown_target) for e in listed] == [
        ("d\\xfe", "dir", None),
        ("d\\xfe/bad\\xff.txt", "file", None),
        ("ln\\xfa", "link", "d\\xfe/bad\\xff.txt"),
        ("plain.txt", "file", None),
    ]
    assert listed[1].query == "path=d%FE%2Fbad%FF.txt"
