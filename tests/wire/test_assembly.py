"""ChatStreamAssembler on the exact upstream byte lists of :mod:`tests.faults` (through SSEParser)."""

from __future__ import annotations

import json
from typing import Any

from tests.faults import (
    CHAT_FAULT_STREAMS,
    COMMENTS_AND_KEEPALIVES,
    EMPTY_CHOICES_CHUNKS,
    EOF_WITHOUT_DONE,
    ERROR_IN_200_STREAM,
    ONLY_DONE,
    PARALLEL_TOOL_CALLS,
    PARALLEL_TOOL_CALLS_NO_INDEX,
    REASONING_VARIANTS,
    SPLIT_EVENTS_AND_CRLF,
)
from wire.assembly import ChatStreamAssembler, message_of, reasoning_of, usage_of
from wire.sse import SSEParser

PARALLEL_EXPECTED = [
    {
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    },
    {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}},
]


def run(pieces: list[bytes]) -> tuple[ChatStreamAssembler, int]:
    """Feed the exact upstream writes through SSEParser into a ChatStreamAssembler."""
    parser = SSEParser()
    asm = ChatStreamAssembler()
    n_events = 0
    for piece in pieces:
        for ev in parser.feed(piece):
            n_events += 1
            if ev.data == "[DONE]":
                asm.feed_done()
            else:
                asm.feed_chunk(json.loads(ev.data))
    assert parser.close() == []
    return asm, n_events


def chunk(choices: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": choices,
        **top,
    }


def test_empty_choices_chunks_and_usage_only_last_chunk() -> None:
    asm, n = run(EMPTY_CHOICES_CHUNKS)
    assert n == 5
    assert asm.content() == "Hi"
    assert asm.finish_reason() == "stop"
    assert asm.usage == {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
    assert asm.status() == "ok" and asm.saw_done and asm.error is None
    assert asm.chunk_count == 4
    assert asm.result() == {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi"},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
        "prompt_filter_results": [{"prompt_index": 0}],
    }


def test_keepalives_and_dataless_blocks() -> None:
    asm, n = run(COMMENTS_AND_KEEPALIVES)
    assert n == 3
    assert asm.content() == "AB"
    assert asm.finish_reason() == "stop"
    assert asm.error is None and asm.status() == "ok"
    assert asm.invalid_count == 0


def test_split_events_crlf_multiline_data() -> None:
    asm, n = run(SPLIT_EVENTS_AND_CRLF)
    assert n == 3
    assert asm.content() == "hello world"
    assert asm.saw_done and asm.status() == "ok"
    assert asm.chunk_count == 2


def test_utf8_split_e_acute() -> None:
    pieces = [
        b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"caf\xc3',
        b'\xa9 ol\xc3\xa9"},"finish_reason":"stop"}]}\r\n\r\n',
        b"data: [DONE]\n\n",
    ]
    asm, _ = run(pieces)
    assert asm.content() == "café olé"
    assert asm.status() == "ok"


def test_700kb_tool_arguments_line() -> None:
    args = '{"path":"a.txt","content":"' + "x" * 700_000 + '"}'
    first = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "choices": [
            {
                "index": 0,
                "delta": {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_w",
                            "type": "function",
                            "function": {"name": "write_file", "arguments": args},
                        }
                    ],
                },
                "finish_reason": None,
            }
        ],
    }
    line = b"data: " + json.dumps(first).encode() + b"\n\n"
    assert len(line) > 700_000
    # also cut the huge line into 64 KB writes, as TCP would
    pieces = [line[i : i + 65536] for i in range(0, len(line), 65536)]
    pieces += [
        b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    asm, n = run(pieces)
    assert n == 3
    calls = asm.tool_calls()
    assert len(calls) == 1
    assert calls[0]["function"]["name"] == "write_file"
    assert len(calls[0]["function"]["arguments"]) == len(args) == 700_029
    assert calls[0]["function"]["arguments"] == args
    assert asm.finish_reason() == "tool_calls" and asm.status() == "ok"


def test_parallel_tool_calls_with_index() -> None:
    asm, _ = run(PARALLEL_TOOL_CALLS)
    assert asm.tool_calls() == PARALLEL_EXPECTED
    assert asm.finish_reason() == "tool_calls"
    msg = asm.result()["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": None, "tool_calls": PARALLEL_EXPECTED}
    assert [json.loads(c["function"]["arguments"]) for c in msg["tool_calls"]] == [
        {"city": "Paris"},
        {"tz": "UTC"},
    ]


def test_parallel_tool_calls_without_index() -> None:
    asm, _ = run(PARALLEL_TOOL_CALLS_NO_INDEX)
    assert asm.tool_calls() == PARALLEL_EXPECTED
    assert asm.finish_reason() == "tool_calls"


def test_missing_index_sequential_calls_are_not_merged() -> None:
    asm = ChatStreamAssembler()
    deltas: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "a", "arguments": '{"x":'}}
            ]
        },
        {"tool_calls": [{"function": {"arguments": "1}"}}]},
        {
            "tool_calls": [
                {"id": "call_2", "type": "function", "function": {"name": "b", "arguments": '{"y":'}}
            ]
        },
        {"tool_calls": [{"function": {"arguments": "2}"}}]},
        # a call id repeated on every fragment must not start a new call
        {"tool_calls": [{"id": "call_2", "function": {"arguments": ""}}]},
        # a complete call in one delta, Gemini-style, with neither index nor a fragment after it
        {"tool_calls": [{"id": "call_3", "type": "function", "function": {"name": "c", "arguments": "{}"}}]},
    ]
    for d in deltas:
        asm.feed_chunk(chunk([{"index": 0, "delta": d, "finish_reason": None}]))
    assert asm.tool_calls() == [
        {"id": "call_1", "type": "function", "function": {"name": "a", "arguments": '{"x":1}'}},
        {"id": "call_2", "type": "function", "function": {"name": "b", "arguments": '{"y":2}'}},
        {"id": "call_3", "type": "function", "function": {"name": "c", "arguments": "{}"}},
    ]


def test_repeated_name_is_not_concatenated() -> None:
    asm = ChatStreamAssembler()
    for frag in ['{"a":', " 1, ", '"b": 2}']:
        tc = {
            "index": 0,
            "id": "call_x",
            "type": "function",
            "function": {"name": "add_two_numbers", "arguments": frag},
        }
        asm.feed_chunk(chunk([{"index": 0, "delta": {"tool_calls": [tc]}, "finish_reason": None}]))
    assert asm.tool_calls() == [
        {
            "id": "call_x",
            "type": "function",
            "function": {"name": "add_two_numbers", "arguments": '{"a": 1, "b": 2}'},
        }
    ]


def test_reused_index_with_a_new_id_is_a_new_call() -> None:
    asm = ChatStreamAssembler()
    for cid, name in [("call_1", "a"), ("call_2", "b")]:
        tc = {"index": 0, "id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}
        asm.feed_chunk(chunk([{"index": 0, "delta": {"tool_calls": [tc]}, "finish_reason": None}]))
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in asm.tool_calls()] == [
        ("call_1", "a", "{}"),
        ("call_2", "b", "{}"),
    ]


def test_reasoning_both_names_null_deltas_and_token_ids() -> None:
    asm, _ = run(REASONING_VARIANTS)
    assert asm.reasoning() == "2+2 is four."
    assert asm.content() == "4"
    assert asm.finish_reason() == "stop"
    result = asm.result()
    assert result["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": "4", "reasoning_content": "2+2 is four."},
        "finish_reason": "stop",
        "logprobs": None,
        "token_ids": [17],
    }
    assert asm.status() == "ok"


def test_same_reasoning_under_both_names_in_one_delta_counts_once() -> None:
    asm = ChatStreamAssembler()
    asm.feed_chunk(chunk([{"index": 0, "delta": {"reasoning": "a", "reasoning_content": "a"}}]))
    asm.feed_chunk(chunk([{"index": 0, "delta": {"reasoning": "b"}}]))
    assert asm.reasoning() == "ab"


def test_vendor_token_ids_and_prompt_token_ids() -> None:
    asm = ChatStreamAssembler()
    asm.feed_chunk(
        chunk([{"index": 0, "delta": {"content": "x"}, "token_ids": [1, 2]}], prompt_token_ids=[9, 8])
    )
    asm.feed_chunk(chunk([{"index": 0, "delta": {"content": "y"}, "token_ids": [3]}], prompt_token_ids=[7]))
    r = asm.result()
    assert r["prompt_token_ids"] == [9, 8]
    assert r["choices"][0]["token_ids"] == [1, 2, 3]
    assert r["choices"][0]["message"]["content"] == "xy"


def test_non_stream_reasoning_helpers() -> None:
    resp = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "4", "reasoning": "2+2 is four."}}
        ]
    }
    assert message_of(resp) == {"role": "assistant", "content": "4", "reasoning": "2+2 is four."}
    assert reasoning_of(message_of(resp)) == "2+2 is four."
    assert reasoning_of({"reasoning_content": "r1", "reasoning": "r2"}) == "r1"
    assert reasoning_of({"content": "x"}) is None


def test_usage_recorded_from_usage_only_chunk() -> None:
    pieces = [
        b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":null}\n\n',
        b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}\n\n',
        b"data: [DONE]\n\n",
    ]
    asm, _ = run(pieces)
    assert asm.usage == {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
    assert asm.result()["usage"] == {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
    assert asm.content() == "ok"


def test_no_usage_is_none_not_zero() -> None:
    asm, _ = run(COMMENTS_AND_KEEPALIVES)
    assert asm.usage is None
    assert asm.result()["usage"] is None


def test_zero_usage_on_content_chunk_and_last_non_null_wins_never_summed() -> None:
    zero = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    pieces = [
        b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}\n\n',
        b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}\n\n',
        b"data: [DONE]\n\n",
    ]
    asm, _ = run(pieces)
    assert asm.usage == zero
    assert asm.content() == "ab"
    # a later real usage object replaces (never adds to) the earlier ones; a null does not erase it
    asm = ChatStreamAssembler()
    asm.feed_chunk(
        chunk(
            [{"index": 0, "delta": {"content": "a"}}],
            usage={"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
        )
    )
    asm.feed_chunk(
        chunk(
            [{"index": 0, "delta": {"content": "b"}}],
            usage={"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
        )
    )
    asm.feed_chunk(chunk([], usage=None))
    assert asm.usage == {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}


def test_error_object_in_200_stream() -> None:
    asm, _ = run(ERROR_IN_200_STREAM)
    assert asm.status() == "error"
    assert asm.error == {"message": "maximum context length exceeded", "type": "BadRequestError", "code": 400}
    assert asm.saw_done
    assert asm.content() is None
    assert asm.result()["choices"] == []


def test_vllm_object_error_shape() -> None:
    asm = ChatStreamAssembler()
    asm.feed_chunk(
        {"object": "error", "message": "boom", "type": "InternalServerError", "param": None, "code": 500}
    )
    assert asm.status() == "error"
    assert asm.error == {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}


def test_eof_without_done_or_finish_reason_is_truncated() -> None:
    asm, _ = run(EOF_WITHOUT_DONE)
    assert asm.status() == "truncated"
    assert asm.content() == "partial"
    assert not asm.saw_done and asm.error is None
    assert asm.finish_reason() is None


def test_only_done_is_ok_but_empty() -> None:
    asm, n = run(ONLY_DONE)
    assert n == 1
    assert asm.status() == "ok"
    assert asm.chunk_count == 0
    assert asm.result() == {
        "id": None,
        "object": "chat.completion",
        "created": None,
        "model": None,
        "choices": [],
        "usage": None,
    }


def test_finish_reason_without_done_is_ok() -> None:
    asm = ChatStreamAssembler()
    asm.feed_chunk(chunk([{"index": 0, "delta": {"content": "x"}, "finish_reason": "length"}]))
    assert asm.status() == "ok" and not asm.saw_done
    assert asm.finish_reason() == "length"


def test_several_choices_logprobs_and_vendor_extras() -> None:
    asm = ChatStreamAssembler()
    lp = lambda tok: {"content": [{"token": tok, "logprob": -0.5, "bytes": None, "top_logprobs": []}]}  # noqa: E731
    asm.feed_chunk(
        chunk(
            [
                {
                    "index": 1,
                    "delta": {"role": "assistant", "content": "B"},
                    "logprobs": lp("B"),
                    "finish_reason": None,
                },
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": "A"},
                    "logprobs": lp("A"),
                    "finish_reason": None,
                },
            ],
            system_fingerprint="fp_1",
        )
    )
    asm.feed_chunk(
        chunk(
            [
                {
                    "index": 0,
                    "delta": {"content": "a"},
                    "logprobs": lp("a"),
                    "finish_reason": "stop",
                    "stop_reason": None,
                },
                {"index": 1, "delta": {"content": "b"}, "logprobs": None, "finish_reason": "length"},
            ],
            system_fingerprint="fp_2",
            service_tier="default",
        )
    )
    asm.feed_chunk(
        chunk(
            [], system_fingerprint=None, usage={"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        )
    )
    r = asm.result()
    assert r["system_fingerprint"] == "fp_2"
    assert r["service_tier"] == "default"
    assert r["created"] == 1
    assert [c["index"] for c in r["choices"]] == [0, 1]
    assert asm.content(0) == "Aa" and asm.content(1) == "Bb"
    assert asm.finish_reason(0) == "stop" and asm.finish_reason(1) == "length"
    assert [t["token"] for t in r["choices"][0]["logprobs"]["content"]] == ["A", "a"]
    assert [t["token"] for t in r["choices"][1]["logprobs"]["content"]] == ["B"]
    assert "stop_reason" not in r["choices"][0]
    assert r["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert asm.content(5) is None and asm.tool_calls(5) == [] and asm.finish_reason(5) is None


def test_role_defaults_and_empty_content_string() -> None:
    asm = ChatStreamAssembler()
    asm.feed_chunk(chunk([{"index": 0, "delta": {"role": None, "content": ""}, "finish_reason": None}]))
    asm.feed_chunk(chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    msg = message_of(asm.result())
    assert msg == {"role": "assistant", "content": ""}


def test_feed_data_and_invalid_chunks() -> None:
    asm = ChatStreamAssembler()
    asm.feed_data('{"id":"c1","choices":[{"index":0,"delta":{"content":"x"}}]}')
    asm.feed_data("not json")
    asm.feed_data("[1, 2]")
    asm.feed_data("[DONE]")
    assert asm.content() == "x"
    assert asm.invalid_count == 2
    assert asm.chunk_count == 2
    assert asm.saw_done and asm.status() == "ok"


def test_message_of_and_usage_of() -> None:
    resp = {
        "id": "c1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }
    assert message_of(resp) == {"role": "assistant", "content": "hi"}
    assert usage_of(resp) == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert message_of({"choices": []}) == {}
    assert message_of({"error": {"message": "x"}}) == {}
    assert message_of(None) == {}
    assert message_of({"choices": [{"index": 0}]}) == {}
    assert usage_of({"usage": None}) is None
    assert usage_of([]) is None


def test_top_level_fields_last_non_empty_value() -> None:
    asm = ChatStreamAssembler()
    asm.feed_chunk({"id": "", "object": "", "created": 0, "model": "", "choices": []})
    assert (asm.result()["id"], asm.result()["created"], asm.result()["model"]) == ("", 0, "")
    asm.feed_chunk(
        chunk([{"index": 0, "delta": {"content": "x"}}], id="c9", created=1700000000, model="qwen")
    )
    asm.feed_chunk({"id": "", "created": 0, "model": "", "choices": [], "usage": None})
    r = asm.result()
    assert (r["id"], r["object"], r["created"], r["model"]) == ("c9", "chat.completion", 1700000000, "qwen")


def test_every_fault_stream_assembles_the_same_byte_by_byte() -> None:
    for pieces in CHAT_FAULT_STREAMS:
        whole, _ = run(pieces)
        stream = b"".join(pieces)
        split, _ = run([stream[i : i + 1] for i in range(len(stream))])
        assert split.result() == whole.result()
        assert (split.status(), split.saw_done, split.error) == (whole.status(), whole.saw_done, whole.error)
