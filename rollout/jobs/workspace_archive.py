"""What a grader may read of a session's final workspace, kept with the session for a regrade.

After evaluation an attempt calls :func:`keep_workspace`: the env's ``workspace_archive``
config says which paths are kept (default: the whole workspace) and the caps. The kept files go
into a gzip'd tar in the ``session_workspaces`` row of the session. A workspace over a cap is not
kept at all (the row says why): a regrade never grades a partial workspace. Kept: regular files,
folders and relative links that stay inside the workspace; anything else is listed as skipped.
:func:`restore_workspace` extracts an archive into a folder and refuses any member that could
land outside it. Rules and per-env defaults: docs/regrade.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from rollout.core.envs import WorkspaceArchiveConfig
from rollout.errors import RolloutError
from store import JobEnvironment, SessionWorkspace, Store

log = logging.getLogger(__name__)

KeptStatus = Literal["kept", "too_large", "failed", "disabled"]


class ArchiveError(RolloutError, ValueError):
    """A stored archive cannot be restored (corrupt, digest mismatch, or a member that would land
    outside the target folder); the message says which."""


@dataclass
class KeptWorkspace:
    """The outcome of archiving one workspace: the columns of its ``session_workspaces`` row
    (see :class:`store.SessionWorkspace` for their meaning)."""

    status: KeptStatus
    reason: str | None = None
    paths: list[str] | None = None
    max_bytes: int = 0
    file_count: int = 0
    total_bytes: int = 0
    archive: bytes | None = None
    skipped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def columns(self) -> dict[str, Any]:
        """The row's columns (archive size and digest computed here)."""
        return {
            "status": self.status,
            "reason": self.reason,
            "paths": self.paths,
            "max_bytes": self.max_bytes,
            "file_count": self.file_count,
            "total_bytes": self.total_bytes,
            "archive_bytes": len(self.archive) if self.archive is not None else 0,
            "sha256": hashlib.sha256(self.archive).hexdigest() if self.archive is not None else None,
            "manifest": {"skipped": self.skipped, "missing": self.missing},
            "archive": self.archive,
        }


class _TooLarge(Exception):
    pass


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _raise(e: OSError) -> None:
    raise e


def _collect(
    root: Path, tops: list[str], cfg: WorkspaceArchiveConfig, kept: KeptWorkspace
) -> dict[str, tuple[str, os.stat_result]]:
    """arcname -> (absolute path, lstat) of every entry to keep, in walk order. Raises _TooLarge."""
    real_root = os.path.realpath(root)
    entries: dict[str, tuple[str, os.stat_result]] = {}

    def add(abs_path: str) -> bool:
        """Keep one entry; True when it is a folder to descend into."""
        arc = Path(os.path.relpath(abs_path, root)).as_posix()
        if arc in entries:
            return False
        st = os.lstat(abs_path)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(abs_path)
            if os.path.isabs(target) or not _inside(real_root, os.path.realpath(abs_path)):
                kept.skipped.append(f"{arc}: link to {target} leaves the workspace")
                return False
        elif stat.S_ISREG(st.st_mode):
            kept.total_bytes += st.st_size
            if kept.total_bytes > cfg.max_bytes:
                raise _TooLarge(
                    f"its files hold more than {cfg.max_bytes} bytes "
                    "(cap: workspace_archive.max_bytes in env.yaml)"
                )
        elif not stat.S_ISDIR(st.st_mode):
            kept.skipped.append(f"{arc}: not a regular file, folder or link")
            return False
        if len(entries) >= cfg.max_files:
            raise _TooLarge(
                f"it holds more than {cfg.max_files} entries (cap: workspace_archive.max_files in env.yaml)"
            )
        entries[arc] = (abs_path, st)
        kept.file_count += stat.S_ISREG(st.st_mode)
        return stat.S_ISDIR(st.st_mode)

    for top in tops:
        path = os.path.normpath(os.path.join(root, top))
        if not os.path.lexists(path):
            kept.missing.append(top)
            continue
        if path != str(root) and not _inside(real_root, os.path.realpath(os.path.dirname(path))):
            kept.skipped.append(f"{top}: reached through a link that leaves the workspace")
            continue
        if path != str(root) and not add(path):
            continue
        for dirpath, dirnames, filenames in os.walk(path, onerror=_raise, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                add(os.path.join(dirpath, name))
            for d in list(dirnames):
                if os.path.islink(os.path.join(dirpath, d)) or not add(os.path.join(dirpath, d)):
                    dirnames.remove(d)
    return entries


def build_archive(workspace: Path, cfg: WorkspaceArchiveConfig) -> KeptWorkspace:
    """Archive what ``cfg`` keeps of ``workspace`` (a gzip'd tar, arcnames relative to the
    workspace, owner names dropped). Never raises for the workspace's content: over a cap gives
    ``too_large``, an unreadable entry ``failed``, each with a reason; sizes are checked from
    ``lstat`` before any file is read."""
    kept = KeptWorkspace(status="kept", paths=cfg.paths, max_bytes=cfg.max_bytes)
    if not cfg.enabled:
        kept.status, kept.reason = "disabled", "workspace_archive.enabled is false in env.yaml"
        return kept
    root = Path(os.path.abspath(workspace))
    try:
        entries = _collect(root, cfg.paths if cfg.paths is not None else ["."], cfg, kept)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
            for arc, (abs_path, st) in entries.items():
                info = tar.gettarinfo(abs_path, arcname=arc)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if stat.S_ISREG(st.st_mode):  # never follow a link or block on a fifo swapped in meanwhile
                    fd = os.open(abs_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    with os.fdopen(fd, "rb") as f:
                        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                            raise OSError(f"{arc} changed while the workspace was archived")
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    except _TooLarge as e:
        return KeptWorkspace(
            status="too_large",
            reason=f"final workspace not kept: {e}",
            paths=cfg.paths,
            max_bytes=cfg.max_bytes,
            skipped=kept.skipped,
            missing=kept.missing,
        )
    except (OSError, RecursionError) as e:  # RecursionError: folders nested deeper than os.walk goes
        return KeptWorkspace(
            status="failed",
            reason=f"final workspace not kept: {type(e).__name__}: {e}",
            paths=cfg.paths,
            max_bytes=cfg.max_bytes,
            skipped=kept.skipped,
            missing=kept.missing,
        )
    kept.archive = buf.getvalue()
    return kept


async def keep_workspace(
    store: Store, row: JobEnvironment, cfg: WorkspaceArchiveConfig, workspace: Path
) -> None:
    """Archive ``workspace`` (in a thread) and store it as the session's ``session_workspaces`` row,
    replacing an earlier attempt's. A failure to store it is logged (WARNING) and does not fail
    the session: a regrade then reports the session as having no kept workspace."""
    try:
        kept = await asyncio.to_thread(build_archive, workspace, cfg)
    except Exception as e:  # a bug here must not cost the session its score: recorded as not kept
        log.exception("session %s: archiving its final workspace failed", row.session_id)
        kept = KeptWorkspace(
            status="failed",
            reason=f"final workspace not kept: {type(e).__name__}: {e}",
            paths=cfg.paths,
            max_bytes=cfg.max_bytes,
        )
    if kept.status != "kept":
        log.warning("session %s (env %s): %s", row.session_id, row.env_name, kept.reason)
    try:
        await store.save_workspace_archive(
            SessionWorkspace(
                session_id=row.session_id, job_id=row.job_id, env_name=row.env_name, **kept.columns()
            )
        )
    except Exception as e:  # the session's score is already computed: it must not be lost for this
        log.warning(
            "session %s: its final workspace could not be stored: %s: %s", row.session_id, type(e).__name__, e
        )


def _member_path(dest: Path, name: str) -> Path:
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or ".." in parts:
        raise ArchiveError(f"archive member {name!r} would land outside the workspace")
    return dest.joinpath(*parts)


def restore_workspace(archive: bytes, sha256: str | None, dest: Path) -> int:
    """Extract an archive made by :func:`build_archive` into the existing folder ``dest``; returns
    the number of regular files written. Folders and files first, links last (so nothing is ever
    written through a link); files get owner read/write. Raises ArchiveError for a digest that
    is not ``sha256``, a corrupt archive, or a member that is absolute, has ``..``, is a link
    leaving ``dest`` or is of another type (device, hard link, ...)."""
    if sha256 is not None and hashlib.sha256(archive).hexdigest() != sha256:
        raise ArchiveError("archive digest does not match the one stored with it")
    written = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            members = tar.getmembers()
            links = []
            for m in members:
                target = _member_path(dest, m.name)
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    target.chmod((m.mode & 0o777) | 0o700)
                elif m.isreg():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    src = tar.extractfile(m)
                    assert src is not None
                    with src, open(target, "wb") as out:
                        while chunk := src.read(1 << 20):
                            out.write(chunk)
                    target.chmod((m.mode & 0o777) | 0o600)
                    os.utime(target, (m.mtime, m.mtime))
                    written += 1
                elif m.issym():
                    link_dir = PurePosixPath(m.name).parent
                    if PurePosixPath(m.linkname).is_absolute() or not _inside(
                        str(dest), os.path.normpath(os.path.join(dest, str(link_dir), m.linkname))
                    ):
                        raise ArchiveError(f"archive member {m.name!r} links outside the workspace")
                    links.append((target, m.linkname))
                else:
                    raise ArchiveError(f"archive member {m.name!r} has an unsupported type")
            for target, linkname in links:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(linkname, target)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ArchiveError(f"archive cannot be extracted: {type(e).__name__}: {e}") from e
    return written
