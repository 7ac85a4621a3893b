"""The final workspace as data: a copy a grader or verifier may read without touching the host.

``copy_workspace(src, dest, caps)`` walks ``src`` with directory file descriptors (never a path:
no depth makes it fail) and never follows a link. It copies regular files and folders only, up to
``caps`` (total bytes, files, depth), drops set-id bits, and lists everything it left out (links,
FIFOs, sockets, devices, what is over a cap) in the returned ``WorkspaceCopy``. Nothing in the copy
can point anywhere: it holds no links at all. Stdlib only.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

MiB = 1024 * 1024
SKIPPED_LISTED = 200
"""At most this many left-out entries are named in ``WorkspaceCopy.skipped`` (all are counted)."""


@dataclass(frozen=True)
class CopyCaps:
    """Limits of one copy: total bytes of file content, number of entries (files and folders),
    folder depth below the root."""

    max_bytes: int = 256 * MiB
    max_entries: int = 20_000
    max_depth: int = 64


@dataclass
class WorkspaceCopy:
    """What ``copy_workspace`` copied (``files``, ``folders``, ``bytes``) and what it left out:
    ``skipped`` names up to ``SKIPPED_LISTED`` entries as ``"<relative path>: <why>"``,
    ``skipped_count`` counts them all; ``complete`` is False when a cap was hit (the copy is then
    a prefix of the walk) or the source could not be read."""

    files: int = 0
    folders: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    skipped_count: int = 0
    complete: bool = True
    stripped: list[str] | None = None  # the verifier's copy: what ``rollout.grading.hooks`` removed, and why

    def skip(self, rel: str, why: str, *, incomplete: bool = False) -> None:
        """Record one left-out entry."""
        self.skipped_count += 1
        if len(self.skipped) < SKIPPED_LISTED:
            self.skipped.append(f"{rel}: {why}")
        if incomplete:
            self.complete = False

    def manifest(self) -> dict[str, object]:
        """A JSON-ready summary (what a grader is told about its copy)."""
        out: dict[str, object] = {
            "files": self.files,
            "folders": self.folders,
            "bytes": self.bytes,
            "complete": self.complete,
            "skipped": list(self.skipped),
            "skipped_count": self.skipped_count,
        }
        if self.stripped is not None:
            out["stripped"] = self.stripped[:SKIPPED_LISTED]
            out["stripped_count"] = len(self.stripped)
        return out


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KIND = {
    stat.S_IFLNK: "link",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "device",
    stat.S_IFBLK: "device",
}


def _name(rel: str, name: str) -> str:
    return name if not rel else f"{rel}/{name}"


def _printable(rel: str, keep: int = 160) -> str:
    """``rel`` as valid UTF-8 text, its middle cut when longer than ``keep`` characters."""
    text = rel.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= keep else f"{text[: keep // 2]}...{text[-keep // 2 :]}"


def copy_workspace(src: Path, dest: Path, caps: CopyCaps | None = None) -> WorkspaceCopy:
    """Copy ``src`` into the empty folder ``dest`` (created if missing) as data; see the module
    docstring. Never raises for what is in ``src`` (an unreadable entry is skipped and listed);
    raises OSError only when ``src`` itself is not a readable folder or ``dest`` cannot be made."""
    caps = caps or CopyCaps()
    out = WorkspaceCopy()
    os.makedirs(dest, exist_ok=True)
    src_fd = os.open(src, _DIR_FLAGS)
    try:
        dest_fd = os.open(dest, _DIR_FLAGS)
    except OSError:
        os.close(src_fd)
        raise
    budget = [caps.max_entries, caps.max_bytes]
    try:
        # an explicit stack of (source dir fd, dest dir fd, relative path, depth): no recursion limit
        stack: list[tuple[int, int, str, int]] = [(src_fd, dest_fd, "", 0)]
        while stack:
            sfd, dfd, rel, depth = stack.pop()
            try:
                _copy_dir(sfd, dfd, rel, depth, caps, budget, out, stack)
            finally:
                os.close(sfd)
                os.close(dfd)
    finally:
        for sfd, dfd, _, _ in stack:  # only left when a folder could not be walked
            os.close(sfd)
            os.close(dfd)
    return out


def _copy_dir(
    sfd: int,
    dfd: int,
    rel: str,
    depth: int,
    caps: CopyCaps,
    budget: list[int],
    out: WorkspaceCopy,
    stack: list[tuple[int, int, str, int]],
) -> None:
    try:
        names = sorted(os.listdir(sfd))
    except OSError as e:
        out.skip(_printable(rel or "."), f"cannot be listed: {e.strerror}", incomplete=True)
        return
    for name in names:
        path = _name(rel, name)
        try:
            st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
        except OSError as e:
            out.skip(_printable(path), f"cannot be read: {e.strerror}", incomplete=True)
            continue
        kind = stat.S_IFMT(st.st_mode)
        if kind in _KIND:
            out.skip(_printable(path), _KIND[kind])
            continue
        if budget[0] <= 0:
            out.skip(_printable(path), f"over the {caps.max_entries} entries cap", incomplete=True)
            continue
        if kind == stat.S_IFDIR:
            if depth + 1 > caps.max_depth:
                out.skip(_printable(path), f"deeper than {caps.max_depth} folders", incomplete=True)
                continue
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=sfd)
            except OSError as e:
                out.skip(_printable(path), f"cannot be opened: {e.strerror}", incomplete=True)
                continue
            try:
                os.mkdir(name, 0o755, dir_fd=dfd)
                dchild = os.open(name, _DIR_FLAGS, dir_fd=dfd)
            except OSError:
                os.close(child)
                raise
            budget[0] -= 1
            out.folders += 1
            stack.append((child, dchild, path, depth + 1))
        elif kind == stat.S_IFREG:
            if st.st_size > budget[1]:
                out.skip(
                    _printable(path),
                    f"{st.st_size} bytes: over the {caps.max_bytes} bytes cap",
                    incomplete=True,
                )
                continue
            copied = _copy_file(sfd, dfd, name, st, budget[1])
            if isinstance(copied, str):
                out.skip(_printable(path), copied, incomplete=True)
                continue
            budget[0] -= 1
            budget[1] -= copied
            out.files += 1
            out.bytes += copied


def _copy_data(fd: int, out_fd: int, size: int, limit: int) -> int | str:
    """Copy ``fd``'s ``size`` bytes to ``out_fd``, its holes as holes (a sparse file costs what it
    holds, not its size); the size, or why not (over ``limit``)."""
    if size > limit:
        return "grew over the bytes cap while it was copied"
    pos = 0
    while pos < size:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
            break  # a hole to the end
        end = min(os.lseek(fd, data, os.SEEK_HOLE), size)
        os.lseek(fd, data, os.SEEK_SET)
        os.lseek(out_fd, data, os.SEEK_SET)
        while data < end:
            chunk = os.read(fd, min(1 * MiB, end - data))
            if not chunk:
                break  # shrank while it was copied
            os.write(out_fd, chunk)
            data += len(chunk)
        pos = max(end, pos + 1)
    os.ftruncate(out_fd, size)
    return size


def _copy_file(sfd: int, dfd: int, name: str, st: os.stat_result, limit: int) -> int | str:
    """Copy one regular file (permission bits kept, set-id bits dropped); its size, or why not."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=sfd)
    except OSError as e:
        return f"cannot be opened: {e.strerror}"
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return "changed while it was copied"
        out_fd = os.open(
            name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            stat.S_IMODE(st.st_mode) & 0o777 | 0o600,
            dir_fd=dfd,
        )
        try:
            return _copy_data(fd, out_fd, now.st_size, limit)
        finally:
            os.close(out_fd)
    except OSError as e:
        return f"cannot be copied: {e.strerror}"
    finally:
        os.close(fd)
