"""Per-session control groups: a memory cap, a process cap and an equal CPU share for everything
a session runs.

``detect()`` finds, per controller, a cgroup hierarchy this process may create children in: a
cgroup2 tree whose ``cgroup.subtree_control`` enables the controller (or can be made to), else a
cgroup v1 hierarchy of that controller. Children are made under this process's own cgroup, so they
stay inside whatever limits the launcher itself runs under. ``SessionCgroup`` creates one session's
groups, sets the limits, says which limit was hit, kills what is left, and removes the groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shlex
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
PROC_SELF_MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class Controller:
    """Where one controller's session groups are made: ``parent`` (a directory of a cgroup file
    system) and ``version`` (1 or 2)."""

    name: str  # "memory", "pids" or "cpu"
    version: int
    parent: Path

    @functools.cached_property
    def has_memsw(self) -> bool:
        """v1 memory: whether swap is accounted (``memory.memsw.limit_in_bytes``), so capped too."""
        return (self.parent / "memory.memsw.limit_in_bytes").exists()

    @property
    def mechanism(self) -> str:
        """A human description, e.g. ``cgroup v1 memory.limit_in_bytes``."""
        if self.name == "cpu":
            return f"cgroup v{self.version} " + ("cpu.weight" if self.version == 2 else "cpu.shares")
        if self.name == "memory":
            return f"cgroup v{self.version} " + (
                "memory.max" if self.version == 2 else "memory.limit_in_bytes"
            )
        return f"cgroup v{self.version} pids.max"


def _mounts(mountinfo: str) -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of each cgroup mount in a mountinfo text."""
    found = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
            continue
        found.append((fields[4], rest[0], set(rest[2].split(","))))
    return found


def _own_paths(cgroup_text: str) -> dict[str, str]:
    """Controller (or "" for cgroup2) -> this process's cgroup path, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for ctl in parts[1].split(",") if parts[1] else [""]:
            paths[ctl] = parts[2]
    return paths


def _can_make_children(parent: Path) -> bool:
    probe = parent / f"rollout-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


def _v2_ready(parent: Path, name: str) -> bool:
    try:
        if name not in (parent / "cgroup.controllers").read_text().split():
            return False
        if name not in (parent / "cgroup.subtree_control").read_text().split():
            (parent / "cgroup.subtree_control").write_text(f"+{name}")
    except OSError:
        return False
    return _can_make_children(parent)


def detect(mountinfo: str | None = None, own_cgroups: str | None = None) -> dict[str, Controller]:
    """The usable controllers among ``memory``, ``pids`` and ``cpu`` (absent: not available here).
    The two texts default to this process's /proc/self/mountinfo and /proc/self/cgroup."""
    try:
        mountinfo = PROC_SELF_MOUNTINFO.read_text() if mountinfo is None else mountinfo
        own_cgroups = PROC_SELF_CGROUP.read_text() if own_cgroups is None else own_cgroups
    except OSError:
        return {}
    mounts, own = _mounts(mountinfo), _own_paths(own_cgroups)
    found: dict[str, Controller] = {}
    for name in ("memory", "pids", "cpu"):
        for point, fstype, _opts in mounts:
            if fstype == "cgroup2" and "" in own:
                parent = Path(point) / own[""].lstrip("/")
                if _v2_ready(parent, name):
                    found[name] = Controller(name, 2, parent)
                    break
        if name in found:
            continue
        for point, fstype, opts in mounts:
            if fstype == "cgroup" and name in opts and name in own:
                parent = Path(point) / own[name].lstrip("/")
                if _can_make_children(parent):
                    found[name] = Controller(name, 1, parent)
                    break
    return found


@dataclass
class SessionCgroup:
    """The cgroups of one session (one directory per controller used). ``procs_files`` are the
    ``cgroup.procs`` files a process writes its pid into to join before it starts the sandbox.
    With ``cpu``, the session's processes together weigh as one: every session group has the
    controller's default weight, so however many processes one runs, a session beside it gets
    its share."""

    memory: Controller | None
    pids: Controller | None
    memory_bytes: int | None
    max_processes: int | None
    cpu: Controller | None = None
    dirs: dict[str, Path] = field(default_factory=dict)
    _folders: dict[str, int] = field(default_factory=dict, init=False, repr=False)  # made folder -> version

    def create(self, name: str) -> None:
        """Make the groups named ``name`` and write the limits. Raises OSError (nothing left)."""
        try:
            if self.memory is not None and self.memory_bytes is not None:
                d = self._mkdir("memory", self.memory, name)
                if self.memory.version == 2:
                    _write(f"{d}/memory.max", str(self.memory_bytes))
                    with contextlib.suppress(OSError):
                        _write(f"{d}/memory.swap.max", "0")
                else:
                    _write(f"{d}/memory.limit_in_bytes", str(self.memory_bytes))
                    if self.memory.has_memsw:
                        _write(f"{d}/memory.memsw.limit_in_bytes", str(self.memory_bytes))
            if self.pids is not None and self.max_processes is not None:
                d = self._mkdir("pids", self.pids, name)
                _write(f"{d}/pids.max", str(self.max_processes))
            if self.cpu is not None:
                self._mkdir("cpu", self.cpu, name)  # the default weight, the same for every session
        except OSError:
            self.remove_now()  # nothing ran in them: they go at once
            raise

    def _mkdir(self, key: str, ctl: Controller, name: str) -> Path:
        if ctl.version == 2:  # one cgroup2 directory holds every controller
            for made in self.dirs.values():
                if made.parent == ctl.parent:
                    self.dirs[key] = made
                    return made
        d = ctl.parent / name
        os.mkdir(d)
        self.dirs[key] = d
        self._folders[str(d)] = ctl.version
        return d

    @property
    def procs_files(self) -> list[str]:
        return [f"{d}/cgroup.procs" for d in self._folders]

    def joined(self, argv: list[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into the session's groups (so
        everything it starts is capped from its first instruction); ``argv`` itself without groups."""
        if not self._folders:
            return argv
        join = " && ".join(f"echo $$ > {shlex.quote(f'{d}/cgroup.procs')}" for d in self._folders)
        return ["/bin/sh", "-c", f'{join} && exec "$@"', "sh", *argv]

    def exceeded(self) -> str | None:
        """``"memory"`` when the memory cap made the kernel kill a process, ``"processes"`` when a
        fork was refused at the process cap, else None."""
        if "memory" in self.dirs and self.memory is not None:
            d = self.dirs["memory"]
            events = d / ("memory.events" if self.memory.version == 2 else "memory.oom_control")
            if _counter(events, "oom_kill") > 0:
                return "memory"
        if (
            "pids" in self.dirs
            and self.pids is not None
            and _counter(self.dirs["pids"] / "pids.events", "max") > 0
        ):
            return "processes"
        return None

    def pids_inside(self) -> list[int]:
        """Pids in the session's groups (empty when there are none or none is left)."""
        pids: set[int] = set()
        for d in self._folders:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in _read(f"{d}/cgroup.procs").split())
        return sorted(pids)

    def kill_all(self) -> None:
        """SIGKILL every process still in the groups (v2: ``cgroup.kill`` when there is one)."""
        for d, version in self._folders.items():
            if version == 2:
                with contextlib.suppress(OSError):  # absent before Linux 5.14: never created here
                    _write(f"{d}/cgroup.kill", "1", create=False)
        for pid in self.pids_inside():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove_now(self) -> bool:
        """Kill what is left and remove the groups, never waiting: True when they are gone (the
        usual case once their processes ended), False when one is still busy (it stays for
        :meth:`remove`)."""
        killed = False
        for d in list(self._folders):
            while True:
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:  # a process is left (a group holds no files of ours)
                    if killed:
                        return False
                    self.kill_all()
                    killed = True
                    continue
                break
            del self._folders[d]
            for key in [k for k, v in self.dirs.items() if str(v) == d]:
                del self.dirs[key]
        return True

    def remove(self, timeout_s: float = 5.0) -> bool:
        """Kill what is left and remove the groups; False when one could not be removed in
        ``timeout_s`` seconds (it is left behind, empty groups are cheap)."""
        deadline = time.monotonic() + timeout_s
        while not self.remove_now():  # still busy: processes are being killed
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    async def aremove(self) -> None:
        """:meth:`remove` from the event loop: at once when the groups are empty (the usual case),
        else in a thread; it finishes even if the caller is cancelled meanwhile. Never raises but
        CancelledError: groups that cannot be waited for (no thread to spare) are left, logged."""
        if self.remove_now():
            return
        try:  # processes still dying: wait for them in a thread
            removed = await asyncio.shield(asyncio.to_thread(self.remove))
        except RuntimeError as e:  # "can't start new thread": the machine is out of processes
            log.warning("cgroups %s left behind: %s", sorted(self._folders), e)
            return
        if not removed:
            log.warning("cgroups %s left behind: still busy after 5 s", sorted(self._folders))


def _write(path: str, text: str, create: bool = True) -> None:
    """Write a cgroup file (as ``Path.write_text``; ``create`` False: only one that exists)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | (os.O_CREAT | os.O_TRUNC if create else 0), 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


def _counter(path: Path, key: str) -> int:
    """The value of ``key`` in a flat-keyed cgroup file (``key value`` lines), 0 when absent."""
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        return 0
    return 0
