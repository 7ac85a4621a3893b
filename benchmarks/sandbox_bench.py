"""Per-session start-up cost of the runtime sandbox, beside a bare subprocess start, in one run.

    python benchmarks/sandbox_bench.py [--sessions 40]

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

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from rollout.contract.protocol import SimulationStartRequest
from rollout.core.envs import EnvConfig, load_env_config
from rollout.sandbox.runner import run_runtime, sandbox_support

RUNTIME = ("import json, sys; r = json.loads(sys.stdin.read()); "
           "print(json.dumps({'session_id': r['session_id'], 'status': 'succeeded'}))")

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
    (d / "env.yaml").write_text(yaml.safe_dump({
        "name": name, "dataset": {"path": "data/cases.jsonl"},
        "runtime": {"command": ["{python}", "-c", code], "timeout_s": 60, "sandbox": mode, "env": extra or {}}}))
    return load_env_config(d / "env.yaml")


def _request(sid: str, gateway: str) -> SimulationStartRequest:
    return SimulationStartRequest(job_id="bench", session_id=sid, agent_name="bench", agent_id="b", group_id="g",
                                  gateway_base_url=f"{gateway}/v1/sessions/{sid}", model="m")


async def _ping_server() -> tuple[asyncio.AbstractServer, str]:
    body = b"ok"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (await reader.readuntil(b"\r\n\r\n")):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n" + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def _ms(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs) * 1000, xs[int(0.9 * (len(xs) - 1))] * 1000


async def main(sessions: int, requests: int) -> int:
    support = sandbox_support()
    print(f"bubblewrap {support.bwrap}; limits: {support.mechanisms()}")
    server, gateway = await _ping_server()
    with tempfile.TemporaryDirectory(prefix="sandbox-bench-") as tmp:
        root = Path(tmp)
        envs = {m: _env(root, f"start-{m}", m, RUNTIME) for m in ("none", "bwrap")}
        sdk = {m: _env(root, f"sdk-{m}", m, SDK_RUNTIME) for m in ("none", "bwrap")}
        http = {m: _env(root, f"http-{m}", m, HTTP_RUNTIME, {"BENCH_REQUESTS": str(requests)})
                for m in ("none", "bwrap")}
        times: dict[str, list[float]] = {"none": [], "bwrap": []}
        rtt: dict[str, list[float]] = {"none": [], "bwrap": []}
        for i in range(sessions + 2):  # the first two of each are warm-up
            for mode in ("none", "bwrap"):
                ws = root / f"ws-{mode}-{i}"
                ws.mkdir()
                t0 = time.perf_counter()
                out = await run_runtime(envs[mode], _request(f"s{i}", gateway), ws, {})
                dt = time.perf_counter() - t0
                if out.status != "succeeded":
                    print(f"session failed ({mode}): {out.error_text}", file=sys.stderr)
                    return 1
                if i >= 2:
                    times[mode].append(dt)
        sdk_times: dict[str, list[float]] = {"none": [], "bwrap": []}
        for i in range(max(3, sessions // 4)):
            for mode in ("none", "bwrap"):
                ws = root / f"sdk-{mode}-{i}"
                ws.mkdir()
                t0 = time.perf_counter()
                out = await run_runtime(sdk[mode], _request(f"k{i}", gateway), ws, {})
                if out.status != "succeeded":
                    print(f"sdk session failed ({mode}): {out.error_text}", file=sys.stderr)
                    return 1
                sdk_times[mode].append(time.perf_counter() - t0)
        for i in range(max(3, sessions // 4)):
            for mode in ("none", "bwrap"):
                ws = root / f"http-{mode}-{i}"
                ws.mkdir()
                out = await run_runtime(http[mode], _request(f"h{i}", gateway), ws, {})
                if out.status != "succeeded" or out.result is None:
                    print(f"http session failed ({mode}): {out.error_text} {out.stderr_tail}", file=sys.stderr)
                    return 1
                rtt[mode].append(out.result.metrics["s"] / requests)
    server.close()
    bare, boxed = _ms(times["none"]), _ms(times["bwrap"])
    print(f"\nsession start-up + trivial runtime, {sessions} sessions each (ms):")
    print(f"{'':>8} {'median':>8} {'p90':>8}")
    print(f"{'bare':>8} {bare[0]:8.1f} {bare[1]:8.1f}")
    print(f"{'bwrap':>8} {boxed[0]:8.1f} {boxed[1]:8.1f}")
    print(f"sandbox overhead per session: {boxed[0] - bare[0]:.1f} ms (median), ratio bwrap/bare "
          f"{boxed[0] / bare[0]:.2f}x")
    s_bare, s_boxed = _ms(sdk_times["none"]), _ms(sdk_times["bwrap"])
    print(f"the same with `import openai` first (a typical Python runtime), {len(sdk_times['none'])} each: "
          f"bare {s_bare[0]:.1f} ms, bwrap {s_boxed[0]:.1f} ms (+{s_boxed[0] - s_bare[0]:.1f} ms, "
          f"ratio {s_boxed[0] / s_bare[0]:.2f}x)")
    r_bare, r_boxed = _ms(rtt["none"]), _ms(rtt["bwrap"])
    print(f"\nHTTP round trip on a keep-alive connection, {requests} requests per session (ms per request):")
    print(f"  direct {r_bare[0]:.3f}, through forwarder + bridge {r_boxed[0]:.3f} "
          f"(+{r_boxed[0] - r_bare[0]:.3f} ms, ratio {r_boxed[0] / r_bare[0]:.2f}x)")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    sys.exit(asyncio.run(main(args.sessions, args.requests)))
