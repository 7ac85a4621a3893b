"""``--mode ray``: each attempt's runtime runs as one Ray task on a node of a Ray cluster.

The launcher keeps scheduling, evaluation, retries and the report. A task unpacks the session's
starting workspace (packed by the launcher) into a folder of its node, runs
``rollout.sandbox.runner.run_runtime`` there (the sandbox of ``--mode local``), and returns the outcome
with the final workspace packed; the launcher restores it into the session's workspace before
grading. Ray never retries a task itself: a node that dies is a ``node_lost`` outcome, which the
launcher's retry policy retries as a new attempt. Ray is imported only here (the ``ray`` extra).
How to set up a cluster: docs/scale-out.md.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.contract.protocol import SimulationStartRequest
from rollout.core.envs import EnvConfig, WorkspaceArchiveConfig
from rollout.core.trees import remove_tree
from rollout.errors import RolloutError
from rollout.jobs.workspace_archive import ArchiveError, build_archive, restore_workspace
from rollout.sandbox.bwrap import SandboxUnavailable
from rollout.sandbox.images import ImageRoot
from rollout.sandbox.runner import CODE_ROOT, RuntimeCommand, effective_mode, run_runtime, sandbox_support
from rollout.sandbox.runtime_local import RuntimeRun

log = logging.getLogger(__name__)

MiB = 1024 * 1024
RETURN_MAX_FILES = 1_000_000
"""Entries a final workspace may hold to be brought back (its bytes are capped by ``disk_mb``)."""
PROBE_TIMEOUT_S = 120.0
INSTALL_HINT = "install the ray extra: pip install -e '.[ray]'"


class RayBackendError(RolloutError, RuntimeError):
    """Ray is not installed, the cluster cannot be reached, or it cannot run this job (the message
    says what to fix)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise RayBackendError(f"--mode ray needs Ray, which is not installed ({e}): {INSTALL_HINT}") from e
    return ray


def _transfer_cfg(cfg: EnvConfig) -> WorkspaceArchiveConfig:
    """What is carried to and from a node: the whole workspace (regular files, folders, links that
    stay inside, as a grader may read it), up to the env's disk limit."""
    cap = (cfg.runtime.limits.disk_mb or 1 << 20) * MiB + MiB
    return WorkspaceArchiveConfig(paths=None, max_bytes=cap, max_files=RETURN_MAX_FILES)


def pack_workspace(workspace: Path, cfg: EnvConfig) -> bytes | None:
    """``workspace`` as a gzip'd tar (None when it is empty). Raises ArchiveError when it cannot
    be packed (unreadable, over the caps)."""
    if not any(workspace.iterdir()):
        return None
    kept = build_archive(workspace, _transfer_cfg(cfg))
    if kept.archive is None:
        raise ArchiveError(kept.reason or f"workspace {workspace} cannot be packed")
    return kept.archive


def unpack_workspace(archive: bytes | None, dest: Path) -> None:
    """Replace the content of ``dest`` (an existing folder) with ``archive``'s."""
    for entry in list(dest.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    if archive is not None:
        restore_workspace(archive, None, dest)


def run_on_node(
    cfg: EnvConfig,
    request: SimulationStartRequest,
    start: bytes | None,
    extra_env: dict[str, str],
    job_mode: str,
    command: RuntimeCommand | None = None,
    stderr_log: Path | None = None,
) -> tuple[RuntimeRun, bytes | None, str]:
    """The Ray task (runs on a node): (outcome, final workspace packed, node id). The node needs
    the env folder (and a harness session the harness's install cache) at the launcher's paths;
    without the env folder the outcome is ``setup_failed``. A harness log is written on the node."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    t0 = time.monotonic()
    if not cfg.env_dir.is_dir():
        return (
            RuntimeRun(
                status="error",
                setup_failed=True,
                duration_s=0.0,
                error_text=f"env folder {cfg.env_dir} does not exist on Ray node {node}",
            ),
            None,
            node,
        )
    workspace = Path(tempfile.mkdtemp(prefix=f"rollout-{request.session_id[:16]}-"))
    try:
        try:
            if start is not None:
                restore_workspace(start, None, workspace)
        except ArchiveError as e:
            return (
                RuntimeRun(
                    status="error",
                    setup_failed=True,
                    duration_s=time.monotonic() - t0,
                    error_text=f"the workspace cannot be prepared on Ray node {node}: {e}",
                ),
                None,
                node,
            )
        out = asyncio.run(
            run_runtime(cfg, request, workspace, extra_env, job_mode, command=command, stderr_log=stderr_log)
        )
        try:
            return out, pack_workspace(workspace, cfg), node
        except ArchiveError as e:
            why = f"the final workspace cannot be brought back from Ray node {node}: {e}"
            return out.model_copy(update={"status": "error", "result": None, "error_text": why}), None, node
    finally:  # however deep the agent's tree: a failure here would be the launcher's, not the agent's
        left = remove_tree(workspace)
        if left is not None:
            log.warning("workspace %s on Ray node %s was not removed: %s", workspace, node, left)


def probe_node(gateway_root_url: str, sandboxed: bool) -> tuple[str, str | None]:
    """A Ray task pinned to one node: (node id, None or what is wrong there): the gateway's
    ``/healthz`` does not answer from it, or (``sandboxed``) bubblewrap cannot run there."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    problems = []
    url = gateway_root_url.rstrip("/") + "/healthz"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            if r.status != 200:
                problems.append(f"the gateway at {url} answers HTTP {r.status}")
    except (urllib.error.URLError, OSError) as e:
        problems.append(f"the gateway at {url} cannot be reached: {e}")
    if sandboxed:
        try:
            sandbox_support()
        except SandboxUnavailable as e:
            problems.append(str(e))
    return node, "; ".join(problems) or None


def _resource_options(cfg: EnvConfig) -> dict[str, Any]:
    r = cfg.runtime.resources
    opts: dict[str, Any] = {"num_cpus": r.num_cpus}
    if r.memory_mb is not None:
        opts["memory"] = r.memory_mb * MiB
    return opts


@dataclass
class RayBackend:
    """A connection to a Ray cluster for one job (``connect``); ``close()`` disconnects."""

    address: str
    ray: Any

    def alive_nodes(self) -> list[dict[str, Any]]:
        return [n for n in self.ray.nodes() if n.get("Alive")]

    def check_resources(self, envs: list[EnvConfig]) -> None:
        """RayBackendError when an env asks for more CPUs or memory than any alive node has."""
        nodes = self.alive_nodes()
        for cfg in envs:
            want = _resource_options(cfg)
            if not any(
                all(n["Resources"].get(k.replace("num_cpus", "CPU"), 0) >= v for k, v in want.items())
                for n in nodes
            ):
                have = (
                    ", ".join(
                        f"{n['NodeID'][:8]}: {n['Resources'].get('CPU', 0):g} CPU, "
                        f"{n['Resources'].get('memory', 0) / MiB:.0f} MiB"
                        for n in nodes
                    )
                    or "no node"
                )
                raise RayBackendError(
                    f"env {cfg.name} asks each session for {cfg.runtime.resources.num_cpus:g} CPU(s)"
                    + (
                        f" and {cfg.runtime.resources.memory_mb} MiB"
                        if cfg.runtime.resources.memory_mb
                        else ""
                    )
                    + f" (runtime.resources in env.yaml), more than any node of the Ray cluster at {self.address} "
                    f"offers ({have})"
                )

    async def check_nodes(self, gateway_root_url: str, envs: list[EnvConfig], job_sandbox: str) -> None:
        """From a task on every alive node: the gateway answers there, and bubblewrap runs there
        when an env is sandboxed. RayBackendError listing each node's problem (or no answer)."""
        ray = self.ray
        sandboxed = any(effective_mode(cfg, job_sandbox) == "bwrap" for cfg in envs)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(num_cpus=0, max_retries=0)(probe_node)
        nodes = [n["NodeID"] for n in self.alive_nodes()]
        if not nodes:
            raise RayBackendError(f"the Ray cluster at {self.address} has no alive node")
        refs = {
            node: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                gateway_root_url, sandboxed
            )
            for node in nodes
        }
        problems = []
        for node, ref in refs.items():
            try:
                _, why = await asyncio.wait_for(asyncio.wrap_future(ref.future()), PROBE_TIMEOUT_S)
            except TimeoutError:
                ray.cancel(ref, force=True)
                why = f"no answer from a task there within {PROBE_TIMEOUT_S:g} s"
            except ray.exceptions.RayError as e:
                why = f"a task there failed: {str(e).strip().splitlines()[-1][:300]}"
            if why:
                problems.append(f"node {node[:12]}: {why}")
        if problems:
            raise RayBackendError(
                "the Ray cluster cannot run this job's sessions: "
                + "; ".join(problems)
                + ". Every node must reach the gateway (give its address as the nodes see it with "
                "--gateway-advertise-url) and hold this project and its Python at the launcher's paths"
            )

    def executor(self) -> RayExecutor:
        return RayExecutor(self.ray)

    def close(self) -> None:
        self.ray.shutdown()


def _check_reachable(address: str) -> None:
    """RayBackendError when nothing accepts a connection at ``HOST:PORT`` (``ray.init`` would wait
    for minutes); ``auto`` and ``ray://`` addresses are left to Ray."""
    host, sep, port = address.rpartition(":")
    if address == "auto" or "://" in address or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=10).close()
    except OSError as e:
        raise RayBackendError(
            f"cannot connect to the Ray cluster at {address!r}: {e} (is its head running? "
            "start one with `ray start --head`, then pass its HOST:PORT)"
        ) from e


def connect(address: str) -> RayBackend:
    """Connect this process to the Ray cluster at ``address`` (``HOST:PORT`` of its head, or
    ``auto``: the cluster started on this machine). The tasks' workers import the project from
    this launcher's folder (``PYTHONPATH``). Raises RayBackendError."""
    ray = _ray()
    _check_reachable(address)
    if ray.is_initialized():
        ray.shutdown()
    try:
        ray.init(
            address=address,
            runtime_env={"env_vars": {"PYTHONPATH": str(CODE_ROOT)}},
            logging_level=logging.WARNING,
            log_to_driver=False,
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RayBackendError(
            f"cannot connect to the Ray cluster at {address!r}: {e} "
            "(start one with `ray start --head`, then pass its address)"
        ) from e
    return RayBackend(address=address, ray=ray)


class RayExecutor:
    """The pool's executor (``rollout.jobs.attempt.Executor``) for ``--mode ray``: runs
    ``run_on_node`` as a task asking for the env's ``runtime.resources``; the workspace is packed
    before and restored after. Cancelling it cancels the task (the runtime's process group is
    killed on its node)."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self._task = ray.remote(max_retries=0)(run_on_node)

    async def __call__(
        self,
        cfg: EnvConfig,
        request: SimulationStartRequest,
        workspace: Path,
        extra_env: dict[str, str],
        job_mode: str = "bwrap",
        *,
        command: RuntimeCommand | None = None,
        stderr_log: Path | None = None,
        image: ImageRoot | None = None,
        changes: Path | None = None,
    ) -> RuntimeRun:
        ray, t0 = self.ray, time.monotonic()
        if image is not None:  # the unpacked image is on the launcher's machine only (docs/images.md)
            return RuntimeRun(
                status="error",
                setup_failed=True,
                duration_s=0.0,
                error_text="sandbox setup failed: a session in an image runs with --mode local only",
            )
        try:
            start = await asyncio.to_thread(pack_workspace, workspace, cfg)
        except ArchiveError as e:
            return RuntimeRun(
                status="error",
                setup_failed=True,
                duration_s=time.monotonic() - t0,
                error_text=f"the workspace cannot be sent to a Ray node: {e}",
            )
        ref = self._task.options(**_resource_options(cfg)).remote(
            cfg, request, start, extra_env, job_mode, command, stderr_log
        )
        try:
            out, final, node = await ref
        except asyncio.CancelledError:
            ray.cancel(ref)  # KeyboardInterrupt in the task: run_runtime kills the runtime's process group
            raise
        except ray.exceptions.RayTaskError:
            raise  # a bug of the task's own code: the attempt records it as a launcher error
        except ray.exceptions.RayError as e:  # the node or its worker died, the task's object was lost
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            return RuntimeRun(
                status="error",
                node_lost=True,
                duration_s=time.monotonic() - t0,
                error_text=f"the Ray node running the session was lost: {type(e).__name__}: {first}",
            )
        log.debug("session %s ran on Ray node %s", request.session_id, node)
        try:
            await asyncio.to_thread(unpack_workspace, final, workspace)
        except (ArchiveError, OSError) as e:
            return out.model_copy(
                update={
                    "status": "error",
                    "result": None,
                    "error_text": f"the final workspace cannot be restored here: {e}",
                }
            )
        return out
