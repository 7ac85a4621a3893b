"""A throwaway PostgreSQL server for the tests and benchmarks: ``initdb`` + ``pg_ctl start`` in a
temporary folder, on a free loopback port, its Unix socket in that folder too.

PostgreSQL refuses to run as root: as root the server runs as the ``postgres`` user (Debian's
package creates it). ``ROLLOUT_TEST_PG_URL`` (``postgresql://user@host:port``) uses a running
server instead. :func:`find_binaries` says why none can be had (the tests then skip, or fail
under ``CI=true``). Each server's folder names the process that started it (``owner.json``); a
start first stops and deletes the servers whose owner died without stopping them (a pytest killed
by SIGTERM runs no teardown, and ``pg_ctl`` daemonizes the server): :func:`sweep_stale`.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

PG_ROOTS = ("/usr/lib/postgresql",)
DIR_PREFIX = "rollout-pg-"
OWNER_FILE = "owner.json"
TEST_SETTINGS = (
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    "max_connections=300",
    "shared_buffers=32MB",
)
"""Server settings for tests: no fsync (a test never survives a power cut; speed matters)."""


class PgUnavailable(RuntimeError):
    """No PostgreSQL server can be started here; the message says why and what to install."""


def find_binaries() -> Path:
    """The folder holding ``initdb`` and ``pg_ctl`` (the newest ``/usr/lib/postgresql/N/bin``, else
    ``PATH``). Raises PgUnavailable."""
    for root in PG_ROOTS:
        versions = sorted(
            (p for p in Path(root).glob("*/bin") if (p / "pg_ctl").exists()),
            key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        )
        if versions:
            return versions[-1]
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    raise PgUnavailable("PostgreSQL is not installed (no pg_ctl): apt-get install postgresql")


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, ``/proc/PID/stat`` field 22),
    or None when there is no such process: with the pid it names a process, pid reuse aside."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie whose parent has not reaped it
    yet has exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def owner_alive(owner: dict[str, object]) -> bool:
    """Whether the process an ``owner.json`` names (``{"pid", "start"}``) still runs."""
    pid = owner.get("pid")
    return isinstance(pid, int) and running(pid) and _start_time(pid) == owner.get("start")


def _as_server_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise PgUnavailable(
            "running as root and there is no 'postgres' user to run the server as "
            "(apt-get install postgresql creates it)"
        ) from None
    return ["runuser", "-u", "postgres", "--"]


def _postmaster_pid(data: Path) -> int | None:
    """The pid in ``data/postmaster.pid`` when that process is alive, else None."""
    try:
        pid = int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    return pid if running(pid) else None


def sweep_stale(root: Path | None = None) -> list[Path]:
    """Stop the server of every ``rollout-pg-*`` folder in ``root`` (default: the temp folder)
    whose ``owner.json`` names a dead process, and delete the folder. Folders without an owner
    file (another tool's, or still being set up) are left alone. Returns the folders removed."""
    removed = []
    for folder in sorted(Path(root or tempfile.gettempdir()).glob(f"{DIR_PREFIX}*")):
        try:
            owner = json.loads((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(owner, dict) or owner_alive(owner):
            continue
        data = folder / "data"
        if _postmaster_pid(data) is not None:
            bin_dir = find_binaries()
            subprocess.run(
                _as_server_user()
                + [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if _postmaster_pid(data) is not None:
                continue  # it would not stop: leave the folder, the next start tries again
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One server: ``url`` (``postgresql://postgres@127.0.0.1:PORT``, trust auth, loopback only).
    ``start()``/``stop()``; ``create_database()`` gives a fresh database's URL. ``settings`` are
    extra ``-c`` server settings (default :data:`TEST_SETTINGS`); ``root`` the folder its own
    folder is made in (default: the temp folder; the server user must be able to enter it)."""

    def __init__(self, settings: tuple[str, ...] = TEST_SETTINGS, root: Path | None = None) -> None:
        self.settings = settings
        self.root = root
        self.bin: Path | None = None
        self.dir: Path | None = None
        self.port = 0
        self.url = ""
        self._external = os.environ.get("ROLLOUT_TEST_PG_URL", "").rstrip("/")

    def _run(self, argv: list[str], timeout: float = 120) -> None:
        res = subprocess.run(_as_server_user() + argv, capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise PgUnavailable(
                f"{Path(argv[0]).name} failed ({res.returncode}): {res.stderr.strip()[-800:]}"
            )

    def start(self) -> PgServer:
        """Start the server (or check the external one). Raises PgUnavailable."""
        if self._external:
            self.url = self._external
            self._psql("SELECT 1")
            return self
        self.bin = find_binaries()
        sweep_stale(self.root)
        self.dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=self.root))
        (self.dir / OWNER_FILE).write_text(
            json.dumps({"pid": os.getpid(), "start": _start_time(os.getpid())})
        )
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres") if _as_server_user() else None
            if user is not None:
                os.chown(self.dir, user.pw_uid, user.pw_gid)
        data = self.dir / "data"
        self._run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ]
        )
        self.port = _free_port()
        opts = [f"-p {self.port}", f"-k {self.dir}", "-c listen_addresses=127.0.0.1"]
        opts += [f"-c {s}" for s in self.settings]
        self._run(
            [
                str(self.bin / "pg_ctl"),
                "-D",
                str(data),
                "-w",
                "-t",
                "60",
                "-l",
                str(self.dir / "server.log"),
                "-o",
                " ".join(opts),
                "start",
            ]
        )
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}"
        return self

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its folder. Idempotent."""
        if self.dir is None or self.bin is None:
            return
        try:
            self._run([str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop"])
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _psql_bin(self) -> str:
        if self.bin is not None:
            return str(self.bin / "psql")
        return shutil.which("psql") or str(find_binaries() / "psql")

    def _psql(self, sql: str, db: str = "postgres") -> str:
        res = subprocess.run(
            [
                self._psql_bin(),
                "-X",
                "-q",
                "-t",
                "-A",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                f"{self.url}/{db}",
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if res.returncode != 0:
            raise PgUnavailable(f"psql failed: {res.stderr.strip()[-800:]}")
        return res.stdout

    def create_database(self, prefix: str = "t") -> str:
        """Create an empty database; returns its URL."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        self._psql(f'CREATE DATABASE "{name}"')
        return f"{self.url}/{name}"

    def drop_database(self, url: str) -> None:
        """Drop a database made by :meth:`create_database` (its connections are ended first)."""
        name = url.rsplit("/", 1)[1]
        self._psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def sql(self, url: str, query: str) -> str:
        """Run ``query`` with psql on the database at ``url``; its unaligned output."""
        return self._psql(query, db=url.rsplit("/", 1)[1])
