"""Deleting a folder the agent wrote, whatever it put there.

``shutil.rmtree`` recurses once per folder level, so a tree deeper than Python's recursion limit
(one ``mkdir d && cd d`` loop) makes it raise ``RecursionError``, even with ``ignore_errors``.
``remove_tree`` walks with one directory descriptor at a time (up through ``..``, checked), never
follows a link, gives a folder its owner's rights back before reading it (the agent may have
made it unreadable or read-only) and never raises for what it finds. Stdlib only.
"""

from __future__ import annotations

import os
import stat
from os import PathLike

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_ALL = 0o700


class _Walk:
    """The state of one removal: the errors met and the names skipped after one."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.skip: list[set[str]] = [set()]

    def failed(self, where: str, e: OSError) -> None:
        self.errors.append(f"{where}: {e.strerror or e}")
        self.skip[-1].add(where.rsplit("/", 1)[-1])


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _open_dir(name: str, dir_fd: int | None) -> int:
    """A descriptor of the folder ``name``, its mode first made ``u+rwx`` when it is not."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:  # mode 000 or alike: chmod the folder itself, never a link's target
        path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", _OWNER_ALL)
        finally:
            os.close(path_fd)
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        if os.fstat(fd).st_mode & _OWNER_ALL != _OWNER_ALL:
            os.fchmod(fd, _OWNER_ALL)
    except OSError:
        os.close(fd)
        raise
    return fd


def _next_folder(fd: int, walk: _Walk, where: str) -> str | None:
    """Unlink every entry of ``fd`` that is not a folder; the name of a folder left, else None."""
    with os.scandir(fd) as it:
        for e in it:
            if e.name in walk.skip[-1]:
                continue
            try:
                if e.is_dir(follow_symlinks=False):
                    return e.name
                os.unlink(e.name, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError as err:
                walk.failed(f"{where}/{e.name}", err)
    return None


def reopen(root: int, names: list[str], idents: list[tuple[int, int]]) -> int:
    """``root``/``names``... opened one name at a time and checked against ``idents``; -1 when a
    folder is gone or is another one now."""
    fd = os.dup(root)
    for name, want in zip(names, idents[1:], strict=True):
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            os.close(fd)
            return -1
        os.close(fd)
        fd = child
        if _ident(fd) != want:
            os.close(fd)
            return -1
    return fd


def _empty(root: int, top: str, walk: _Walk) -> None:
    """Remove everything under the folder ``root`` (its descriptor; ``top`` names it in errors)."""
    fd = os.dup(root)
    names: list[str] = []
    idents = [_ident(root)]
    try:
        while True:
            where = "/".join([top, *names])
            child = _next_folder(fd, walk, where)
            if child is not None:
                try:
                    sub = _open_dir(child, fd)
                except FileNotFoundError:
                    continue
                except OSError as e:
                    walk.failed(f"{where}/{child}", e)
                    continue
                os.close(fd)
                fd = sub
                names.append(child)
                idents.append(_ident(fd))
                walk.skip.append(set())
                continue
            if not names:
                return
            name = names.pop()
            idents.pop()
            walk.skip.pop()
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            if _ident(fd) != idents[-1]:  # moved meanwhile: reach the parent again from the top
                os.close(fd)
                fd = reopen(root, names, idents)
                if fd < 0:
                    fd = os.dup(root)
                    del names[:], idents[1:], walk.skip[1:]
                    continue
            try:
                os.rmdir(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as e:
                walk.failed(f"{'/'.join([top, *names])}/{name}", e)
    finally:
        os.close(fd)


def remove_tree(path: str | PathLike[str]) -> str | None:
    """Delete ``path`` (a folder and everything under it, or a single entry) however deep it goes
    and whatever modes it holds (module docstring); one already gone is fine. Never raises:
    returns None when all is gone, else what could not be removed and why."""
    walk = _Walk()
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(path)
            return None
        root = _open_dir(os.fspath(path), None)
        try:
            _empty(root, os.fspath(path), walk)
        finally:
            os.close(root)
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        walk.errors.append(f"{path}: {e.strerror or e}")
    if not walk.errors:
        return None
    more = f" (and {len(walk.errors) - 3} more)" if len(walk.errors) > 3 else ""
    return "; ".join(walk.errors[:3]) + more
