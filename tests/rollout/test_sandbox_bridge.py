"""The gateway bridge on its own: a real Unix socket, a real HTTP server behind it (the fake
upstream standing in for the gateway), real clients. Requests under the session's prefix are
relayed (keep-alive, chunked bodies, streamed answers, the Host header rewritten); anything else is
refused with a 403 and never reaches the server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from rollout.sandbox.bridge import BridgeError, GatewayBridge, gateway_address, refusal
from tests.fake_upstream import DONE, FakeUpstream, Reply, chat_chunk

PREFIX = "/v1/sessions/s1"


@pytest.mark.parametrize(
    "target, why",
    [
        (b"/v1/sessions/s1", None),
        (b"/v1/sessions/s1/chat/completions", None),
        (b"/v1/sessions/s1/v1/messages?beta=true", None),
        (
            b"/v1/chat/completions",
            "only this session's URL (/v1/sessions/s1/...) is reachable from the sandbox, "
            "not '/v1/chat/completions'",
        ),
        (
            b"/v1/sessions/s12/chat/completions",
            "only this session's URL (/v1/sessions/s1/...) is reachable from the "
            "sandbox, not '/v1/sessions/s12/chat/completions'",
        ),
        (
            b"/v1/sessions/s1/../s2/chat/completions",
            "request path '/v1/sessions/s1/../s2/chat/completions' is not a plain path",
        ),
        (b"/v1/sessions/s1/%2e%2e/s2", "request path '/v1/sessions/s1/%2e%2e/s2' is not a plain path"),
        (b"/v1/sessions/s1//x", "request path '/v1/sessions/s1//x' is not a plain path"),
        (b"/v1/sessions/s1/close", "the launcher closes the session; a runtime cannot"),
        (
            b"/metrics",
            "only this session's URL (/v1/sessions/s1/...) is reachable from the sandbox, not '/metrics'",
        ),
    ],
)
def test_refusal(target: bytes, why: str | None) -> None:
    assert refusal(target, PREFIX) == why


CLOSE_REFUSED = "the launcher closes the session; a runtime cannot"
# spellings of the session's close (and of other sessions) that a server may route where the bridge refuses
SNEAKY_TARGETS = [
    (b"/v1/sessions/s1/close#x", "request path '/v1/sessions/s1/close#x' is not a plain path"),
    (
        b"/v1/sessions/s1/close?x=1#y",
        "request target '/v1/sessions/s1/close?x=1#y' has a fragment or a byte no URL holds",
    ),
    (
        b"/v1/sessions/s1/chat/completions#/../close",
        "request path '/v1/sessions/s1/chat/completions#/../close' is not a plain path",
    ),
    (b"/v1/sessions/s1%2Fclose", "request path '/v1/sessions/s1%2Fclose' is not a plain path"),
    (b"/v1/sessions/s1/clos%65", "request path '/v1/sessions/s1/clos%65' is not a plain path"),
    (b"/v1/sessions/s1/close%23x", "request path '/v1/sessions/s1/close%23x' is not a plain path"),
    (b"/v1/sessions/s1/x/../close", "request path '/v1/sessions/s1/x/../close' is not a plain path"),
    (b"/v1/sessions/s1//close", "request path '/v1/sessions/s1//close' is not a plain path"),
    (b"/v1/sessions/s1\\close", "request path '/v1/sessions/s1\\\\close' is not a plain path"),
    (b"/v1/sessions/s1/close?reason=x", CLOSE_REFUSED),
    (b"/v1/sessions/s1/close/", CLOSE_REFUSED),
    (b"/v1/sessions/s1/close.", CLOSE_REFUSED),
    (b"/v1/sessions/s1/close..", CLOSE_REFUSED),
    (b"/v1/sessions/s1/close;x", CLOSE_REFUSED),
    (b"/v1/sessions/s1/CLOSE", CLOSE_REFUSED),
    (b"/v1/sessions/s1/Close/", CLOSE_REFUSED),
    (
        b"http://127.0.0.1:8000/v1/sessions/s1/close",
        "request path 'http://127.0.0.1:8000/v1/sessions/s1/close' is not a plain path",
    ),
    (
        b"/V1/SESSIONS/s1/close",
        "only this session's URL (/v1/sessions/s1/...) is reachable from the sandbox, not "
        "'/V1/SESSIONS/s1/close'",
    ),
]


@pytest.mark.parametrize("target, why", SNEAKY_TARGETS)
def test_refusal_of_sneaky_targets(target: bytes, why: str) -> None:
    assert refusal(target, PREFIX) == why


def test_refusal_keeps_ordinary_queries() -> None:
    assert refusal(b"/v1/sessions/s1/v1/messages?beta=true&after=a%2Fb", PREFIX) is None
    assert refusal(b"/v1/sessions/s1/closed/x", PREFIX) is None  # only the close route itself
    assert refusal(b"/v1/sessions/s1/close\xc2\xa0", PREFIX) == (
        "request path '/v1/sessions/s1/close\u00c2\\xa0' is not a plain path"
    )  # non-ASCII


async def test_bridge_never_relays_a_sneaky_close(tmp_path: Path) -> None:
    """Over the socket, each spelling is a 403 and nothing reaches the server."""
    sock = tmp_path / "gw.sock"
    async with (
        FakeUpstream() as up,
        GatewayBridge(sock, f"{up.base_url.removesuffix('/v1')}{PREFIX}") as bridge,
    ):
        for target, _ in SNEAKY_TARGETS:
            reader, writer = await asyncio.open_unix_connection(str(sock))
            writer.write(
                b"POST " + target + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 2\r\n\r\n{}"
            )
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), timeout=30)
            writer.close()
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 403 "), (target, answer)
            assert json.loads(body)["error"]["code"] == "sandbox_forbidden"
        assert bridge.refused == len(SNEAKY_TARGETS)
    assert up.requests == []


def test_gateway_address() -> None:
    assert gateway_address("http://127.0.0.1:8000/v1/sessions/s1") == ("127.0.0.1", 8000, False, PREFIX)
    assert gateway_address("https://gw.example/base/v1/sessions/s1/") == (
        "gw.example",
        443,
        True,
        "/base/v1/sessions/s1",
    )
    with pytest.raises(BridgeError, match="need http"):
        gateway_address("unix:///x")


async def test_bridge_relays_session_requests_and_refuses_the_rest(tmp_path: Path) -> None:
    sock = tmp_path / "gw.sock"
    async with FakeUpstream() as up:
        up.script(
            f"{PREFIX}/chat/completions",
            [
                Reply.json({"n": 1}),
                Reply.sse([chat_chunk("Hi"), chat_chunk(" there"), DONE]),
                Reply.json({"n": 3}),
            ],
        )
        origin = up.base_url.removesuffix("/v1")
        async with GatewayBridge(sock, f"{origin}{PREFIX}") as bridge:
            transport = httpx.AsyncHTTPTransport(uds=str(sock))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:41800") as client:
                first = await client.post(f"{PREFIX}/chat/completions", json={"a": 1})
                async with client.stream("POST", f"{PREFIX}/chat/completions", json={"stream": True}) as r:
                    streamed = b"".join([chunk async for chunk in r.aiter_raw()])

                async def chunked_body():  # type: ignore[no-untyped-def]
                    yield b'{"parts": '
                    yield b'"two"}'

                third = await client.post(f"{PREFIX}/chat/completions", content=chunked_body())
                refused = await client.post("/v1/chat/completions", json={"sneaky": True})
            assert bridge.refused == 1
    assert (first.status_code, first.json()) == (200, {"n": 1})
    assert b'"content":"Hi"' in streamed.replace(b": ", b":") and streamed.rstrip().endswith(b"data: [DONE]")
    assert (third.status_code, third.json()) == (200, {"n": 3})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "sandbox_forbidden"
    # what reached the server: the three session calls, on one connection, with bodies intact
    assert [r.path for r in up.requests] == [f"{PREFIX}/chat/completions"] * 3
    assert [r.json for r in up.requests] == [{"a": 1}, {"stream": True}, {"parts": "two"}]
    assert up.requests[0].headers["host"] == origin.removeprefix("http://")
    assert up.connections_opened == 1
    assert not sock.exists()


async def test_bridge_answers_malformed_requests_with_400(tmp_path: Path) -> None:
    sock = tmp_path / "gw.sock"
    async with FakeUpstream() as up, GatewayBridge(sock, f"{up.base_url.removesuffix('/v1')}{PREFIX}"):
        reader, writer = await asyncio.open_unix_connection(str(sock))
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=30)
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert json.loads(body)["error"]["code"] == "bad_request"
    assert up.requests == []


async def test_bridge_relays_an_http10_request_without_host(tmp_path: Path) -> None:
    sock = tmp_path / "gw.sock"
    async with FakeUpstream() as up:
        up.script(PREFIX, [Reply.json({"n": 1})])
        async with GatewayBridge(sock, f"{up.base_url.removesuffix('/v1')}{PREFIX}"):
            reader, writer = await asyncio.open_unix_connection(str(sock))
            writer.write(f"GET {PREFIX} HTTP/1.0\r\n\r\n".encode())
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), timeout=30)
            writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), answer
    assert json.loads(body) == {"n": 1}
    assert [r.path for r in up.requests] == [PREFIX]
    assert up.requests[0].headers["host"] == up.base_url.removeprefix("http://").removesuffix("/v1")


async def test_a_connection_cut_by_the_bridge_closing_logs_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A session that ends (its timeout) while a call waits for the gateway: the bridge closes,
    cancelling the relay; Python 3.11's stream server must not log the cancelled handler as an
    ``Exception in callback`` traceback."""
    accepted = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await reader.read()  # never answers
        writer.close()

    gateway = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = gateway.sockets[0].getsockname()[1]
    sock = tmp_path / "b.sock"
    try:
        async with GatewayBridge(sock, f"http://127.0.0.1:{port}{PREFIX}"):
            reader, writer = await asyncio.open_unix_connection(str(sock))
            writer.write(
                f"POST {PREFIX}/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{{}}".encode()
            )
            await writer.drain()
            writer.write_eof()  # the client sent its call and waits for the answer
            await asyncio.wait_for(accepted.wait(), 30)
        await asyncio.sleep(0)  # the stream server's done-callbacks run
        await asyncio.sleep(0)
        writer.close()
    finally:
        gateway.close()
        await gateway.wait_closed()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio" and r.levelname == "ERROR"] == []
