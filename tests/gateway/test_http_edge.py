"""The gateway's HTTP edge: only its own Host names are answered (DNS rebinding), a connection that
never completes a request head is closed, idle keep-alive connections are closed, and neither cuts
a long call or stream. Real gateway (uvicorn, the config ``python -m gateway`` uses), raw sockets."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.http_edge import HostAllowList, head_timeout_protocol, host_of_url, split_host
from gateway.settings import GatewaySettings
from rollout.jobs.processes import free_port, start_gateway
from rollout.sandbox.bridge import GatewayBridge
from tests.fake_upstream import DONE, FakeUpstream, Reply, chat_chunk, chat_completion
from tests.gateway.conftest import MESSAGES, Gateway, StartGateway, _Server, make_settings

UP_PATH = "/v1/chat/completions"
GENEROUS_S = 30.0  # bound for "the server closed it": far above the 1 s timeouts configured


def _hosts(*values: str) -> list[tuple[bytes, bytes]]:
    return [(b"host", v.encode()) for v in values]


def test_host_allow_list_rules() -> None:
    allowed = HostAllowList.for_server(["0.0.0.0"], ["gw.internal", "lb.example:8000", "10.0.0.5"])
    for ok in (
        "localhost",
        "LOCALHOST:8000",
        "127.0.0.1",
        "127.0.0.1:1",
        "[::1]",
        "[::1]:8000",
        "gw.internal:9",
        "lb.example:8000",
        "10.0.0.5:8000",
    ):
        assert allowed.allows(_hosts(ok)), ok
    for bad in (
        "evil.example",
        "evil.example:8000",
        "0.0.0.0:8000",
        "lb.example:8001",
        "localhost.:80",
        "127.0.0.1:0",
        "127.0.0.1:x",
        "[::1",
        "[::2]",
        "localhost@evil",
        "",
    ):
        assert not allowed.allows(_hosts(bad)), bad
    assert not allowed.allows([])  # no Host
    assert not allowed.allows(_hosts("localhost", "localhost"))  # two
    assert HostAllowList.for_server(["10.1.2.3"]).allows(_hosts("10.1.2.3:8000"))
    assert HostAllowList.for_server(["::"]).entries == ["localhost", "127.0.0.1", "[::1]"]
    assert HostAllowList.for_server(["::1"]).allows(_hosts("[::1]:5"))
    assert HostAllowList(["*"]).allows([]) and HostAllowList(["*"]).allows(_hosts("evil.example"))
    assert split_host("[::1]:80") == ("[::1]", 80) and split_host("fe80::1") == ("[fe80::1]", None)
    assert host_of_url("http://10.0.0.5:8000/v1/sessions") == "10.0.0.5:8000"
    assert host_of_url("https://gw.example/v1/sessions") == "gw.example"
    with pytest.raises(ValueError, match="not a host name"):
        HostAllowList(["a/b"])
    with pytest.raises(ValueError, match="allowed_hosts"):
        GatewaySettings.model_validate({"allowed_hosts": ["http://x/"]})


async def test_a_request_naming_another_host_is_refused_before_anything_is_served(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    await gw.register("s1")
    http = gw.http()
    evil = {"Host": f"rebound.example:{gw.port}"}
    r = await http.post(
        "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES}, headers=evil
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "host_not_allowed" and err["type"] == "invalid_request_error"
    assert "'rebound.example:" in err["message"] and "localhost" in err["message"]
    r = await http.post(
        "/v1/sessions/s1/v1/messages",
        headers=evil,
        json={"model": "m", "max_tokens": 5, "messages": MESSAGES},
    )
    assert r.status_code == 400 and r.json()["type"] == "error"  # Anthropic's shape on its path
    for path in ("/v1/sessions/s1", "/metrics", "/readyz"):
        assert (await http.get(path, headers=evil)).status_code == 400, path
    assert upstream.requests == [] and await gw.steps("s1") == []
    assert await gw.metric("gateway_error_responses_total", status="400", code="host_not_allowed") == 5
    # the gateway's own names, with or without the port
    for host in (f"127.0.0.1:{gw.port}", f"localhost:{gw.port}", "localhost", f"[::1]:{gw.port}"):
        assert (await http.get("/healthz", headers={"Host": host})).status_code == 200, host
    r = await http.post("/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 200 and len(await gw.steps("s1")) == 1


async def test_a_request_without_a_host_is_refused(gw: Gateway) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), GENEROUS_S)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 400") and b"host_not_allowed" in answer


async def test_allowed_hosts_adds_names_and_star_turns_the_check_off(start_gateway: StartGateway) -> None:
    gw = await start_gateway(allowed_hosts=["gw.internal", "lb.example:8000"])
    http = gw.http()
    codes = [
        (await http.get("/healthz", headers={"Host": h})).status_code
        for h in ("gw.internal", f"gw.internal:{gw.port}", "lb.example:8000", "lb.example:8001", "other")
    ]
    assert codes == [200, 200, 200, 400, 400]
    open_gw = await start_gateway(allowed_hosts=["*"])
    assert (await open_gw.http().get("/healthz", headers={"Host": "anything.example"})).status_code == 200


async def test_a_gateway_started_for_an_advertised_url_answers_it_through_the_bridge(
    tmp_path: Path, upstream: FakeUpstream, db_url: str
) -> None:
    """Ray nodes reach the gateway by its advertised URL; their bridges send that URL's Host."""
    upstream.script(UP_PATH, [Reply.json(chat_completion("hi"))])
    port = free_port()
    advertised = f"http://127.0.0.2:{port}/v1/sessions"  # not a loopback *name*: allowed only as advertised
    child = await start_gateway(make_settings(upstream, db_url), tmp_path / "logs", advertise_url=advertised)
    try:
        derived = yaml.safe_load(next((tmp_path / "logs").glob("gateway-*.yaml")).read_text())
        assert derived["allowed_hosts"] == [f"127.0.0.2:{port}"] and derived["listen_host"] == "0.0.0.0"
        async with httpx.AsyncClient(timeout=20) as c:
            assert (await c.get(f"http://127.0.0.2:{port}/healthz")).status_code == 200
            refused = await c.get(f"http://127.0.0.2:{port}/healthz", headers={"Host": f"127.0.0.3:{port}"})
            assert refused.status_code == 400
        sock = tmp_path / "gw.sock"
        async with GatewayBridge(sock, f"{advertised}/s1"):
            transport = httpx.AsyncHTTPTransport(uds=str(sock))
            async with httpx.AsyncClient(
                transport=transport, base_url="http://127.0.0.1:41800", timeout=20
            ) as c:
                r = await c.post(
                    "/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES}
                )
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hi"
    finally:
        child.stop()


def _closed_by_server(sock: socket.socket) -> float:
    """Seconds until the server closes ``sock`` (reads EOF); fails after GENEROUS_S."""
    t0 = time.monotonic()
    sock.settimeout(GENEROUS_S)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {GENEROUS_S} s")
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


async def test_connections_without_a_complete_request_head_are_closed(start_gateway: StartGateway) -> None:
    gw = await start_gateway(request_head_timeout_s=1.0, keep_alive_timeout_s=1)

    def run() -> None:
        silent = socket.create_connection(("127.0.0.1", gw.port))
        half = socket.create_connection(("127.0.0.1", gw.port))
        half.sendall(b"POST /v1/sessions/s1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        dribble = socket.create_connection(("127.0.0.1", gw.port))
        dribble.sendall(b"GET /healthz HTTP/1.1\r\n")  # a byte now and then must not keep it open
        t0 = time.monotonic()
        dribble.settimeout(0.3)
        closed = False
        while not closed and time.monotonic() - t0 < GENEROUS_S:
            try:
                dribble.sendall(b"X-A: b\r\n")
                closed = dribble.recv(1) == b""
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        assert closed, "a dribbled request head kept its connection"
        for s in (silent, half):
            _closed_by_server(s)
            s.close()
        dribble.close()
        # after an answer the connection is idle: closed after keep_alive_timeout_s
        idle = socket.create_connection(("127.0.0.1", gw.port))
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        idle.settimeout(GENEROUS_S)
        assert idle.recv(4096).startswith(b"HTTP/1.1 200")
        _closed_by_server(idle)
        idle.close()

    await asyncio.to_thread(run)


async def test_the_timeouts_never_cut_a_slow_call_or_a_long_stream(
    start_gateway: StartGateway, upstream: FakeUpstream
) -> None:
    gw = await start_gateway(request_head_timeout_s=0.5, keep_alive_timeout_s=1)
    await gw.register("s1", "s2")
    upstream.script(
        UP_PATH,
        [
            Reply.json(chat_completion("slow"), delay_headers_s=2.5),
            Reply.sse([chat_chunk("a"), chat_chunk("b"), DONE], delay_s=[0, 2.5, 0]),
        ],
    )
    http = gw.http()
    r = await http.post("/v1/sessions/s1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "slow"
    async with http.stream(
        "POST", "/v1/sessions/s2/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
    ) as s:
        body = b"".join([c async for c in s.aiter_raw()])
    assert s.status_code == 200 and body.rstrip().endswith(b"data: [DONE]")
    assert [st.status for st in await gw.steps("s1")] == ["ok"]
    assert [st.status for st in await gw.steps("s2")] == ["ok"]


@pytest.mark.parametrize("base", [H11Protocol, HttpToolsProtocol], ids=["h11", "httptools"])
async def test_the_head_deadline_on_both_of_uvicorns_protocols(base: type[asyncio.Protocol]) -> None:
    """Whichever HTTP implementation uvicorn runs: no head within the deadline -> closed; a slow
    answer after a complete head is not cut."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await asyncio.sleep(2.0)  # four deadlines
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(
        app,
        http=head_timeout_protocol(0.5, base),
        host="127.0.0.1",
        port=0,
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=1,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(15):
            while not server.started:
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]

        def run() -> None:
            half = socket.create_connection(("127.0.0.1", port))
            half.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            _closed_by_server(half)
            half.close()
            slow = socket.create_connection(("127.0.0.1", port))
            slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            slow.settimeout(GENEROUS_S)
            answer = b""
            while not answer.endswith(b"ok"):
                chunk = slow.recv(4096)
                assert chunk, f"closed before the answer: {answer!r}"
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200")
            _closed_by_server(slow)  # then idle: keep-alive timeout
            slow.close()

        await asyncio.to_thread(run)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)


def _ask(port: int, raw: bytes) -> bytes:
    """Send ``raw`` on a new connection; what the server answers until it closes (or GENEROUS_S)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(raw)
        s.settimeout(GENEROUS_S)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        return answer


ABSOLUTE = b"GET http://evil.example/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
AUTHORITY = b"CONNECT evil.example:443 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize("base", [H11Protocol, HttpToolsProtocol], ids=["h11", "httptools"])
async def test_a_target_that_is_not_a_path_is_refused_on_both_of_uvicorns_protocols(
    base: type[asyncio.Protocol],
) -> None:
    """A proxy's request (absolute form) or a CONNECT's (authority form): 400 before the app runs,
    whatever the Host; paths and ``OPTIONS *`` reach the app."""
    seen: list[tuple[str, str]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        seen.append((scope["method"], scope["path"]))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(
        app,
        http=head_timeout_protocol(30, base),
        host="127.0.0.1",
        port=0,
        lifespan="off",
        log_level="critical",
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(15):
            while not server.started:
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        refused = await asyncio.to_thread(_ask, port, ABSOLUTE)
        connect = await asyncio.to_thread(_ask, port, AUTHORITY)
        star = await asyncio.to_thread(
            _ask, port, b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)
    # (h11 sends the text chunked, httptools with a length)
    assert refused.startswith(b"HTTP/1.1 400 ")
    assert (
        b"request target 'http://evil.example/healthz' is not a path: this server is not a proxy" in refused
    )
    assert connect.startswith(b"HTTP/1.1 400 ")
    assert b"request target 'evil.example:443' is not a path: this server is not a proxy" in connect
    assert star.startswith(b"HTTP/1.1 200 ")
    assert seen == [("OPTIONS", "*")]


async def test_the_gateway_refuses_a_proxy_request_even_with_any_host_allowed(
    start_gateway: StartGateway,
) -> None:
    for gw in (await start_gateway(), await start_gateway(allowed_hosts=["*"])):
        answer = await asyncio.to_thread(_ask, gw.port, ABSOLUTE)
        assert answer.startswith(b"HTTP/1.1 400 ") and b"this server is not a proxy" in answer, answer
        assert (await gw.http().get("/healthz")).status_code == 200
