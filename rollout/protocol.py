"""The runtime and evaluator protocol under its public path (``from rollout.protocol import ...``):
re-exports ``rollout.contract.protocol``."""

from rollout.contract.protocol import (
    EvalRequest,
    EvalSpec,
    RuntimeStatus,
    SimulationStartRequest,
    SimulationStartResult,
    Trajectory,
    TrajectoryStep,
    model_from_json,
    model_json,
)

__all__ = [
    "EvalRequest",
    "EvalSpec",
    "RuntimeStatus",
    "SimulationStartRequest",
    "SimulationStartResult",
    "Trajectory",
    "TrajectoryStep",
    "model_from_json",
    "model_json",
]
