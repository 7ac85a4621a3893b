"""Runtime of the workspace env: the bash agent loop with native tool calls (``env.task_runtime``).

The loop itself is ``env.bash_agent``; the env's params choose its protocol and limits.
"""

from __future__ import annotations

from env.runtime_kit import run_runtime
from env.task_runtime import main

if __name__ == "__main__":
    run_runtime(main)
