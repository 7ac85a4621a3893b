"""The harness plugin API under its public path (``from rollout.harness import Harness, ...``):
re-exports ``rollout.contract.harness``."""

from rollout.contract.harness import (
    HARNESS_FILE,
    PROTOCOLS,
    SOLUTION_ENV,
    Harness,
    HarnessContext,
    HarnessLaunch,
    HarnessUnavailable,
    Protocol,
    load_harness_file,
    npm_install,
)

__all__ = [
    "HARNESS_FILE",
    "PROTOCOLS",
    "SOLUTION_ENV",
    "Harness",
    "HarnessContext",
    "HarnessLaunch",
    "HarnessUnavailable",
    "Protocol",
    "load_harness_file",
    "npm_install",
]
