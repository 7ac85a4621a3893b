"""Building the evaluator's ``Trajectory`` from recorded ``session_steps`` rows.

A step's answer is read according to its ``endpoint`` column with the gateway's own readers
(:func:`wire.assembly.read_answer`), so an evaluator sees the same fields whatever protocol
the agent spoke: ``chat.completions`` (``choices[0].message``), ``responses`` (the ``response``
object's ``output`` items) and ``messages`` (the Anthropic message's content blocks). Tool calls
are always in the OpenAI chat shape ``{"id", "type": "function", "function": {"name",
"arguments"}}`` (Responses ``function_call`` items: ``call_id`` as the id; Anthropic ``tool_use``
blocks: ``input`` as JSON text).
"""

from __future__ import annotations

from rollout.contract.protocol import Trajectory, TrajectoryStep
from store import SessionStep
from wire.assembly import read_answer


def to_step(row: SessionStep) -> TrajectoryStep:
    """One recorded step as a TrajectoryStep (assistant text, reasoning, tool calls, usage)."""
    answer = read_answer(row.endpoint, row.response)
    usage = None
    if row.total_tokens is not None or row.prompt_tokens is not None or row.completion_tokens is not None:
        usage = {
            "prompt_tokens": row.prompt_tokens,
            "completion_tokens": row.completion_tokens,
            "total_tokens": row.total_tokens,
        }
    return TrajectoryStep(
        seq=row.seq,
        step_id=row.step_id,
        model=row.llm_model,
        endpoint=row.endpoint,
        status=row.status,
        status_code=row.status_code,
        messages=row.messages if isinstance(row.messages, list) else [],
        request=row.request if isinstance(row.request, dict) else None,
        response=row.response if isinstance(row.response, dict) else None,
        content=answer.content,
        reasoning=answer.reasoning,
        tool_calls=answer.tool_calls,
        finish_reason=row.finish_reason,
        usage=usage,
    )


def to_trajectory(session_id: str, rows: list[SessionStep]) -> Trajectory:
    """The session's trajectory; ``final_response`` is the last non-empty assistant text."""
    steps = [to_step(r) for r in sorted(rows, key=lambda r: r.seq)]
    final = next((s.content for s in reversed(steps) if s.content), "")
    return Trajectory(session_id=session_id, steps=steps, final_response=final or "")
