"""Runtime of the scripts env: writes the case's ``files`` (name -> text; ``.sh`` files executable)
into the workspace, then runs the bash agent loop of ``env.task_runtime``."""

from __future__ import annotations

from pathlib import Path

from env.runtime_kit import run_runtime
from env.task_runtime import main as run_task
from rollout.protocol import SimulationStartRequest, SimulationStartResult


def write_files(files: dict[str, str], workspace: Path) -> None:
    """Write ``files`` into ``workspace``; ValueError for a name that is not a plain file name."""
    for name, text in files.items():
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"files: {name!r} is not a plain file name")
        path = workspace / name
        path.write_text(text, encoding="utf-8")
        if name.endswith(".sh"):
            path.chmod(0o755)


def main(req: SimulationStartRequest) -> SimulationStartResult:
    """The case's files into the cwd, then the bash agent loop."""
    write_files(dict(req.env_params["dataset"]["files"]), Path.cwd())
    return run_task(req)


if __name__ == "__main__":
    run_runtime(main)
