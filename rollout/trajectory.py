"""Building the evaluator's ``Trajectory`` from recorded ``session_steps`` rows."""

from __future__ import annotations

from typing import Any

from rollout.protocol import Trajectory, TrajectoryStep
from store import SessionStep


def _message(response: Any) -> dict[str, Any]:
    if not isinstance(response, dict):
        return {}
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        msg = choices[0].get("message")
        return msg if isinstance(msg, dict) else {}
    return {}


def to_step(row: SessionStep) -> TrajectoryStep:
    """One recorded chat step as a TrajectoryStep (assistant text, reasoning, tool calls, usage)."""
    msg = _message(row.response)
    content = msg.get("content")
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    tool_calls = msg.get("tool_calls")
    usage = None
    if row.total_tokens is not None or row.prompt_tokens is not None or row.completion_tokens is not None:
        usage = {"prompt_tokens": row.prompt_tokens, "completion_tokens": row.completion_tokens,
                 "total_tokens": row.total_tokens}
    return TrajectoryStep(
        seq=row.seq, step_id=row.step_id, model=row.llm_model, endpoint=row.endpoint, status=row.status,
        status_code=row.status_code,
        messages=row.messages if isinstance(row.messages, list) else [],
        request=row.request if isinstance(row.request, dict) else None,
        response=row.response if isinstance(row.response, dict) else None,
        content=content if isinstance(content, str) else None,
        reasoning=reasoning if isinstance(reasoning, str) else None,
        tool_calls=tool_calls if isinstance(tool_calls, list) else [],
        finish_reason=row.finish_reason, usage=usage,
    )


def to_trajectory(session_id: str, rows: list[SessionStep]) -> Trajectory:
    """The session's trajectory; ``final_response`` is the last non-empty assistant text."""
    steps = [to_step(r) for r in sorted(rows, key=lambda r: r.seq)]
    final = next((s.content for s in reversed(steps) if s.content), "")
    return Trajectory(session_id=session_id, steps=steps, final_response=final or "")


def usage_total(steps: list[TrajectoryStep]) -> dict[str, int] | None:
    """Token counts summed over steps that reported usage; None when no step did."""
    known = [s.usage for s in steps if s.usage]
    if not known:
        return None
    return {k: sum(int(u.get(k) or 0) for u in known) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
