"""The bubblewrap sandbox of a session: what it binds, its environment, and the machine check.

Paths are bound at their host paths (commands need no rewriting), read-only except the workspace
(``/workspace``, also cwd and HOME). The sandbox runs as uid/gid 65534 with no capabilities, in
new user/pid/ipc/uts/mount/network/cgroup namespaces; its only way out is the gateway bridge's
Unix socket. docs/sandbox.md lists what a runtime can and cannot see.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from rollout.core.envs import variable_problem
from rollout.errors import RolloutError
from rollout.sandbox import cgroups
from rollout.sandbox.cgroups import Controller, SessionCgroup

log = logging.getLogger(__name__)

WORKSPACE = "/workspace"
RESERVED = ("/workspace", "/proc", "/dev", "/run", "/tests", "/logs", "/etc", "/tmp")
"""Where a second view of the workspace (``Binds.also``) is never bound."""
BRIDGE_SOCKET = "/run/rollout/gateway.sock"
FORWARDER = "/run/rollout/forwarder.py"
INSTRUCTION = "/run/rollout/instruction.md"  # the case's instruction, read-only, when it has one
GATEWAY_PORT = 41800  # the gateway's loopback port inside every sandbox (each has its own network)
SANDBOX_UID = 65534
FORWARDER_SOURCE = Path(__file__).resolve().parents[1] / "contract" / "forwarder.py"
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; `make run` sets it up), "
    "or pass --sandbox none to run runtimes without isolation"
)

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# /etc entries a runtime may need; never shadow/gshadow, ssh, sudoers, ssl/private, package-manager
# or git configs (they can hold credentials).
ETC_ALLOW = (
    "passwd",
    "group",
    "hosts",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "protocols",
    "services",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "alternatives",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "mime.types",
    "magic",
    "magic.mime",
    "os-release",
    "debian_version",
    "bash.bashrc",
    "profile",
    "inputrc",
    "terminfo",
    "shells",
    "locale.alias",
    "locale.conf",
    "python3",
    f"python{sys.version_info.major}.{sys.version_info.minor}",
)
ENV_ALLOW = ("PATH", "LANG", "LANGUAGE", "TERM", "TZ", "ROLLOUT_LOG_LEVEL", "NO_COLOR", "COLUMNS")
ENV_ALLOW_PREFIX = ("LC_",)


class SandboxUnavailable(RolloutError, RuntimeError):
    """bubblewrap is missing or cannot create its namespaces here (the message says what to do)."""


@dataclass(frozen=True)
class Support:
    """What this machine offers: the bwrap executable and the cgroup controllers usable for the
    memory and process caps and the CPU share (absent ones are enforced another way or not at
    all, see ``mechanisms``)."""

    bwrap: str
    memory: Controller | None = None
    pids: Controller | None = None
    cpu: Controller | None = None

    def session_cgroup(self, memory_bytes: int | None, max_processes: int | None) -> SessionCgroup:
        """The cgroups of one sandbox (session, evaluation or verifier), not yet made."""
        return SessionCgroup(self.memory, self.pids, memory_bytes, max_processes, self.cpu)

    def mechanisms(self) -> dict[str, str]:
        """Limit name -> how it is enforced on this machine."""
        return {
            "memory": self.memory.mechanism
            if self.memory
            else "RLIMIT_AS of each process (no cgroup available)",
            "processes": self.pids.mechanism
            if self.pids
            else "NOT ENFORCED (no cgroup pids controller available)",
            "cpu": f"an equal share per session: {self.cpu.mechanism}"
            if self.cpu
            else "NOT SHARED (no cgroup cpu controller: a session's processes compete one by one)",
            "disk": "RLIMIT_FSIZE per file + workspace total checked every 0.25 s (longer walks less often); "
            "/tmp is a tmpfs of that size",
            "files": "workspace entries counted with its total",
            "output": "stdout + stderr bytes counted by the launcher",
        }


PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
"""Parts of ``/proc`` made read-only over the sandbox's own ``/proc``. The kernel lets a process
write them by file mode alone, without a capability, when its uid is the host's root (a launcher
run as root: the sandbox's uid maps to it): sysctls such as ``kernel.core_pattern``,
``sysrq-trigger``. bwrap covers them only where it finds the folder writable."""


@functools.cache
def proc_args() -> tuple[str, ...]:
    """bwrap's arguments for the sandbox's ``/proc``: its own, then :data:`PROC_READ_ONLY` bound
    read-only from the host (those that exist here; looked up once)."""
    out = ["--proc", "/proc"]
    for path in PROC_READ_ONLY:
        if os.path.exists(path):
            out += ["--ro-bind", path, path]
    return tuple(out)


def _probe_command(bwrap: str) -> list[str]:
    binds = Binds()
    binds.system()
    binds.interpreter()
    return [
        bwrap,
        *NAMESPACE_FLAGS,
        *binds.args,
        *proc_args(),
        "--dev",
        "/dev",
        "--",
        sys.executable,
        "-I",
        "-S",
        "-c",
        "import socket; print(len(socket.if_nameindex()))",
    ]


def probe(bwrap: str | None = None) -> Support:
    """Check that bubblewrap runs a sandbox here (a real one: namespaces, the interpreter) and find
    the cgroup controllers. Raises SandboxUnavailable with what to do."""
    path = bwrap or shutil.which("bwrap") or ("/usr/bin/bwrap" if os.path.exists("/usr/bin/bwrap") else None)
    if path is None:
        raise SandboxUnavailable(
            f"the runtime sandbox needs bubblewrap (bwrap), which is not installed: {INSTALL_HINT}"
        )
    try:
        p = subprocess.run(
            _probe_command(path), capture_output=True, text=True, timeout=60, env=clean_env({})
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxUnavailable(f"bubblewrap ({path}) cannot be run: {e}; {INSTALL_HINT}") from e
    if p.returncode != 0 or p.stdout.strip() != "1":
        why = (p.stderr.strip() or p.stdout.strip() or f"exit code {p.returncode}")[-300:]
        raise SandboxUnavailable(
            f"bubblewrap ({path}) cannot create a sandbox here ({why}); user namespaces may be disabled "
            f"(sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces > 0), or {INSTALL_HINT}"
        )
    found = cgroups.detect()
    return Support(bwrap=path, memory=found.get("memory"), pids=found.get("pids"), cpu=found.get("cpu"))


def namespace_flags(
    uid: int = SANDBOX_UID, gid: int = SANDBOX_UID, *, own_network: bool = True
) -> tuple[str, ...]:
    """bwrap's namespace flags, the sandbox running as ``uid``/``gid``; ``own_network`` False: the
    network namespace bwrap starts in is kept (one the launcher made, ``rollout.sandbox.netns``)."""
    return (
        "--unshare-all",
        *(() if own_network else ("--share-net",)),
        "--unshare-user",
        "--disable-userns",
        "--uid",
        str(uid),
        "--gid",
        str(gid),
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        # a session and process group of the sandbox's own: a kill(0, ...) inside reaches nothing outside
        "--new-session",
        "--hostname",
        "sandbox",
    )


NAMESPACE_FLAGS = namespace_flags()


def within(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or below it: ``Path.is_relative_to`` on two absolute paths written
    as ``str(Path)`` writes them, at a fraction of its cost (a session's command line checks
    hundreds of pairs)."""
    return path == folder or path.startswith(folder if folder.endswith("/") else folder + "/")


@dataclass
class Binds:
    """bwrap mount arguments, built up in order (later mounts cover earlier ones)."""

    args: list[str] = field(default_factory=list)
    covered: list[Path] = field(default_factory=list)
    _covered: list[str] = field(default_factory=list)  # ``covered`` as strings, for ``covers``

    def ro(self, src: Path | str, dest: Path | str | None = None) -> None:
        self.args += ["--ro-bind", str(src), str(dest or src)]
        self.cover(Path(dest or src))

    def cover(self, p: Path) -> None:
        self.covered.append(p)
        self._covered.append(str(p))

    def covers(self, p: Path) -> bool:
        """``p`` is a covered path or below one."""
        s = str(p)
        return any(within(s, c) for c in self._covered)

    def also(self, workspace: Path, dest: str) -> None:
        """``workspace`` bound at ``dest`` too (a host-toolchain task's WORKDIR, e.g. ``/app``),
        unless ``dest`` is ``/``, relative, reserved or overlaps a folder bound already (a warning
        says so: the workspace stays at its own path)."""
        p = Path(dest)
        clash = next(
            (
                str(c)
                for c in [*map(Path, RESERVED), *self.covered]
                if p.is_relative_to(c) or c.is_relative_to(p)
            ),
            None,
        )
        if not p.is_absolute() or p == Path("/") or clash is not None:
            log.warning(
                "the workspace is not bound at %s too: %s",
                dest,
                f"it overlaps {clash}" if clash else "not an absolute path below /",
            )
            return
        self.args += ["--bind", str(workspace), dest]

    def system(self) -> None:
        """The system's read-only folders (a usr-merged /bin etc. stays a symlink) and /etc's
        allow-listed entries (:func:`etc_view`); looked up once per process when nothing is bound
        yet (every sandbox's command line starts so)."""
        if self.covered:
            self._system()
            return
        args, covered = _system_binds()
        self.args += args
        for c in covered:
            self.cover(Path(c))

    def _system(self) -> None:
        for d in (*SYSTEM_DIRS, "/usr/local"):
            p = Path(d)
            if p.is_symlink():
                self.args += ["--symlink", os.readlink(p), d]
            elif p.is_dir() and not self.covers(p):
                self.ro(p)
        self.ro(etc_view(), "/etc")

    def interpreter(self) -> None:
        """The Python installation and the venv the launcher runs from."""
        for d in dict.fromkeys((sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix)):
            p = Path(d)
            if not self.covers(p):
                self.ro(p)

    def code(self, folder: Path, hidden: list[Path]) -> None:
        """``folder`` read-only, minus ``hidden`` paths: its entries are bound one by one (a
        symlink as its target), and an entry that is (or holds) a hidden path is left out whole;
        a folder with neither is bound as one (each bind costs bwrap ~0.1 ms of CPU)."""
        folder = folder.resolve()
        hide = [h.resolve() for h in hidden]
        top, hidden_s = str(folder), [str(h) for h in hide]
        if any(within(top, h) for h in hidden_s):
            return  # all of it is hidden (a dataset path of "."): nothing to bind
        if self.covers(folder):  # inside a system folder: cover the hidden paths
            for h in hide:
                if h.exists() and within(str(h), top):
                    self.args += ["--tmpfs", str(h)] if h.is_dir() else ["--ro-bind", "/dev/null", str(h)]
            return
        binds: list[tuple[Path, Path]] = []
        whole = True
        for entry in sorted(folder.iterdir()):
            e = entry.resolve() if entry.is_symlink() else entry
            names = (str(entry), str(e))
            whole = whole and e is entry
            if any(within(h, n) for h in hidden_s for n in names):
                whole = False
                continue
            binds.append((e, entry))
        if whole:
            self.ro(folder)
            return
        self.args += ["--dir", top]
        for e, entry in binds:
            self.ro(e, entry)
        self.cover(folder)


def _etc_entries() -> list[tuple[str, os.stat_result]]:
    """Every path of /etc's allow-listed entries (relative to /etc) with its ``lstat`` (a
    top-level entry's ``stat``: its bind follows a symlink), in a fixed order."""
    out = []
    for name in ETC_ALLOW:
        src = Path("/etc") / name
        try:
            out.append((name, src.stat()))
        except OSError:
            continue
        if src.is_dir():
            for folder, dirs, files in os.walk(src):
                dirs.sort()
                for entry in [*dirs, *sorted(files)]:
                    p = os.path.join(folder, entry)
                    with contextlib.suppress(OSError):
                        out.append((os.path.relpath(p, "/etc"), os.lstat(p)))
    return out


def _fingerprint(entries: list[tuple[str, os.stat_result]]) -> str:
    h = hashlib.sha256()
    for name, st in entries:
        h.update(f"{name}\0{st.st_mode}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:24]


def _copy_etc(dest: Path) -> None:
    """/etc's allow-listed entries into ``dest``, as their binds show them: a top-level symlink
    followed, links inside a folder kept; an entry this process cannot read is left out (the
    sandbox could not read it either)."""
    dest.chmod(0o755)
    for name in ETC_ALLOW:
        src, to = Path("/etc") / name, dest / name
        if not src.exists():
            continue
        to.parent.mkdir(parents=True, exist_ok=True)
        try:
            if src.is_dir():
                shutil.copytree(src, to, symlinks=True)
            else:
                shutil.copy2(src, to)
        except OSError as e:
            log.debug("/etc/%s is left out of the sandbox's /etc: %s", name, e)


@functools.cache
def etc_view() -> Path:
    """A folder holding a copy of /etc's allow-listed entries (:data:`ETC_ALLOW`), bound as the
    sandbox's ``/etc``: one bind where one per entry cost bwrap ~3 ms of CPU per sandbox (each
    read-only bind re-reads the mount table). Kept in the user's cache folder under a fingerprint
    of those entries (path, inode, size, mtime), so a changed /etc gets a new copy; looked up once
    per process. Where the cache folder cannot be written, a copy of this process's own (logged)."""
    entries = _etc_entries()
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rollout-factory" / "etc"
    view = base / _fingerprint(entries)
    if view.is_dir():
        return view
    try:
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".new-", dir=base))
    except OSError as e:
        log.info("the sandbox's /etc is copied for this process only (%s cannot be written: %s)", base, e)
        own = Path(tempfile.mkdtemp(prefix="rollout-etc-"))
        atexit.register(_remove_view, own, os.getpid())
        _copy_etc(own)
        return own
    _copy_etc(tmp)
    try:
        tmp.rename(view)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return view


def _remove_view(view: Path, owner: int) -> None:
    if os.getpid() == owner:  # not a forked child's exit
        shutil.rmtree(view, ignore_errors=True)


@functools.cache
def _system_binds() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``Binds.system`` on empty binds: (arguments, covered paths), the host's once per process."""
    b = Binds()
    b._system()
    return tuple(b.args), tuple(b._covered)


def clean_env(session: dict[str, str], source: dict[str, str] | None = None) -> dict[str, str]:
    """The sandbox's whole environment: the allow-listed variables of ``source`` (default: this
    process's environment; PATH with the interpreter's folder first), HOME/TMPDIR/PYTHONUNBUFFERED,
    then ``session`` (wins)."""
    src = os.environ if source is None else source
    env = {k: src[k] for k in src if k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIX)}
    # the launcher's interpreter first: `python3` in a tool call is the same Python as the runtime's
    env["PATH"] = os.pathsep.join(
        [os.path.dirname(sys.executable), env.get("PATH", "/usr/local/bin:/usr/bin:/bin")]
    )
    env.update({"HOME": WORKSPACE, "TMPDIR": "/tmp", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    env.update(session)
    return env


@dataclass(frozen=True)
class SandboxSpec:
    """One session's sandbox: the host workspace, the code folders (each with its hidden paths),
    single files to bind read-only, the bridge socket on the host (None: the launcher listens in
    the sandbox's network, made before it), the status pipe's fd, and the limits in bytes (None: none)."""

    workspace: Path
    code: list[tuple[Path, list[Path]]]
    files: list[Path]
    bridge_socket: Path | None
    status_fd: int
    tmp_bytes: int | None
    rlimits: dict[str, int] = field(default_factory=dict)  # "fsize" / "as" -> bytes, set by the forwarder
    instruction: Path | None = None  # a host file bound read-only at INSTRUCTION
    root: Path | None = None  # an image's merged copy-on-write tree, bound as / (rollout.sandbox.overlay)
    workdir: str = WORKSPACE  # where the workspace is bound (the cwd): an image's WORKDIR
    uid: tuple[int, int] = (SANDBOX_UID, SANDBOX_UID)  # the sandbox's uid and gid: an image's USER
    also_at: str | None = None  # the workspace bound there too (no image: a Harbor task's WORKDIR)
    tmp_in_root: bool = False  # /tmp is the root's own (an image's, in its kept layer), no tmpfs of its own
    env_fd: int | None = None  # bwrap reads its environment options from this fd (``env_args``)
    gate_fd: int | None = None  # bwrap first reads (empty) options from this fd: held until it has its limits
    mounts: list[tuple[Path, str]] = field(default_factory=list)  # host folders bound read-only there


HOST_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
"""The environment of the host's part of a sandbox's command (shells, ``nsenter``, ``unshare``,
bwrap itself): nothing of the session's, so no variable of an image or an env (``BASH_FUNC_*``,
``BASH_ENV``) reaches a host shell. The session's reaches bwrap through ``env_args``."""


class BadVariable(RolloutError, ValueError):
    """An environment variable no process can have: a name empty or holding ``=`` or NUL, a value
    holding NUL (in bwrap's NUL-separated ``--args`` it would add options of its own)."""


def env_args(env: dict[str, str]) -> int:
    """A memory file holding bwrap's ``--clearenv`` and one ``--setenv NAME VALUE`` per variable
    of ``env`` (NUL-separated, for ``--args FD``: never on a command line another user can read),
    its offset at 0; close-on-exec. Raises BadVariable (:func:`variable_problem`), OSError."""
    for k, v in env.items():
        why = variable_problem(k, v)
        if why is not None:
            raise BadVariable(f"the sandbox's environment: {why}")
    fd = os.memfd_create("rollout-env", os.MFD_CLOEXEC)
    try:
        parts = [b"--clearenv"]
        for k, v in env.items():
            parts += [b"--setenv", os.fsencode(k), os.fsencode(v)]
        data = b"\0".join(parts) + b"\0"
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def _code_binds(spec: SandboxSpec) -> Binds:
    b = Binds()
    if spec.root is not None:  # an image: its tree is / (the host's system folders are not bound)
        b.args += ["--bind", str(spec.root), "/"]
    # the private /tmp first: code folders under the host's /tmp are bound on top of it
    if not spec.tmp_in_root:
        b.args += (
            ["--size", str(spec.tmp_bytes), "--tmpfs", "/tmp"] if spec.tmp_bytes else ["--tmpfs", "/tmp"]
        )
    if spec.root is None:
        b.system()
    b.interpreter()
    for folder, hidden in spec.code:
        b.code(folder, hidden)
    for f in spec.files:
        if not b.covers(f):
            b.ro(f)
    return b


_SHARED: dict[tuple[object, ...], Binds] = {}


def file_state(path: Path) -> tuple[int, ...] | None:
    """A file's or folder's state as far as a bind plan depends on it: which file it is (device,
    inode) and when it or its entries last changed (mtime, ctime); None when it is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _shared_binds(spec: SandboxSpec) -> Binds:
    """The binds before the workspace (root, ``/tmp``, system, interpreter, code folders, files),
    the same for every session of an env: made once per process and per state of the code
    folders (``file_state``), a copy returned. An image's root is a session's own: never kept."""
    if spec.root is not None:
        return _code_binds(spec)
    key = (
        spec.tmp_in_root,
        spec.tmp_bytes,
        tuple((str(f), file_state(f), *map(str, hidden)) for f, hidden in spec.code),
        tuple(map(str, spec.files)),
    )
    made = _SHARED.get(key)
    if made is None:
        if len(_SHARED) >= 64:
            _SHARED.clear()
        made = _SHARED[key] = _code_binds(spec)
    return Binds(list(made.args), list(made.covered), list(made._covered))


def bwrap_command(support: Support, spec: SandboxSpec, command: list[str]) -> list[str]:
    """The bwrap command line that runs ``command`` in the sandbox: under the forwarder, or (no
    ``bridge_socket``) itself, in the network bwrap starts in, bwrap reporting on the status pipe
    (``--json-status-fd``: an ``exit-code`` only for a command it started)."""
    b = _shared_binds(spec)
    b.args += ["--bind", str(spec.workspace), spec.workdir]
    if spec.also_at is not None and spec.root is None:
        b.also(spec.workspace, spec.also_at)
    if spec.bridge_socket is not None:
        b.ro(spec.bridge_socket, BRIDGE_SOCKET)
        b.ro(FORWARDER_SOURCE, FORWARDER)
    if spec.instruction is not None:
        b.ro(spec.instruction, INSTRUCTION)
    for src, dest in spec.mounts:
        b.ro(src, dest)
    head = [
        support.bwrap,
        *(["--args", str(spec.gate_fd)] if spec.gate_fd is not None else []),
        *(["--args", str(spec.env_fd)] if spec.env_fd is not None else []),
        *namespace_flags(*spec.uid, own_network=spec.bridge_socket is not None),
        *b.args,
        *proc_args(),
        "--dev",
        "/dev",
        "--chdir",
        spec.workdir,
        *(["--json-status-fd", str(spec.status_fd)] if spec.bridge_socket is None else []),
        "--",
    ]
    if spec.bridge_socket is None:
        return [*head, *command]
    return [
        *head,
        sys.executable,
        "-I",
        "-S",
        FORWARDER,
        str(GATEWAY_PORT),
        BRIDGE_SOCKET,
        str(spec.status_fd),
        ",".join(f"{k}={v}" for k, v in spec.rlimits.items()) or "-",
        "--",
        *command,
    ]


def image_env(
    image_env: dict[str, str], session: dict[str, str], home: str, source: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of a sandbox in an image: the launcher's allow-listed variables but PATH,
    the image's ENV (its PATH), HOME, then ``session`` (wins)."""
    src = os.environ if source is None else source
    env = {k: v for k, v in src.items() if (k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIX)) and k != "PATH"}
    env.update(image_env)
    env.update({"HOME": home, "TMPDIR": "/tmp", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    env.update(session)
    return env


def inside_url(session_url: str) -> str:
    """The session URL as a runtime in the sandbox sees it: the same path on the loopback port."""
    return f"http://127.0.0.1:{GATEWAY_PORT}{urlsplit(session_url).path}"
