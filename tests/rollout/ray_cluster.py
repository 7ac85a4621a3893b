"""A real Ray cluster on this machine for the ``--mode ray`` tests and benchmarks: a head node
(no CPUs by default, so sessions run on worker nodes only) and worker nodes, each started with
``ray start --block`` in its own process group, so that a node is killed (its raylet alone, or
the whole node at teardown) by the ids of the processes it started."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).with_name("ray")
OBJECT_STORE_BYTES = (
    80_000_000  # Ray's smallest object store: these nodes share 2 cores and the tests' memory
)


def ray_installed() -> None:
    """Skip when Ray is not installed (fail under ``CI=true``, which installs the ray extra)."""
    try:
        import ray  # noqa: F401
    except ImportError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the ray extra is required under CI: {e}")
        pytest.skip(f"Ray is not installed ({e}): pip install -e '.[ray]'")
    if not RAY.exists():
        pytest.fail(f"Ray is importable but its CLI {RAY} is missing")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    """One ``ray start --block`` process (the leader of its process group) and its raylet port."""

    proc: subprocess.Popen[bytes]
    node_manager_port: int
    log: Path

    def raylet_pid(self) -> int | None:
        """The pid of this node's raylet (a process of its group), None when it is gone."""
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if os.getpgid(int(pid)) == self.proc.pid and cmd[0].endswith(b"/raylet"):
                    return int(pid)
            except (OSError, IndexError):
                continue
        return None

    def kill_raylet(self) -> int:
        pid = self.raylet_pid()
        assert pid is not None, "the node's raylet is not running"
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)


@dataclass
class RayCluster:
    """``start()`` the head; ``add_worker()`` nodes; ``stop()`` kills every node's process group.
    The workers import this tree (``PYTHONPATH``), as the launcher's tasks ask anyway."""

    num_cpus_head: int = 0
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp")))
    port: int = 0
    nodes: list[Node] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _start(self, args: list[str], name: str) -> Node:
        nm_port = _free_port()
        log = self.temp_dir / f"{name}.log"
        env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
        with log.open("wb") as f:
            proc = subprocess.Popen(
                [
                    str(RAY),
                    "start",
                    *args,
                    "--node-manager-port",
                    str(nm_port),
                    "--object-store-memory",
                    str(OBJECT_STORE_BYTES),
                    "--disable-usage-stats",
                    "--block",
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=str(self.temp_dir),
            )
        node = Node(proc, nm_port, log)
        self.nodes.append(node)
        return node

    def start(self) -> RayCluster:
        self.port = _free_port()
        self._start(
            [
                "--head",
                "--port",
                str(self.port),
                "--num-cpus",
                str(self.num_cpus_head),
                "--include-dashboard=false",
                "--temp-dir",
                str(self.temp_dir),
            ],
            "head",
        )
        self.wait_nodes(1)
        return self

    def add_worker(self, num_cpus: int = 2) -> Node:
        n = sum(1 for nd in self.nodes if nd.proc.poll() is None and nd.raylet_pid() is not None)
        node = self._start(
            ["--address", self.address, "--num-cpus", str(num_cpus)], f"worker{len(self.nodes)}"
        )
        self.wait_nodes(n + 1)
        return node

    def wait_nodes(self, n: int, timeout_s: float = 180.0) -> None:
        """Wait until the cluster lists ``n`` alive nodes (asked by a separate Python process, so
        the test process never holds a Ray connection of its own)."""
        script = (
            "import ray, sys, time\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False)\n"
            f"t = time.monotonic() + {timeout_s}\n"
            f"while sum(1 for x in ray.nodes() if x['Alive']) < {n}:\n"
            "    if time.monotonic() > t: sys.exit(1)\n"
            "    time.sleep(0.5)\n"
        )
        deadline = time.monotonic() + timeout_s
        while True:
            p = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=timeout_s + 60)
            if p.returncode == 0:
                return
            if time.monotonic() > deadline:
                logs = "\n".join(nd.log.read_text(errors="replace")[-2000:] for nd in self.nodes)
                raise AssertionError(
                    f"the Ray cluster did not reach {n} alive nodes: {p.stderr[-2000:]!r}\n{logs}"
                )
            time.sleep(1)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
