"""Unit tests of the Responses and Anthropic stream assemblers and answer readers
(:mod:`wire.assembly`), fed through the real SSE parser with arbitrary read boundaries, and of
the synthesized streams (:mod:`gateway.protocols`) read back by the assemblers."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.protocols.anthropic import message_to_stream
from gateway.protocols.responses import response_to_stream
from tests.fake_upstream import default_messages_stream, default_responses_stream, response_object, sse_event
from tests.faults import RESPONSES_ARGS_ONLY_IN_DONE, RESPONSES_NO_COMPLETED
from tests.gateway.test_messages import THINK_TEXT_TOOL, THINK_TEXT_TOOL_MESSAGE
from wire.assembly import (
    Answer,
    MessagesStreamAssembler,
    ResponsesStreamAssembler,
    StreamAssembler,
    read_answer,
    read_messages,
    read_responses,
)
from wire.sse import SSEParser

CALL = {
    "type": "function_call",
    "id": "fc1",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city":"Paris"}',
}


def feed(asm: StreamAssembler, chunks: list[bytes], piece: int | None = None) -> StreamAssembler:
    """Feed ``chunks`` through an SSEParser, re-cut into ``piece``-byte reads when given."""
    data = b"".join(chunks)
    reads = chunks if piece is None else [data[i : i + piece] for i in range(0, len(data), piece)]
    parser = SSEParser()
    for r in reads:
        for ev in parser.feed(r):
            asm.feed_event(ev)
    return asm


def ev(obj: dict[str, Any]) -> bytes:
    return sse_event(obj)


# ------------------------------------------------------------------------------ Responses
@pytest.mark.parametrize("piece", [None, 1, 7, 64])
def test_output_and_usage_from_response_completed(piece: int | None) -> None:
    asm = feed(ResponsesStreamAssembler(), RESPONSES_ARGS_ONLY_IN_DONE, piece)
    assert isinstance(asm, ResponsesStreamAssembler)
    assert (asm.status(), asm.finished, asm.chunk_count, asm.terminal_type) == (
        "ok",
        True,
        4,
        "response.completed",
    )
    result = asm.result()
    assert result == {
        "id": "r1",
        "status": "completed",
        "output": [CALL],
        "usage": {"input_tokens": 12, "output_tokens": 9, "total_tokens": 21},
    }
    assert asm.notes() == {}
    assert read_responses(result) == Answer(
        tool_calls=[
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ],
        finish_reason="completed",
        prompt_tokens=12,
        completion_tokens=9,
        total_tokens=21,
    )


def test_a_done_sentinel_neither_counts_nor_ends_a_responses_stream() -> None:
    done = b"data: [DONE]\n\n"
    asm = feed(ResponsesStreamAssembler(), [*RESPONSES_ARGS_ONLY_IN_DONE, done])
    assert (asm.status(), asm.chunk_count, asm.notes()) == ("ok", 4, {})
    assert feed(ResponsesStreamAssembler(), [*RESPONSES_NO_COMPLETED, done]).status() == "truncated"


def test_without_completed_falls_back_to_the_done_arguments() -> None:
    asm = feed(ResponsesStreamAssembler(), RESPONSES_NO_COMPLETED)
    assert (asm.status(), asm.finished) == ("truncated", False)
    assert asm.result() == {"id": "r1", "status": "in_progress", "output": [CALL]}


def test_fallback_from_deltas_text_reasoning_refusal_and_arguments() -> None:
    chunks = [
        ev({"type": "response.created", "response": {"id": "r2", "status": "in_progress", "output": []}}),
        ev(
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {"type": "reasoning", "id": "rs", "summary": []},
            }
        ),
        ev(
            {
                "type": "response.reasoning_summary_part.added",
                "item_id": "rs",
                "output_index": 0,
                "summary_index": 0,
                "part": {"type": "summary_text", "text": ""},
            }
        ),
        ev(
            {
                "type": "response.reasoning_summary_text.delta",
                "item_id": "rs",
                "output_index": 0,
                "summary_index": 0,
                "delta": "plan",
            }
        ),
        ev(
            {
                "type": "response.reasoning_text.delta",
                "item_id": "rs",
                "output_index": 0,
                "content_index": 0,
                "delta": "raw ",
            }
        ),
        ev(
            {
                "type": "response.reasoning_text.delta",
                "item_id": "rs",
                "output_index": 0,
                "content_index": 0,
                "delta": "thought",
            }
        ),
        ev(
            {
                "type": "response.output_item.added",
                "output_index": 1,
                "item": {"type": "message", "id": "m1", "role": "assistant", "content": []},
            }
        ),
        # no content_part.added: the text part is created from its deltas (located by item_id)
        ev({"type": "response.output_text.delta", "item_id": "m1", "content_index": 0, "delta": "Hel"}),
        ev({"type": "response.output_text.delta", "item_id": "m1", "content_index": 0, "delta": "lo"}),
        ev(
            {
                "type": "response.refusal.delta",
                "item_id": "m1",
                "output_index": 1,
                "content_index": 1,
                "delta": "no",
            }
        ),
        ev({"type": "response.output_item.added", "output_index": 2, "item": {**CALL, "arguments": ""}}),
        ev(
            {
                "type": "response.function_call_arguments.delta",
                "output_index": 2,
                "item_id": "fc1",
                "delta": '{"city":',
            }
        ),
        ev(
            {
                "type": "response.function_call_arguments.delta",
                "output_index": 2,
                "item_id": "fc1",
                "delta": '"Par',
            }
        ),
    ]
    asm = feed(ResponsesStreamAssembler(), chunks, 5)
    assert asm.status() == "truncated"
    out = asm.result()["output"]
    assert out[0] == {
        "type": "reasoning",
        "id": "rs",
        "summary": [{"type": "summary_text", "text": "plan"}],
        "content": [{"type": "reasoning_text", "text": "raw thought"}],
    }
    assert out[1]["content"] == [
        {"type": "output_text", "text": "Hello"},
        {"type": "refusal", "refusal": "no"},
    ]
    assert out[2]["arguments"] == '{"city":"Par'  # the deltas so far, never invented
    answer = read_responses(asm.result())
    assert (answer.content, answer.reasoning) == ("Hello", "raw thought")


def test_done_payloads_win_over_deltas() -> None:
    chunks = [
        ev(
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {"type": "message", "id": "m1", "role": "assistant", "content": []},
            }
        ),
        ev(
            {
                "type": "response.content_part.added",
                "item_id": "m1",
                "output_index": 0,
                "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []},
            }
        ),
        ev(
            {
                "type": "response.output_text.delta",
                "item_id": "m1",
                "output_index": 0,
                "content_index": 0,
                "delta": "draft",
            }
        ),
        ev(
            {
                "type": "response.output_text.done",
                "item_id": "m1",
                "output_index": 0,
                "content_index": 0,
                "text": "final text",
            }
        ),
        ev({"type": "response.output_item.added", "output_index": 1, "item": {**CALL, "arguments": ""}}),
        ev({"type": "response.function_call_arguments.delta", "output_index": 1, "delta": '{"ci'}),
        ev(
            {
                "type": "response.function_call_arguments.done",
                "output_index": 1,
                "arguments": '{"city":"Oslo"}',
            }
        ),
        ev(
            {
                "type": "response.output_item.added",
                "output_index": 2,
                "item": {**CALL, "id": "fc2", "arguments": ""},
            }
        ),
        ev({"type": "response.function_call_arguments.delta", "output_index": 2, "delta": "{}"}),
        ev(
            {
                "type": "response.output_item.done",
                "output_index": 2,
                "item": {**CALL, "id": "fc2", "arguments": '{"city":"Rome"}', "status": "completed"},
            }
        ),
    ]
    out = feed(ResponsesStreamAssembler(), chunks).result()["output"]
    assert out[0]["content"] == [{"type": "output_text", "text": "final text", "annotations": []}]
    assert out[1]["arguments"] == '{"city":"Oslo"}'
    assert out[2] == {**CALL, "id": "fc2", "arguments": '{"city":"Rome"}', "status": "completed"}


def test_completed_without_output_takes_the_accumulated_output() -> None:
    chunks = [
        *RESPONSES_NO_COMPLETED,
        ev(
            {
                "type": "response.completed",
                "response": {
                    "id": "r1",
                    "status": "completed",
                    "output": [],
                    "usage": {"input_tokens": 1, "output_tokens": 2},
                },
            }
        ),
    ]
    asm = feed(ResponsesStreamAssembler(), chunks)
    result = asm.result()
    assert result["output"] == [CALL] and result["usage"] == {"input_tokens": 1, "output_tokens": 2}
    assert asm.notes() == {"output_from_events": True}
    assert read_responses(result).total_tokens == 3  # input + output when total_tokens is absent


@pytest.mark.parametrize(
    ("last", "status", "finish"),
    [
        (
            {
                "type": "response.incomplete",
                "response": {
                    "id": "r",
                    "status": "incomplete",
                    "output": [],
                    "incomplete_details": {"reason": "max_output_tokens"},
                },
            },
            "ok",
            "max_output_tokens",
        ),
        (
            {
                "type": "response.failed",
                "response": {
                    "id": "r",
                    "status": "failed",
                    "output": [],
                    "error": {"code": "server_error", "message": "x"},
                },
            },
            "error",
            "failed",
        ),
        (
            {
                "type": "error",
                "code": "rate_limit_exceeded",
                "message": "slow",
                "param": None,
                "sequence_number": 3,
            },
            "error",
            "in_progress",
        ),
    ],
)
def test_terminal_and_error_events(last: dict[str, Any], status: str, finish: str) -> None:
    created = ev({"type": "response.created", "response": {"id": "r", "status": "in_progress", "output": []}})
    asm = feed(ResponsesStreamAssembler(), [created, ev(last)])
    assert asm.status() == status
    assert read_responses(asm.result()).finish_reason == finish
    if last["type"] == "error":
        assert asm.error == {"code": "rate_limit_exceeded", "message": "slow", "param": None}
        assert asm.last_sequence_number == 3


def test_odd_events_never_raise() -> None:
    chunks = [
        b"event: response.created\ndata: {not json\n\n",
        b"data: [1, 2]\n\n",
        ev({"type": "response.output_text.delta", "delta": "orphan"}),
        ev({"type": "response.unknown_new_event", "x": 1}),
        ev({"type": "response.output_item.added", "output_index": "zero", "item": "nope"}),
    ]
    asm = feed(ResponsesStreamAssembler(), chunks)
    assert asm.status() == "truncated" and asm.notes() == {"invalid_events": 2}
    assert asm.result() == {"object": "response", "output": []}


@pytest.mark.parametrize(
    "response",
    [
        response_object("hi"),
        response_object(
            output=[
                {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "s"}]},
                CALL,
            ],
            status="incomplete",
        ),
    ],
)
def test_synthesized_responses_stream_round_trips(response: dict[str, Any]) -> None:
    chunks = response_to_stream(response)
    assert all(c.startswith(b"event: response.") for c in chunks)
    asm = feed(ResponsesStreamAssembler(), chunks)
    assert asm.status() == "ok" and asm.result() == response
    assert feed(ResponsesStreamAssembler(), default_responses_stream()).result() == response_object()


# ------------------------------------------------------------------------------ Anthropic
@pytest.mark.parametrize("piece", [None, 1, 13])
def test_messages_stream_thinking_signature_text_tool_use(piece: int | None) -> None:
    asm = feed(MessagesStreamAssembler(), THINK_TEXT_TOOL, piece)
    assert (asm.status(), asm.finished, asm.chunk_count) == ("ok", True, len(THINK_TEXT_TOOL))
    assert asm.result() == THINK_TEXT_TOOL_MESSAGE
    assert read_messages(asm.result()) == Answer(
        content="Checking now.",
        reasoning="The user wants the weather.",
        tool_calls=[
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ],
        finish_reason="tool_use",
        prompt_tokens=25,
        completion_tokens=42,
        total_tokens=67,
    )


def test_messages_usage_merge_citations_and_bad_tool_json() -> None:
    chunks = [
        ev(
            {
                "type": "message_start",
                "message": {
                    "id": "m",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "usage": {"input_tokens": 10, "output_tokens": 1},
                },
            }
        ),
        ev(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": "", "citations": None},
            }
        ),
        ev(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {
                    "type": "citations_delta",
                    "citation": {"type": "char_location", "cited_text": "c"},
                },
            }
        ),
        ev({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "cited"}}),
        ev(
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}},
            }
        ),
        ev(
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"a": '},
            }
        ),
        ev(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                "usage": {"output_tokens": 7, "input_tokens": 12, "cache_read_input_tokens": None},
            }
        ),
        ev({"type": "message_stop"}),
    ]
    message = feed(MessagesStreamAssembler(), chunks).result()
    assert message["content"] == [
        {"type": "text", "text": "cited", "citations": [{"type": "char_location", "cited_text": "c"}]},
        {"type": "tool_use", "id": "t", "name": "f", "input": '{"a": '},
    ]  # not JSON: the raw text is kept
    assert message["usage"] == {"input_tokens": 12, "output_tokens": 7}
    answer = read_messages(message)
    assert answer.tool_calls[0]["function"]["arguments"] == '{"a": '
    assert (answer.finish_reason, answer.total_tokens) == ("max_tokens", 19)


def test_messages_truncated_error_and_odd_events() -> None:
    asm = feed(MessagesStreamAssembler(), THINK_TEXT_TOOL[:3])
    assert asm.status() == "truncated" and asm.result()["content"][0]["thinking"] == "The user wants "
    err = feed(
        MessagesStreamAssembler(),
        [
            THINK_TEXT_TOOL[0],
            ev({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ],
    )
    assert err.status() == "error" and err.error == {"type": "overloaded_error", "message": "Overloaded"}
    odd = feed(
        MessagesStreamAssembler(),
        [
            b"event: ping\ndata: nope\n\n",
            ev({"type": "content_block_delta", "index": 5, "delta": {"type": "text_delta", "text": "x"}}),
            ev({"type": "content_block_start", "index": "0"}),
        ],
    )
    assert odd.notes() == {"invalid_events": 1}
    assert odd.result() == {"type": "message", "role": "assistant", "content": []}


def test_synthesized_messages_stream_round_trips() -> None:
    message = {
        **THINK_TEXT_TOOL_MESSAGE,
        "content": [*THINK_TEXT_TOOL_MESSAGE["content"], {"type": "redacted_thinking", "data": "xyz"}],
    }
    chunks = message_to_stream(message)
    asm = feed(MessagesStreamAssembler(), chunks)
    assert asm.status() == "ok" and asm.result() == message
    assert feed(MessagesStreamAssembler(), default_messages_stream("a")).status() == "ok"


# ------------------------------------------------------------------------------ read_answer
def test_read_answer_dispatches_on_the_endpoint() -> None:
    assert read_answer("messages", THINK_TEXT_TOOL_MESSAGE).content == "Checking now."
    assert read_answer("responses", response_object("hey")).content == "hey"
    chat = {
        "choices": [{"message": {"content": "c", "reasoning": "r"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }
    assert (
        read_answer("chat.completions", chat)
        == read_answer(None, chat)
        == Answer(
            content="c",
            reasoning="r",
            finish_reason="stop",
            prompt_tokens=1,
            completion_tokens=2,
            total_tokens=3,
        )
    )
    for endpoint in ("chat.completions", "responses", "messages"):
        assert read_answer(endpoint, {"error": {"message": "x"}}) == Answer()
        assert read_answer(endpoint, "not a dict") == Answer()
