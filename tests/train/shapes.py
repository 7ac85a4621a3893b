"""The batch shapes of trainers that are not installed here, written down from their sources, so
the adapters' output is checked against them (docs/training.md, "Adapters").

- verl: ``AgentLoopOutput`` in ``verl/experimental/agent_loop/agent_loop.py`` (volcengine/verl);
- SkyRL: ``GeneratorOutput`` and ``TrajectoryID`` in ``skyrl-train/skyrl_train/generators/base.py``
  (NovaSky-AI/SkyRL);
- slime: ``Sample`` in ``slime/utils/types.py`` (THUDM/slime).
"""

from __future__ import annotations

from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict


class AgentLoopMetrics(BaseModel):
    """verl's timing metrics of one agent loop."""

    model_config = ConfigDict(extra="forbid")

    generate_sequences: float = 0.0
    tool_calls: float = 0.0


class AgentLoopOutput(BaseModel):
    """verl's agent-loop output, field for field (``extra="forbid"``: an unknown field fails)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    multi_modal_data: dict[str, Any] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    metrics: AgentLoopMetrics
    extra_fields: dict[str, Any] = {}


class TrajectoryID(TypedDict):
    """SkyRL's ``TrajectoryID`` dataclass, as its fields."""

    instance_id: str
    repetition_id: int


class GeneratorOutput(TypedDict):
    """SkyRL's generator output."""

    prompt_token_ids: list[list[int]]
    response_ids: list[list[int]]
    rewards: list[float] | list[list[float]]
    loss_masks: list[list[int]]
    stop_reasons: list[str] | None
    rollout_metrics: dict[str, Any] | None
    rollout_logprobs: list[list[float]] | None
    trajectory_ids: list[TrajectoryID] | None
    is_last_step: list[bool] | None
    sampling_masks: list[list[list[int]]] | None


SLIME_SAMPLE_FIELDS = frozenset(
    {
        "group_index",
        "index",
        "prompt",
        "tokens",
        "multimodal_inputs",
        "multimodal_train_inputs",
        "response",
        "response_length",
        "label",
        "reward",
        "loss_mask",
        "weight_versions",
        "rollout_log_probs",
        "rollout_routed_experts",
        "remove_sample",
        "teacher_log_probs",
        "mopd_teacher_log_probs",
        "status",
        "metadata",
        "generate_function_path",
        "train_metadata",
        "session_id",
        "non_generation_time",
        "spec_info",
        "prefix_cache_info",
    }
)
"""The fields of slime's ``Sample`` dataclass (``Sample.from_dict`` keeps only these as fields)."""
SLIME_STATUSES = frozenset({"pending", "completed", "truncated", "aborted", "failed"})
