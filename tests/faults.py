"""The exact upstream byte lists of the stream quirks real model servers send (OpenAI, Azure, vLLM,
SGLang, llama.cpp), one constant per quirk, named by what it reproduces; shared by the parser,
assembler, fake-upstream and gateway tests.

Each list holds one element per upstream ``write()``, so chunk boundaries are exact (the fake
upstream sends each element as one HTTP chunk).
"""

from __future__ import annotations

import re

__all__ = [
    "EMPTY_CHOICES_CHUNKS",
    "COMMENTS_AND_KEEPALIVES",
    "SPLIT_EVENTS_AND_CRLF",
    "PARALLEL_TOOL_CALLS",
    "PARALLEL_TOOL_CALLS_NO_INDEX",
    "REASONING_VARIANTS",
    "ERROR_IN_200_STREAM",
    "EOF_WITHOUT_DONE",
    "ONLY_DONE",
    "CHAT_FAULT_STREAMS",
    "HTML_502_PAGE",
    "RESPONSES_ARGS_ONLY_IN_DONE",
    "RESPONSES_NO_COMPLETED",
    "without_tool_call_index",
]

# An Azure-style empty-choices first chunk and a usage-only (empty-choices) last chunk.
EMPTY_CHOICES_CHUNKS = [
    b'data: {"id":"","object":"","created":0,"model":"","choices":[],"prompt_filter_results":[{"prompt_index":0}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}\n\n',
    b"data: [DONE]\n\n",
]

# SSE comments, keep-alives, retry-only and data-less blocks between the data events.
COMMENTS_AND_KEEPALIVES = [
    b": connected\n\n",
    b'id: 1\ndata: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"A"},"finish_reason":null}]}\n\n',
    b": ping - 2025-01-01 00:00:00\n\n",
    b"retry: 3000\n\n",
    b"event: message\n\n",
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"B"},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]

# An event split across reads, a CRLF straddling two reads, multi-line data, a split [DONE].
SPLIT_EVENTS_AND_CRLF = [
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hel',
    b'lo"},"finish_reason":null}]}\r',
    b"\n\r\n",
    b'data: {"id":"c1","object":"chat.completion.chunk",\r\n',
    b'data: "choices":[{"index":0,"delta":{"content":" world"},"finish_reason":"stop"}]}\r\n\r\n',
    b"data: [DO",
    b"NE]\n\n",
]

# Two parallel tool calls; id/name only in the first delta, two entries in one delta.
PARALLEL_TOOL_CALLS = [
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}},{"index":0,"function":{"arguments":"{\\"city\\": \\""}}]},"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{\\"tz\\":"}}]},"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"Paris\\"}"}},{"index":1,"function":{"arguments":" \\"UTC\\"}"}}]},"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n',
    b"data: [DONE]\n\n",
]

_TOOL_CALL_INDEX = re.compile(rb'\{"index":\d+,(?="(?:id|function)")')


def without_tool_call_index(chunks: list[bytes]) -> list[bytes]:
    """The same stream with every ``"index":N`` removed from the ``tool_calls`` entries (the
    ``index`` of the ``choices`` entries stays)."""
    return [_TOOL_CALL_INDEX.sub(b"{", c) for c in chunks]


# The same stream with every "index":N removed from the tool_calls entries.
PARALLEL_TOOL_CALLS_NO_INDEX = without_tool_call_index(PARALLEL_TOOL_CALLS)

# A null-everything delta, reasoning under both names, a vendor token_ids field.
REASONING_VARIANTS = [
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":null,"content":null},"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"reasoning":"2+2 is "},"finish_reason":null,"token_ids":[17]}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"reasoning_content":"four."},"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"4","reasoning":null},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]

# An error object inside an HTTP 200 stream, then [DONE].
ERROR_IN_200_STREAM = [
    b'data: {"error":{"message":"maximum context length exceeded","type":"BadRequestError","code":400}}\n\n',
    b"data: [DONE]\n\n",
]

# Two content chunks, then EOF: no finish_reason, no [DONE].
EOF_WITHOUT_DONE = [
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"par"},"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tial"},"finish_reason":null}]}\n\n',
]

# Only [DONE].
ONLY_DONE = [b"data: [DONE]\n\n"]

# A Responses stream whose function call arguments come only in
# response.function_call_arguments.done (no deltas), the final output nested in
# response.completed.response; `event:` lines on every event, and no [DONE].
RESPONSES_ARGS_ONLY_IN_DONE = [
    b'event: response.created\ndata: {"type":"response.created","response":{"id":"r1","status":"in_progress","output":[]}}\n\n',
    b'event: response.output_item.added\ndata: {"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc1","call_id":"call_1","name":"get_weather","arguments":""}}\n\n',
    b'event: response.function_call_arguments.done\ndata: {"type":"response.function_call_arguments.done","item_id":"fc1","output_index":0,"arguments":"{\\"city\\":\\"Paris\\"}"}\n\n',
    b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"r1","status":"completed","output":[{"type":"function_call","id":"fc1","call_id":"call_1","name":"get_weather","arguments":"{\\"city\\":\\"Paris\\"}"}],"usage":{"input_tokens":12,"output_tokens":9,"total_tokens":21}}}\n\n',
]

# The same stream cut before response.completed (the Responses stream has no [DONE], so
# this is a truncation).
RESPONSES_NO_COMPLETED = RESPONSES_ARGS_ONLY_IN_DONE[:3]

# The upstream answers 502 with Content-Type text/html and this body.
HTML_502_PAGE = b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"


CHAT_FAULT_STREAMS: tuple[list[bytes], ...] = (
    EMPTY_CHOICES_CHUNKS,
    COMMENTS_AND_KEEPALIVES,
    SPLIT_EVENTS_AND_CRLF,
    PARALLEL_TOOL_CALLS,
    PARALLEL_TOOL_CALLS_NO_INDEX,
    REASONING_VARIANTS,
    ERROR_IN_200_STREAM,
    EOF_WITHOUT_DONE,
    ONLY_DONE,
)
"""Every chat-completions fault stream above, for tests that must hold on all of them."""
