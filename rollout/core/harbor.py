"""Harbor task directories as a dataset (``dataset: {format: harbor, path: ...}``, docs/verifiers.md).

Each sub-folder of the dataset path is one task: ``instruction.md`` (what the agent is told),
``task.toml`` (``[agent] timeout_sec``, ``[verifier] timeout_sec``, ``[metadata]``,
``[environment] docker_image``), ``tests/test.sh`` (the verifier, never shown to the agent),
optional ``solution/solve.sh`` (the reference solution, for the ``oracle`` harness only) and
optional ``environment/`` (its files are the task's initial workspace). A task with an
``environment/Dockerfile`` or ``[environment] docker_image`` runs in that image (its row's
``image_context`` / ``image_ref``: docs/images.md) unless the env declares the host's toolchain
enough (``dataset.host_toolchain: true``); a task with a compose file is skipped with the reason.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.errors import RolloutError

CONTAINER_FILES = ("Dockerfile", "docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
"""Files of a task's ``environment/`` that say it is built as a container image."""
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
"""The verifier's timeout when ``task.toml`` names none (Harbor's default)."""
HIDDEN_FIELDS = (
    "files_dir",
    "tests_dir",
    "solution_dir",
    "verifier_timeout_s",
    "metadata",
    "image_context",
    "image_ref",
    "workdir",
)
"""Fields of a Harbor case row that the agent never sees (paths of the task folder, the grading set-up)."""


class HarborTaskError(RolloutError, ValueError):
    """A task folder that is not a valid Harbor task (the message names the file)."""


def task_files(folder: Path, error: type[Exception]) -> str | None:
    """``folder`` (a task's files copied into each workspace) as an absolute path, None when there
    is none. Raises ``error`` naming the first symbolic link in it (itself included): the files are
    copied as data, and a link would copy what it points at on the host (a hidden answer, /etc)."""
    if folder.is_symlink():
        raise error(f"{folder} is a symbolic link: a task's files are copied as data; put the files there")
    if not folder.is_dir():
        return None
    for parent, dirs, names in os.walk(folder):
        for name in sorted([*dirs, *names]):
            if (Path(parent) / name).is_symlink():
                raise error(
                    f"{Path(parent) / name} is a symbolic link: a task's files are copied as data, "
                    "never followed; replace the link with the file"
                )
    return str(folder.resolve())


@dataclass
class HarborScan:
    """The dataset's rows (one per runnable task, by folder name) and the tasks left out, as
    ``(task id, why)``."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _timeout(section: Any, where: str) -> float | None:
    if section is None:
        return None
    if not isinstance(section, dict):
        raise HarborTaskError(f"{where} must be a table")
    value = section.get("timeout_sec")
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise HarborTaskError(f"{where}.timeout_sec must be a positive number, not {value!r}")
    return float(value)


def container_need(task: Path, config: dict[str, Any]) -> str | None:
    """Why the task's environment needs a container image (None when it does not)."""
    env = config.get("environment")
    if isinstance(env, dict) and env.get("docker_image"):
        return f"task.toml names the image {env['docker_image']!r}"
    for name in CONTAINER_FILES:
        if (task / "environment" / name).is_file():
            return f"environment/{name} builds a container image"
    return None


def compose_file(task: Path) -> str | None:
    """The compose file of the task's environment, if any (a multi-container task: not run here)."""
    return next((n for n in CONTAINER_FILES[1:] if (task / "environment" / n).is_file()), None)


def image_fields(task: Path, config: dict[str, Any]) -> dict[str, str]:
    """The row fields naming the task's image: ``image_context`` (the build context of its
    ``environment/Dockerfile``), else ``image_ref`` (``[environment] docker_image``); {} for none."""
    if (task / "environment" / "Dockerfile").is_file():
        return {"image_context": str((task / "environment").resolve())}
    env = config.get("environment")
    if isinstance(env, dict) and isinstance(env.get("docker_image"), str) and env["docker_image"]:
        return {"image_ref": env["docker_image"]}
    return {}


def dockerfile_workdir(dockerfile: Path) -> str | None:
    """The WORKDIR a Dockerfile's last stage ends in (a relative one joined to the one before);
    None when it sets none."""
    workdir: str | None = None
    for line in dockerfile.read_text(encoding="utf-8", errors="replace").splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].upper() == "FROM":
            workdir = None
        elif len(words) == 2 and words[0].upper() == "WORKDIR":
            workdir = os.path.normpath(os.path.join(workdir or "/", words[1].strip("\"'")))
    return workdir


def read_task(task: Path) -> tuple[dict[str, Any], str | None]:
    """One task folder as ``(row, container need)``. Raises HarborTaskError for a missing
    ``instruction.md``, ``task.toml`` or ``tests/test.sh``, or an invalid ``task.toml``."""
    instruction, toml_path, test = task / "instruction.md", task / "task.toml", task / "tests" / "test.sh"
    for needed in (instruction, toml_path, test):
        if not needed.is_file():
            raise HarborTaskError(f"Harbor task {task} needs {needed.relative_to(task)}")
    try:
        config = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise HarborTaskError(f"{toml_path}: not valid TOML: {e}") from None
    metadata = config.get("metadata", {})
    if not isinstance(metadata, dict):
        raise HarborTaskError(f"{toml_path}: [metadata] must be a table")
    environment, solution = task / "environment", task / "solution"
    row = {
        "id": task.name,
        "instruction": instruction.read_text(encoding="utf-8"),
        "agent_timeout_s": _timeout(config.get("agent"), f"{toml_path}: [agent]"),
        "verifier_timeout_s": _timeout(config.get("verifier"), f"{toml_path}: [verifier]")
        or DEFAULT_VERIFIER_TIMEOUT_S,
        "metadata": metadata,
        "files_dir": task_files(environment, HarborTaskError),
        "tests_dir": str((task / "tests").resolve()),
        "solution_dir": str(solution.resolve()) if (solution / "solve.sh").is_file() else None,
        **image_fields(task, config),
    }
    return row, container_need(task, config)


def scan(root: Path, host_toolchain: bool = False) -> HarborScan:
    """Every task folder under ``root`` (sorted by name): its row, or why it is skipped (invalid:
    ``read_task``'s error, its path left out; a compose file, and ``host_toolchain`` is false). A
    task in an image keeps its image fields unless ``host_toolchain`` (then it runs on the host).
    Raises HarborTaskError when ``root`` is not a folder."""
    if not root.is_dir():
        raise HarborTaskError(f"Harbor task folder {root} not found")
    out = HarborScan()
    for task in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            row, _ = read_task(task)
        except HarborTaskError as e:  # this task only: the others run (its reason said, as a skip)
            out.skipped.append(
                (task.name, str(e).replace(f"Harbor task {task} ", "").replace(f"{task}/", ""))
            )
            continue
        compose = compose_file(task)
        if host_toolchain:
            context = row.pop("image_context", None)
            row.pop("image_ref", None)
            workdir = dockerfile_workdir(Path(context) / "Dockerfile") if context else None
            if workdir not in (None, "/"):
                row["workdir"] = workdir  # the workspace is bound there too (docs/images.md)
        elif compose is not None:
            out.skipped.append(
                (
                    task.name,
                    f"environment/{compose} runs several containers: not supported here "
                    "(set dataset.host_toolchain: true, or --host-toolchain with --tasks, "
                    "when the host's tools are enough)",
                )
            )
            continue
        out.rows.append(row)
    return out
