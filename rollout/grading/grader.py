"""The grader of a job: where each evaluation runs and on what (docs/grading.md).

A ``Grader`` is opened once per job (or regrade). It snapshots the env roots that hold evaluators
(an evaluator edited or overwritten during the job is never reloaded), and for each session
copies the final workspace as data (``rollout.grading.workspace_copy``: no links, capped), then
runs the evaluator on that copy: in the grader sandbox (``bwrap``, the default) or in a thread of
the launcher (``none``, for trusted graders; flagged in every record). The copy is deleted
afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from rollout.contract.protocol import EvalRequest, EvalSpec, Trajectory
from rollout.core.envs import EnvConfig
from rollout.core.trees import remove_tree
from rollout.errors import RolloutError
from rollout.grading.evaluation import Evaluation, run_evaluation
from rollout.grading.sandbox import ForkServer, GraderLimits, evaluate_in_sandbox
from rollout.grading.scoring import SCORE_KEYS
from rollout.grading.workspace_copy import CopyCaps, copy_workspace

log = logging.getLogger(__name__)

Isolation = Literal["bwrap", "none"]
_SKIP_NAMES = ("__pycache__", ".git")
_SKIP = shutil.ignore_patterns(*_SKIP_NAMES, "*.pyc")
SNAPSHOT_MAX_BYTES = 1024 * 1024 * 1024
SNAPSHOT_MAX_FILES = 100_000


class GraderSetupError(RolloutError, RuntimeError):
    """An env root cannot be snapshot (too large, unreadable); the message says which and why."""


def _check_root(root: Path) -> None:
    """Raise GraderSetupError when ``root`` is over the snapshot caps (it is copied whole)."""
    size = files = 0
    for folder, dirs, names in os.walk(root, onerror=None):
        dirs[:] = [d for d in dirs if d not in _SKIP_NAMES]
        for name in names:
            files += 1
            with contextlib.suppress(OSError):
                size += os.stat(os.path.join(folder, name)).st_size
        if size > SNAPSHOT_MAX_BYTES or files > SNAPSHOT_MAX_FILES:
            raise GraderSetupError(
                f"the env root {root} holds more than {SNAPSHOT_MAX_BYTES >> 20} MiB or {SNAPSHOT_MAX_FILES} files: "
                "the grader snapshots it whole at job start; keep large data out of it (or pass --agent-root "
                "a folder holding only the envs)"
            )


def grader_mode(cfg: EnvConfig | None, job_isolation: str) -> Isolation:
    """Where ``cfg``'s evaluator runs: ``none`` when the env or the job (``job_isolation``: its
    ``--grader-isolation``, else its ``--sandbox``) says so, else ``bwrap``."""
    return "none" if "none" in (cfg.grader.isolation if cfg else None, job_isolation) else "bwrap"


BYTE_COMPILE_S = 60.0
"""How long a snapshot's byte-compiling may take (then evaluations compile what they import)."""


async def _byte_compile(folder: Path) -> None:
    """Byte-compile a snapshot's Python files (compiled, none of them run) in a process of its
    own, so that evaluations in the grader sandbox, which write no bytecode, read their evaluator
    compiled instead of compiling it each time; a file that does not compile, or a compiler that
    fails, costs only that."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-m",
        "compileall",
        "-q",
        str(folder),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await asyncio.wait_for(proc.wait(), BYTE_COMPILE_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        log.info(
            "grader: the snapshot %s was not byte-compiled in %g s: evaluations compile it",
            folder,
            BYTE_COMPILE_S,
        )


class Grader:
    """Runs a job's evaluations (module docstring). ``isolation`` is the job's default (an env may
    set its own per call); ``work_dir`` holds the snapshot and the workspace copies (None: the
    system temp folder); ``fork_server``: False starts an interpreter in each grader sandbox
    instead of forking it from the fork server, ``"helpers"`` has the server fork a helper per
    evaluation even as root (both for comparisons). Use as ``async with
    Grader(...) as g: await g.start(roots)``."""

    def __init__(
        self,
        isolation: Isolation = "bwrap",
        work_dir: Path | None = None,
        limits: GraderLimits | None = None,
        caps: CopyCaps | None = None,
        fork_server: bool | Literal["helpers"] = True,
    ) -> None:
        self.isolation = isolation
        self.limits = limits or GraderLimits()
        self.caps = caps or CopyCaps()
        self._work_dir = work_dir
        self._folder: Path | None = None
        self._roots: dict[Path, Path] = {}
        self._warned_keys: set[str] = set()
        self._forks = ForkServer(helpers=fork_server == "helpers") if fork_server else None

    async def __aenter__(self) -> Grader:
        self._folder = Path(tempfile.mkdtemp(prefix="rollout-grader-", dir=self._work_dir))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._forks is not None:
            await asyncio.shield(self._forks.close())
        if self._folder is not None:
            await asyncio.to_thread(shutil.rmtree, self._folder, True)
            self._folder = None

    async def start(self, roots: Iterable[Path]) -> None:
        """Snapshot each env root (a folder holding ``<env>/rule_evaluator.py``) not taken yet.
        Raises GraderSetupError for a root over ``SNAPSHOT_MAX_BYTES`` / ``SNAPSHOT_MAX_FILES``
        or one that cannot be copied."""
        assert self._folder is not None, "use the Grader as an async context manager"
        for root in dict.fromkeys(Path(r).resolve() for r in roots):
            if root in self._roots:
                continue
            dest = self._folder / "envs" / str(len(self._roots))
            t0 = time.monotonic()
            await asyncio.to_thread(_check_root, root)
            try:
                await asyncio.to_thread(shutil.copytree, root, dest, ignore=_SKIP)
            except (OSError, shutil.Error) as e:
                raise GraderSetupError(f"the env root {root} cannot be snapshot for grading: {e}") from e
            if self.isolation == "bwrap":  # in the launcher, evaluators compile as any import does
                await _byte_compile(dest)
            self._roots[root] = dest
            log.debug("grader snapshot of %s taken in %.3f s", root, time.monotonic() - t0)

    def _warn_score_keys(self, env_name: str, done: Evaluation) -> None:
        """A warning, once per env, when an evaluator's dict carried more than one score key."""
        if len(done.score_keys) > 1 and env_name not in self._warned_keys:
            self._warned_keys.add(env_name)
            log.warning(
                "env %s: the evaluator's result carries %s; %r is used (the order is %s)",
                env_name,
                ", ".join(done.score_keys),
                done.score_keys[0],
                " > ".join(SCORE_KEYS),
            )

    def _host_root(self, path: Path) -> Path:
        resolved = path.resolve()
        for root in self._roots:
            if resolved.is_relative_to(root):
                return root
        raise ValueError(f"{path} is not in a snapshot env root (Grader.start was not given its root)")

    async def evaluate(
        self,
        path: Path,
        request: EvalRequest,
        spec: EvalSpec,
        trajectory: Trajectory,
        workspace: Path | None,
        isolation: Isolation | None = None,
        limits: GraderLimits | None = None,
    ) -> Evaluation:
        """Evaluate one session on a copy of ``workspace`` (None: the session has none) with the
        snapshot of ``path``. Never raises but CancelledError."""
        assert self._folder is not None, "use the Grader as an async context manager"
        mode = isolation or self.isolation
        root = self._host_root(path)
        copy: Path | None = None
        try:
            manifest: dict[str, object] | None = None
            if workspace is not None:
                copy = Path(tempfile.mkdtemp(prefix="ws-", dir=self._folder)) / "w"
                try:
                    manifest = (
                        await asyncio.to_thread(copy_workspace, workspace, copy, self.caps)
                    ).manifest()
                except OSError as e:  # the workspace itself is gone or unreadable: graded without one
                    manifest = {
                        "complete": False,
                        "error": f"the final workspace cannot be read: {e.strerror}",
                    }
                    await asyncio.to_thread(shutil.rmtree, copy.parent, True)
                    copy = None
            request = request.model_copy(update={"workspace_manifest": manifest})
            if mode == "none":
                snap = self._roots[root] / path.resolve().relative_to(root)
                inside = request.model_copy(update={"workspace": str(copy) if copy is not None else None})
                spec = spec.model_copy(update={"evaluator_path": str(snap)})
                done = await run_evaluation(snap, inside, spec, trajectory)
            else:
                done = await evaluate_in_sandbox(
                    path.resolve(),
                    request,
                    spec,
                    trajectory,
                    copy,
                    [(snap, host) for host, snap in self._roots.items()],
                    limits or self.limits,
                    self._forks,
                )
            self._warn_score_keys(request.env_name, done)
            return done
        finally:
            if copy is not None:  # an evaluator run in the launcher (isolation none) may have written to it
                left = await asyncio.to_thread(remove_tree, copy.parent)
                if left is not None:
                    log.warning("a workspace copy was not removed: %s", left)
