"""A session's kept final workspace (``rollout.jobs.workspace_archive``) read as a file tree, never
extracted: the archive's entries listed, one regular file's first bytes read from it. Links are
shown with their target and never followed; a path is looked up as an exact entry name, so
``..``, absolute paths and links cannot reach anything outside the archive. A name that is not
UTF-8 is kept as tarfile reads it (``surrogateescape``): looked up by its exact bytes
(:func:`path_query`), shown with each undecodable byte as ``\\xNN`` (:func:`shown`). Pure data code:
no HTTP, no SQL.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import parse_qsl, urlencode

from rollout.errors import RolloutError
from wire.text import utf8_ok

MAX_ENTRIES = 20_000
"""Entries listed at most (the rest counted, not shown)."""
MAX_SHOWN_BYTES = 512 * 1024
"""Bytes of one file shown at most."""


def shown(name: str) -> str:
    """An entry name as UTF-8 text: each byte that is not UTF-8 (a ``surrogateescape`` surrogate)
    written ``\\xNN``."""
    if utf8_ok(name):
        return name
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def path_query(path: str) -> str:
    """``path=...`` naming the entry ``path`` by its exact bytes (``%FF`` for a byte that is not UTF-8)."""
    return urlencode({"path": path.encode("utf-8", "surrogateescape")})


def path_param(query_string: bytes) -> str | None:
    """The ``path`` of a raw query string as an entry name (bytes that are not UTF-8 kept as
    ``surrogateescape`` surrogates, as tarfile names them); None when absent or blank."""
    for name, value in parse_qsl(query_string.decode("latin-1"), encoding="utf-8", errors="surrogateescape"):
        if name == "path":
            return value.strip() or None
    return None


class WorkspaceError(RolloutError, ValueError):
    """The archive cannot be read, or a path names no regular file in it; the message says why."""


@dataclass(frozen=True)
class Entry:
    """One archive entry: its path, ``kind`` (file | dir | link | other), size in bytes and, for a
    link, its target (as stored: shown, never followed)."""

    path: str
    kind: str
    size: int
    target: str | None = None

    @property
    def depth(self) -> int:
        return self.path.count("/")

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def shown_path(self) -> str:
        return shown(self.path)

    @property
    def shown_name(self) -> str:
        return shown(self.name)

    @property
    def shown_target(self) -> str | None:
        return None if self.target is None else shown(self.target)

    @property
    def query(self) -> str:
        return path_query(self.path)


@dataclass(frozen=True)
class FileView:
    """The first :data:`MAX_SHOWN_BYTES` of a regular file: ``text`` (UTF-8, undecodable bytes
    replaced) or None for a binary file (a NUL byte in what was read), its ``size`` and whether
    it was cut (``truncated``)."""

    path: str
    size: int
    text: str | None
    truncated: bool
    head: bytes

    @property
    def shown_path(self) -> str:
        return shown(self.path)

    @property
    def query(self) -> str:
        return path_query(self.path)


def clean_path(raw: str) -> str:
    """``raw`` as an archive entry name (``a/b``), or WorkspaceError for an empty, absolute or
    ``..`` path, or one with a NUL."""
    if not raw or "\x00" in raw:
        raise WorkspaceError(f"{shown(raw[:200])!r} is not a path in the workspace")
    p = PurePosixPath(raw)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise WorkspaceError(f"{shown(raw[:200])!r} is not a path in the workspace")
    return "/".join(part for part in p.parts if part != ".")


def _kind(m: tarfile.TarInfo) -> str:
    if m.isreg():
        return "file"
    if m.isdir():
        return "dir"
    if m.issym():
        return "link"
    return "other"


def _name(m: tarfile.TarInfo) -> str | None:
    try:
        return clean_path(m.name)
    except WorkspaceError:
        return None


def _open(archive: bytes) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz")
    except (tarfile.TarError, EOFError, OSError) as e:
        raise WorkspaceError(f"the kept workspace cannot be read: {type(e).__name__}: {e}") from e


def entries(archive: bytes) -> tuple[list[Entry], int]:
    """The archive's entries sorted by path (at most :data:`MAX_ENTRIES`), and how many more there
    were. An entry whose name is absolute or has ``..`` is listed as ``other`` under its name as stored."""
    out: list[Entry] = []
    more = 0
    try:
        with _open(archive) as tar:
            for m in tar:
                if len(out) >= MAX_ENTRIES:
                    more += 1
                    continue
                name = _name(m)
                if name is None:
                    out.append(Entry(path=m.name, kind="other", size=0))
                    continue
                if not name:
                    continue  # the root itself
                out.append(
                    Entry(
                        path=name,
                        kind=_kind(m),
                        size=m.size if m.isreg() else 0,
                        target=m.linkname if m.issym() or m.islnk() else None,
                    )
                )
    except (tarfile.TarError, EOFError, OSError) as e:
        raise WorkspaceError(f"the kept workspace cannot be read: {type(e).__name__}: {e}") from e
    out.sort(key=lambda e: e.path.split("/"))
    return out, more


def read_file(archive: bytes, raw_path: str, limit: int = MAX_SHOWN_BYTES) -> FileView:
    """The first ``limit`` bytes of the regular file at ``raw_path`` in the archive. Raises
    WorkspaceError for a bad path, a path that is not in the archive, or an entry that is not a
    regular file (a link is never followed, even to a file inside the archive)."""
    path = clean_path(raw_path)
    try:
        with _open(archive) as tar:
            for m in tar:
                if _name(m) != path:
                    continue
                if not m.isreg():
                    what = (
                        f"a link to {shown(m.linkname)}"
                        if m.issym() or m.islnk()
                        else ("a folder" if m.isdir() else "not a regular file")
                    )
                    raise WorkspaceError(f"{shown(path)} is {what}: only regular files are shown")
                src = tar.extractfile(m)
                assert src is not None
                with src:
                    head = src.read(limit)
                binary = b"\x00" in head
                return FileView(
                    path=path,
                    size=m.size,
                    text=None if binary else head.decode("utf-8", "replace"),
                    truncated=m.size > len(head),
                    head=head,
                )
    except (tarfile.TarError, EOFError, OSError) as e:
        raise WorkspaceError(f"the kept workspace cannot be read: {type(e).__name__}: {e}") from e
    raise WorkspaceError(f"{shown(path)} is not in the kept workspace")
