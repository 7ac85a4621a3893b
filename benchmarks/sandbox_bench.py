"""Per-session start-up cost of the runtime sandbox, beside a bare subprocess start, in one run.

    python benchmarks/sandbox_bench.py [--sessions 40] [--requests 200] [--quick] [--json PATH]

Each session runs the same trivial runtime (``python -c``: read the start request, print a result
line; no imports) through ``rollout.sandbox.runner.run_runtime``, alternating the two ways so machine noise
hits both alike:

- ``bare``: ``sandbox: none``, one subprocess in its own process group (what the launcher did
  before the sandbox);
- ``bwrap``: the default: the session's cgroups, the gateway bridge's Unix socket, bubblewrap
  (new namespaces, the bind mounts), the forwarder inside, then the runtime.

The same with ``import openai`` first (what a typical Python runtime pays anyway). Then a
round trip through the bridge: a runtime sends ``--requests`` HTTP requests on one
keep-alive connection to a tiny HTTP server on the host, directly (bare) or via the in-sandbox
forwarder and the bridge (bwrap). Prints median and p90 per session (ms), the overhead (ms) and
the ratio bwrap / bare.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import _bench
import yaml

from rollout.contract.protocol import SimulationStartRequest
from rollout.core.envs import EnvConfig, load_env_config
from rollout.sandbox.runner import run_runtime, sandbox_support

RUNTIME = (
    "import json, sys; r = json.loads(sys.stdin.read()); "
    "print(json.dumps({'session_id': r['session_id'], 'status': 'succeeded'}))"
)

SDK_RUNTIME = "import openai; " + RUNTIME  # what a typical Python runtime imports first

HTTP_RUNTIME = """
import http.client, json, os, sys, time, urllib.parse
r = json.loads(sys.stdin.read())
u = urllib.parse.urlsplit(r["gateway_base_url"])
c = http.client.HTTPConnection(u.hostname, u.port)
t0 = time.perf_counter()
for _ in range(int(os.environ["BENCH_REQUESTS"])):
    c.request("GET", u.path + "/ping")
    c.getresponse().read()
dt = time.perf_counter() - t0
print(json.dumps({"session_id": r["session_id"], "status": "succeeded", "metrics": {"s": dt}}))
"""


def _env(root: Path, name: str, mode: str, code: str, extra: dict[str, str] | None = None) -> EnvConfig:
    d = root / name
    (d / "data").mkdir(parents=True)
    (d / "data" / "cases.jsonl").write_text('{"id": "0"}\n')
    (d / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": name,
                "dataset": {"path": "data/cases.jsonl"},
                "runtime": {
                    "command": ["{python}", "-c", code],
                    "timeout_s": 60,
                    "sandbox": mode,
                    "env": extra or {},
                },
            }
        )
    )
    return load_env_config(d / "env.yaml")


def _request(sid: str, gateway: str) -> SimulationStartRequest:
    return SimulationStartRequest(
        job_id="bench",
        session_id=sid,
        agent_name="bench",
        agent_id="b",
        group_id="g",
        gateway_base_url=f"{gateway}/v1/sessions/{sid}",
        model="m",
    )


async def _ping_server() -> tuple[asyncio.AbstractServer, str]:
    body = b"ok"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n" + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


class SessionFailed(Exception):
    """A benchmark session did not succeed: the run stops."""


async def main() -> int:
    ap = _bench.parser(__doc__, quick={"sessions": 4, "requests": 20})
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    sessions, requests = args.sessions, args.requests
    report = _bench.Report("sandbox_bench", args)
    support = sandbox_support()
    report.line(f"bubblewrap {support.bwrap}; limits: {support.mechanisms()}")
    server, gateway = await _ping_server()
    modes = ("none", "bwrap")
    try:
        with tempfile.TemporaryDirectory(prefix="sandbox-bench-") as tmp:
            root = Path(tmp)
            envs = {
                "start": {m: _env(root, f"start-{m}", m, RUNTIME) for m in modes},
                "sdk": {m: _env(root, f"sdk-{m}", m, SDK_RUNTIME) for m in modes},
                "http": {
                    m: _env(root, f"http-{m}", m, HTTP_RUNTIME, {"BENCH_REQUESTS": str(requests)})
                    for m in modes
                },
            }

            def runner(kind: str) -> Callable[[str, int], Awaitable[float]]:
                async def one(mode: str, i: int) -> float:
                    ws = root / f"{kind}-{mode}-{i}"
                    ws.mkdir()
                    t0 = time.perf_counter()
                    out = await run_runtime(envs[kind][mode], _request(f"{kind}{i}", gateway), ws, {})
                    dt = time.perf_counter() - t0
                    if out.status != "succeeded" or (kind == "http" and out.result is None):
                        raise SessionFailed(
                            f"{kind} session failed ({mode}): {out.error_text} {out.stderr_tail}"
                        )
                    if kind == "http":
                        assert out.result is not None
                        return float(out.result.metrics["s"]) / requests  # per request, timed inside
                    return dt

                return one

            few = max(3, sessions // 4)
            times = await _bench.alternate(sessions, modes, runner("start"), warmup=2)
            sdk_times = await _bench.alternate(few, modes, runner("sdk"))
            rtt = await _bench.alternate(few, modes, runner("http"))
    except SessionFailed as e:
        print(e, file=sys.stderr)
        return 1
    finally:
        server.close()
    table = _bench.Table(
        "per session (ms; HTTP: per request on one keep-alive connection), bare vs bubblewrap",
        [
            "measure",
            "sessions each",
            ("bare median", ".2f"),
            ("bare p90", ".2f"),
            ("bwrap median", ".2f"),
            ("bwrap p90", ".2f"),
            ("overhead", "+.2f"),
            ("bwrap / bare", ".2f"),
        ],
    )
    for label, got in (
        ("start + trivial runtime", times),
        ("start + `import openai` runtime", sdk_times),
        (f"HTTP request ({requests} per session)", rtt),
    ):
        bare, boxed = _bench.ms(got["none"]), _bench.ms(got["bwrap"])
        table.add(
            label,
            len(got["none"]),
            bare,
            _bench.ms(got["none"], 90),
            boxed,
            _bench.ms(got["bwrap"], 90),
            boxed - bare,
            _bench.ratio(boxed, bare),
        )
    report.table(table)
    report.line("HTTP: directly to the host (bare), through the in-sandbox forwarder and the bridge (bwrap)")
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
