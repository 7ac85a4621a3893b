"""Wire types between the launcher, runtimes and evaluators.

One place defines each of them:

- ``SimulationStartRequest``: the JSON a runtime reads on stdin.
- ``SimulationStartResult``: the JSON line a runtime prints last on stdout.
- ``EvalRequest``, ``EvalSpec``, ``Trajectory`` (of ``TrajectoryStep``): what an evaluator's
  ``evaluate(request, spec, trajectory)`` is handed.

These models accept unknown fields (``extra="allow"``) because runtimes written by users may add
their own; user *configs* are strict elsewhere.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticSerializationError

_M = TypeVar("_M", bound=BaseModel)


def model_json(model: BaseModel) -> str:
    """``model.model_dump_json()`` (compact JSON, one line); when a string holds a lone surrogate,
    which pydantic cannot encode, the same values with ``\\uXXXX`` escapes (docs/storage.md,
    "Text that is not UTF-8"), so every message can be written."""
    try:
        return model.model_dump_json()
    except PydanticSerializationError:
        return json.dumps(model.model_dump(mode="json"), separators=(",", ":"), allow_nan=False)


def model_from_json(cls: type[_M], text: str | bytes) -> _M:
    """``cls`` validated from JSON ``text`` read by ``json.loads``, which, unlike pydantic's own
    parser, reads a lone surrogate's escape (``"\\ud800"``). Raises ValueError (bad JSON, or
    pydantic's ValidationError)."""
    return cls.model_validate(json.loads(text))


RuntimeStatus = Literal["succeeded", "failed", "truncated"]


class SimulationStartRequest(BaseModel):
    """Start request for one session, given to the runtime on stdin as one JSON document.

    ``gateway_base_url`` is the session URL prefix ``http://HOST:PORT/v1/sessions/{session_id}``:
    an OpenAI client uses it as ``base_url`` (``.../chat/completions`` is appended by the SDK).
    ``env_params["dataset"]`` is the case row, without the expected answer when the env keeps one
    apart. ``max_steps`` is the session's model-call budget (-1 unlimited); ``temperature`` may be
    None (route default). ``case_id``: the case (task) the session runs; ``instruction_path``: a
    read-only file holding the case's instruction, as the runtime sees it (None when the case has
    no ``instruction``); both also as ``ROLLOUT_CASE_ID`` and ``ROLLOUT_INSTRUCTION_PATH``.
    """

    model_config = ConfigDict(extra="allow")

    job_id: str
    session_id: str
    agent_name: str
    agent_id: str
    group_id: str
    gateway_base_url: str
    model: str
    temperature: float | None = None
    max_steps: int = -1
    env_params: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    case_id: str | None = None
    instruction_path: str | None = None


class SimulationStartResult(BaseModel):
    """The runtime's result: the last JSON line it prints on stdout before it exits 0.

    ``status`` is required: output without it (or a runtime that exits otherwise) is an error
    session, never a success. ``metrics`` carries raw inputs for the rule (e.g. the extracted
    answer). ``error_class``: what the runtime believes stopped it (the gateway could not be
    reached: ``gateway_unreachable``; the model was unavailable, HTTP 429/5xx:
    ``upstream_unavailable``). It is a claim, shown in the attempt's reason: the launcher retries
    a session only when its own records (the gateway bridge, the session close, the gateway's
    recorded calls) show the outage (docs/outcomes.md, docs/trust-model.md). The whole result is
    the agent's words: it never decides a reward or an outcome class by itself.
    """

    model_config = ConfigDict(extra="allow")

    session_id: str
    status: RuntimeStatus
    total_reward: float = Field(default=0.0, allow_inf_nan=False)
    step_count: int = 0
    terminated: bool = True
    truncated: bool = False
    error_text: str | None = None
    error_class: Literal["gateway_unreachable", "upstream_unavailable"] | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)

    @field_validator("total_reward", mode="before")
    @classmethod
    def _null_reward(cls, v: object) -> object:
        """``"total_reward": null`` (Safactory's runners print it) reads as 0.0."""
        return 0.0 if v is None else v


class EvalSpec(BaseModel):
    """Evaluation spec handed to an evaluator: ``eval_id`` (``<env_name>/rule``), the timeout in
    seconds and the absolute path of the ``rule_evaluator.py`` that is called."""

    eval_id: str
    timeout_s: float
    evaluator_path: str


class EvalRequest(BaseModel):
    """What the evaluator knows about the session: ids, the env params (``env_params["dataset"]``
    is the full case row, expected answer included), the runtime's ``start_result`` (None when
    the runtime produced no valid result: the agent's words, never proof), ``workspace`` (the
    folder holding a copy of the final workspace, as data: regular files and folders only),
    ``workspace_manifest`` (what that copy left out: links, FIFOs, what is over its caps) and
    ``verifier``: what the task's tests said (a Harbor task: ``status``, ``reward``,
    ``reward_json``, ``exit_code``, ``stdout_tail``, ``stderr_tail``, ``reason``;
    docs/verifiers.md), None when the case has none."""

    model_config = ConfigDict(extra="allow")

    job_id: str
    session_id: str
    env_name: str
    case_id: str
    group_id: str
    sample_index: int
    model: str
    env_params: dict[str, Any]
    start_result: SimulationStartResult | None = None
    workspace: str | None = None
    workspace_manifest: dict[str, Any] | None = None
    verifier: dict[str, Any] | None = None


class TrajectoryStep(BaseModel):
    """One recorded model call, as an evaluator sees it.

    ``content`` is the assistant text (None for tool-call-only answers), ``tool_calls`` the OpenAI
    tool calls (``[{"id", "type", "function": {"name", "arguments"}}]``), ``usage`` the token
    counts (None when unknown). ``status`` is the step status (ok | error | truncated | ...).
    """

    seq: int
    step_id: int
    model: str
    endpoint: str
    status: str
    status_code: int | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int | None] | None = None


class Trajectory(BaseModel):
    """The ordered steps of a session. ``final_response`` is the text of the last step that has
    assistant text ("" when no step has any). ``steps`` may be empty (an agent that never called
    the model): evaluators must treat that as a normal input."""

    session_id: str
    steps: list[TrajectoryStep] = Field(default_factory=list)
    final_response: str = ""
