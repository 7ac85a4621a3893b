"""Gateway overhead benchmark: direct-to-upstream vs through the gateway, in one run.

    python benchmarks/gateway_bench.py [--duration 10] [--concurrency 1 64] [--profile DIR]

Starts a fast fake upstream (nginx answering fixed bodies, ``fake_upstream_fast.py``), the gateway
as a black box (``python -m gateway --config <temp yaml>``: uvicorn, strict telemetry, SQLite in a
temp dir, ``max_steps: -1``) and, for reference, a forwarding-only FastAPI + aiohttp proxy
(``forward_proxy.py``). For each mode (non-stream, stream) and concurrency it measures, with
``wrk``, the same request sent directly to the upstream, through the gateway's session path
``/v1/sessions/<sid>/chat/completions`` (64 session ids, taken round-robin, so that the
per-session lock never serializes the load), and two references: the reference proxy, and the
gateway's own sessionless ``/v1/chat/completions`` (forwarded, not recorded). It prints one table
(requests/s, p50/p99 latency, added p50, ratio, the gateway's CPU use) and checks that every call
the gateway answered 2xx was recorded: ``SELECT count(*) FROM session_steps`` must equal the number
of 2xx answers the load generator received, per run and in total (MISMATCH is printed otherwise
and the exit code is 1).

Load loops are bounded in time (``--duration`` s per cell) and in count (``--max-requests`` per
cell); they only target 127.0.0.1. At the end of a cell no new request is started and the requests
in flight are allowed to finish (so that served and recorded counts can be compared exactly);
requests/s is completed requests / (load window + mean latency), Little's law for that drained tail.

Prerequisites (this script installs nothing): ``apt-get install nginx-light wrk``. Without them it
falls back to a Python aiohttp fake upstream and a Python aiohttp load generator, says so in its
output, and its numbers are then far from the gateway's real limits (the load generator and the
upstream compete with the gateway for the same 2 cores). ``--profile DIR`` needs ``py-spy``
(``pip install py-spy``): it records the gateway under concurrency-64 load (``--profile-mode``,
non-stream by default) and prints where the time goes. ``--gateway-src DIR`` runs the gateway from
another tree (e.g. ``git archive HEAD gateway store | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fake_upstream_fast import (  # a sibling script: benchmarks/ is a folder of scripts, not a package
    CHAT_PATH,
    HOST,
    FakeUpstream,
    free_port,
    nginx_binary,
    start_upstream,
    wait_http,
)

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
MODES = ("non-stream", "stream")
ROUTE = {"non-stream": "bench-plain", "stream": "bench-stream"}
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "What is the capital of France? Reply in one short sentence, please."},
]
TARGET_ADDED_P50_MS = 1.0   # at concurrency 1
TARGET_RPS_C64 = 2000.0     # at concurrency 64


def request_body(mode: str) -> bytes:
    """The chat request sent in ``mode`` (the same bytes directly and through the gateway)."""
    body: dict[str, Any] = {"model": ROUTE[mode], "messages": MESSAGES, "temperature": 0.7, "max_tokens": 64}
    if mode == "stream":
        body["stream"] = True
    return json.dumps(body).encode()


# ---------------------------------------------------------------------------------------------- load

@dataclass
class LoadResult:
    """One measured cell. Latencies in ms; ``rps`` = completed / (window + mean latency)."""

    requests: int = 0        # responses received (any status)
    ok: int = 0              # 2xx (for streams: 2xx that ended with data: [DONE])
    non2xx: int = 0
    bad_stream: int = 0      # 2xx streams without [DONE]
    errors: dict[str, int] = field(default_factory=dict)  # socket errors, timeouts
    window_s: float = 0.0
    mean_ms: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    cpu_pct: float | None = None      # gateway (or proxy) process CPU, % of one core
    host_cpu_pct: float | None = None  # whole machine, % of all cores
    recorded: int | None = None        # session_steps rows added by this cell (gateway only)

    @property
    def served(self) -> int:
        """2xx answers received (streams included whether or not they ended with [DONE])."""
        return self.ok + self.bad_stream

    @property
    def rps(self) -> float:
        return self.requests / (self.window_s + self.mean_ms / 1000) if self.window_s else 0.0

    @property
    def cpu_us_per_req(self) -> float | None:
        if self.cpu_pct is None or not self.requests:
            return None
        return self.cpu_pct / 100 * (self.window_s + self.mean_ms / 1000) / self.requests * 1e6


_WRK_LUA = r"""
-- generated by benchmarks/gateway_bench.py: POST a fixed body, round-robin over session paths,
-- stop starting requests after the deadline or max_requests (requests in flight finish).
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec_t;
int clock_gettime(int clk_id, bench_timespec_t *tp);
]]
local ts = ffi.new("bench_timespec_t")
local function now()
  ffi.C.clock_gettime(1, ts)  -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local threads = {}
local counter = 0
function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

ok, non2xx, bad_stream, sent, t_first, t_stop = 0, 0, 0, 0, 0, 0
local reqs, nreq, idx, deadline, max_requests, is_stream, stopped = {}, 0, 0, 0, 0, false, false

function init(args)
  -- args: window_s max_requests_per_thread stream(0/1) body_file path...
  local window = tonumber(args[1])
  max_requests = tonumber(args[2])
  is_stream = args[3] == "1"
  local f = assert(io.open(args[4], "rb"))
  local body = f:read("*a")
  f:close()
  local headers = {["Content-Type"] = "application/json", ["Accept"] = "*/*"}
  for i = 5, #args do
    table.insert(reqs, wrk.format("POST", args[i], headers, body))
  end
  nreq = #reqs
  idx = tid or 0
  t_first = now()
  deadline = t_first + window
end

function delay()
  if stopped then return 3600000 end
  if sent >= max_requests or now() >= deadline then
    stopped = true
    t_stop = now()
    return 3600000
  end
  return 0
end

function request()
  sent = sent + 1
  idx = idx + 1
  return reqs[(idx % nreq) + 1]
end

function response(status, headers, body)
  if status >= 200 and status < 300 then
    if is_stream and not string.find(body, "data: [DONE]", 1, true) then
      bad_stream = bad_stream + 1
    else
      ok = ok + 1
    end
  else
    non2xx = non2xx + 1
  end
end

function done(summary, latency, requests)
  local o, n, b, s, t0, t1 = 0, 0, 0, 0, 1e18, 0
  for _, t in ipairs(threads) do
    o = o + t:get("ok"); n = n + t:get("non2xx"); b = b + t:get("bad_stream"); s = s + t:get("sent")
    t0 = math.min(t0, t:get("t_first")); t1 = math.max(t1, t:get("t_stop"))
  end
  io.write(string.format('BENCH_JSON {"requests":%d,"ok":%d,"non2xx":%d,"bad_stream":%d,"sent":%d,' ..
    '"window_s":%.6f,"err_connect":%d,"err_read":%d,"err_write":%d,"err_timeout":%d,' ..
    '"mean_us":%.3f,"p50_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, o, n, b, s, t1 - t0, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.timeout, latency.mean, latency:percentile(50),
    latency:percentile(99), latency.max))
end
"""


class Loader:
    """Runs one cell of load: ``wrk`` with the generated Lua script, or the Python fallback."""

    def __init__(self, workdir: Path, kind: str, wrk_threads: int, max_requests: int) -> None:
        self.kind = kind
        self.workdir = workdir
        self.wrk_threads = wrk_threads
        self.max_requests = max_requests
        self.lua = workdir / "bench.lua"
        self.lua.write_text(_WRK_LUA)

    def run(self, base: str, paths: list[str], body: bytes, stream: bool, concurrency: int,
            duration_s: int) -> LoadResult:
        body_file = self.workdir / f"body-{'s' if stream else 'n'}.json"
        body_file.write_bytes(body)
        if self.kind == "python":
            return asyncio.run(_py_load(base, paths, body, stream, concurrency, duration_s, self.max_requests))
        threads = max(1, min(self.wrk_threads, concurrency))
        per_thread_max = -(-self.max_requests // threads)
        cmd = ["wrk", "-t", str(threads), "-c", str(concurrency), "-d", f"{duration_s + 2}s", "--timeout", "10s",
               "-s", str(self.lua), base + paths[0], "--", str(duration_s), str(per_thread_max),
               "1" if stream else "0", str(body_file), *paths]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 60, check=False)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"wrk failed (exit {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
        d = json.loads(line.split(" ", 1)[1])
        errors = {k[4:]: int(d[k]) for k in ("err_connect", "err_read", "err_write", "err_timeout") if d[k]}
        return LoadResult(requests=d["requests"], ok=d["ok"], non2xx=d["non2xx"], bad_stream=d["bad_stream"],
                          errors=errors, window_s=d["window_s"], mean_ms=d["mean_us"] / 1000,
                          p50_ms=d["p50_us"] / 1000, p99_ms=d["p99_us"] / 1000, max_ms=d["max_us"] / 1000)


async def _py_load(base: str, paths: list[str], body: bytes, stream: bool, concurrency: int, duration_s: int,
                   max_requests: int) -> LoadResult:
    """Fallback load generator (aiohttp), same contract as the wrk script: bounded in time and
    count, requests in flight finish after the deadline."""
    import aiohttp

    res = LoadResult()
    lat: list[float] = []
    errors: Counter[str] = Counter()
    started = 0
    t0 = time.perf_counter()
    deadline = t0 + duration_s
    t_stop = t0
    headers = {"Content-Type": "application/json"}

    async def worker(sess: aiohttp.ClientSession, k: int) -> None:
        nonlocal started, t_stop
        i = k
        while True:
            now = time.perf_counter()
            if now >= deadline or started >= max_requests:
                t_stop = max(t_stop, now)
                return
            started += 1
            i += 1
            ts = time.perf_counter()
            try:
                async with sess.post(base + paths[i % len(paths)], data=body, headers=headers) as r:
                    data = await r.read()
                    status = r.status
            except (aiohttp.ClientError, TimeoutError) as e:
                errors[type(e).__name__] += 1
                continue
            lat.append((time.perf_counter() - ts) * 1000)
            res.requests += 1
            if 200 <= status < 300:
                if stream and b"data: [DONE]" not in data:
                    res.bad_stream += 1
                else:
                    res.ok += 1
            else:
                res.non2xx += 1

    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as sess:
        await asyncio.gather(*(worker(sess, k) for k in range(concurrency)))
    lat.sort()
    res.errors = dict(errors)
    res.window_s = t_stop - t0
    if lat:
        res.mean_ms = sum(lat) / len(lat)
        res.p50_ms = lat[int(0.50 * (len(lat) - 1))]
        res.p99_ms = lat[int(0.99 * (len(lat) - 1))]
        res.max_ms = lat[-1]
    return res


# ------------------------------------------------------------------------------------- processes

def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and all its threads (from /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _host_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine (from /proc/stat)."""
    vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = vals[3] + vals[4]
    return float(sum(vals) - idle), float(sum(vals))


class Server:
    """A Python server subprocess (gateway or reference proxy) on a loopback port."""

    def __init__(self, name: str, cmd: list[str], port: int, health: str, log_path: Path,
                 cwd: Path = REPO) -> None:
        self.name = name
        self.port = port
        self.base = f"http://{HOST}:{port}"
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            wait_http(self.base + health, 60, self.proc)
        except RuntimeError as e:
            self.stop()
            raise RuntimeError(f"{name} did not start: {e}\n--- {log_path} ---\n{self.log_tail()}") from e

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, n: int = 4000) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")

    def stop(self) -> None:
        """SIGINT (uvicorn's graceful shutdown: the gateway drains its telemetry queue), then
        SIGKILL after 20 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def gateway_config(port: int, db: Path, up: FakeUpstream, telemetry: str = "strict") -> str:
    """The benchmark's gateway YAML: ``telemetry`` mode (default strict), SQLite at ``db``, unlimited
    steps, two routes."""
    return f"""# generated by benchmarks/gateway_bench.py
listen_host: {HOST}
listen_port: {port}
base_session_path: /v1/sessions
max_steps: -1
storage_type: sqlite
storage_config:
  db_url: sqlite://{db}
default_route: {ROUTE["non-stream"]}
llm_routes:
  {ROUTE["non-stream"]}:
    base_url: {up.plain_base_url}
  {ROUTE["stream"]}:
    base_url: {up.stream_base_url}
telemetry:
  mode: {telemetry}
  batch_max: 256
  queue_max: 10000
request_log:
  enabled: false
log_level: warning
"""


def count_steps(db: Path) -> int:
    """``SELECT count(*) FROM session_steps`` (read-only; the gateway's WAL is visible)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return int(con.execute("SELECT count(*) FROM session_steps").fetchone()[0])
    finally:
        con.close()


def step_status_counts(db: Path) -> dict[str, int]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return {str(s): int(n) for s, n in con.execute("SELECT status, count(*) FROM session_steps GROUP BY status")}
    finally:
        con.close()


# --------------------------------------------------------------------------------------- profile

def _frame_key(frame: str) -> tuple[str, str]:
    """``'func (/full/path/pkg/mod.py:123)'`` -> (``'func (pkg/mod.py)'``, package name)."""
    if " (" not in frame or not frame.endswith(")"):
        return frame, "?"
    func, loc = frame[:-1].split(" (", 1)
    parts = loc.rsplit(":", 1)[0].replace("\\", "/").split("/")
    pyver = [i for i, p in enumerate(parts) if re.fullmatch(r"python3\.\d+", p)]
    if "site-packages" in parts:
        rel = parts[parts.index("site-packages") + 1:]
        pkg = rel[0].removesuffix(".py") if len(rel) > 1 else rel[0].removesuffix(".py")
    elif "gateway" in parts or "store" in parts:
        rel = parts[max(i for i, p in enumerate(parts) if p in ("gateway", "store")):]
        pkg = rel[0]
    elif pyver and len(parts) > pyver[-1] + 1:
        rel = parts[pyver[-1] + 1:]
        pkg = "stdlib " + (rel[0].removesuffix(".py") if len(rel) > 1 else rel[0].removesuffix(".py"))
    else:
        rel = parts[-2:]
        pkg = "native" if not loc.split(":")[0].endswith(".py") else rel[0]
    return f"{func} ({'/'.join(rel)})", pkg


_SUBSYSTEMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (label, substrings of any frame of the sample's stack); first match wins
    ("recording: SQLAlchemy ORM/Core + aiosqlite, main thread (Store.write_batch, session loads)",
     ("/sqlalchemy/", "/aiosqlite/", "TelemetryWriter.", "Store.")),
    ("recording: step rows + session snapshots (SessionStep/GatewaySession objects)",
     ("_Call.step ", "_snapshot ", "SessionManager.", "/sqlmodel/")),
    ("upstream client (aiohttp)", ("/aiohttp/",)),
    ("request body parsing + validation (gateway/wire.py)", ("/gateway/wire.py",)),
    ("metrics (prometheus_client)", ("/prometheus_client/",)),
    ("gateway's own code (gateway/chat.py etc., incl. the json and Response calls it makes)", ("/gateway/",)),
    ("FastAPI / Starlette (routing, middleware, responses)", ("/fastapi/", "/starlette/")),
    ("uvicorn HTTP server (httptools)", ("/uvicorn/",)),
)


_OUTER_FRAMES = ("/gateway/__main__.py", "<frozen runpy>", "/uvicorn/main.py", "/uvicorn/server.py", "/uvicorn/_compat.py",
                 "/asyncio/runners.py", "/uvloop/__init__.py")


def _subsystem(frames: list[str], main_thread: bool) -> str:
    if not main_thread:
        return "SQLite (sqlite3 C code) in aiosqlite's worker thread"
    frames = [f for f in frames if not any(o in f for o in _OUTER_FRAMES)]
    for label, needles in _SUBSYSTEMS:
        if any(n in f for f in frames for n in needles):
            return label
    return "event loop (uvloop C code, asyncio) and other"


def summarize_profile(raw: Path, top: int = 10) -> str:
    """Own-time and inclusive-time tables from py-spy's raw (collapsed stack) output."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    pkg_own: Counter[str] = Counter()
    subsystems: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n_s = line.rpartition(" ")
        if not stack or not n_s.isdigit():
            continue
        n = int(n_s)
        frames = stack.split(";")
        thread = frames[0] if frames and frames[0].startswith(("thread", "process")) else "?"
        if frames and frames[0].startswith("process"):
            frames = frames[1:]
            thread = frames[0] if frames and frames[0].startswith("thread") else thread
        if frames and frames[0].startswith("thread"):
            frames = frames[1:]
        if not frames:
            continue
        total += n
        threads[thread.split(" ")[0] + " " + ("main" if "MainThread" in thread else thread.split(" ", 1)[-1])] += n
        subsystems[_subsystem(frames, "MainThread" in thread or thread == "?")] += n
        key, pkg = _frame_key(frames[-1])
        own[key] += n
        pkg_own[pkg] += n
        for k in {_frame_key(f)[0] for f in frames}:
            incl[k] += n
    if not total:
        return "(no samples)"
    out = [f"samples (active, all threads): {total}"]
    out.append("threads: " + ", ".join(f"{t}: {100 * n / total:.1f}%" for t, n in threads.most_common(5)))
    out.append(f"\ntop {top} functions by own time (leaf Python frame: time in C code is charged to the Python "
               f"function that called it; Runner.run's own time is uvloop's C event loop: libuv, socket reads and "
               f"writes, callback dispatch):")
    for k, n in own.most_common(top):
        out.append(f"  {100 * n / total:5.1f}%  {k}")
    out.append("\ntime by subsystem (whole stack; SQLAlchemy's greenlet stacks have no gateway frame):")
    for k, n in subsystems.most_common():
        out.append(f"  {100 * n / total:5.1f}%  {k}")
    out.append("\nown time by package:")
    for k, n in pkg_own.most_common(14):
        out.append(f"  {100 * n / total:5.1f}%  {k}")
    out.append("\ninclusive time, gateway/ and store/ functions:")
    mine = [(k, n) for k, n in incl.most_common() if "(gateway/" in k or "(store/" in k]
    for k, n in mine[:18]:
        out.append(f"  {100 * n / total:5.1f}%  {k}")
    out.append("\ninclusive time, selected library entry points:")
    wanted = ("write_batch", "flush (sqlalchemy", "commit (sqlalchemy", "_execute_context", "validate_python",
              "model_validate", "model_dump", "loads (stdlib", "dumps (stdlib", "json_dumps", "__call__ (starlette",
              "_request (aiohttp", "serialize_response", "run_endpoint_function", "send (starlette",
              "observe (prometheus", "inc (prometheus", "labels (prometheus")
    for k, n in incl.most_common():
        if any(w in k for w in wanted):
            out.append(f"  {100 * n / total:5.1f}%  {k}")
    return "\n".join(out)


def run_profile(args: argparse.Namespace, gw: Server, loader: Loader, outdir: Path) -> tuple[str, LoadResult]:
    """py-spy records the gateway while load of ``--profile-mode`` at ``--profile-concurrency``
    runs; returns the summary and the load result."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(pyspy).exists():
        return "py-spy not found: pip install py-spy (into the venv running this script)", LoadResult()
    outdir.mkdir(parents=True, exist_ok=True)
    raw = outdir / f"gateway_c{args.profile_concurrency}_{args.profile_mode}.txt"
    dur = args.profile_duration
    rec = subprocess.Popen([pyspy, "record", "--pid", str(gw.pid), "--duration", str(dur + 1), "--rate", "200",
                            "--format", "raw", "--threads", "--nonblocking", "--full-filenames", "--output", str(raw)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.0)
    paths = [f"/v1/sessions/bench-{i:03d}{CHAT_PATH}" for i in range(args.sessions)]
    c0 = _proc_cpu_s(gw.pid)
    res = loader.run(gw.base, paths, request_body(args.profile_mode), args.profile_mode == "stream",
                      args.profile_concurrency, dur)
    res.cpu_pct = 100 * (_proc_cpu_s(gw.pid) - c0) / (res.window_s + res.mean_ms / 1000)
    try:
        out, _ = rec.communicate(timeout=dur + 60)
    except subprocess.TimeoutExpired:
        rec.kill()
        out, _ = rec.communicate()
    if not raw.exists():
        return f"py-spy failed (exit {rec.returncode}): {out[-2000:]}", res
    return summarize_profile(raw, args.profile_top), res


# ----------------------------------------------------------------------------------------- table

def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


@dataclass
class Row:
    """One (mode, concurrency) cell: direct, gateway (session path, recorded) and the references."""

    mode: str
    conc: int
    direct: LoadResult
    gateway: LoadResult
    refs: dict[str, LoadResult] = field(default_factory=dict)


REFERENCES = {
    "proxy": "forwarding-only FastAPI + aiohttp proxy (benchmarks/forward_proxy.py: no parsing, no recording)",
    "passthrough": "the same gateway, sessionless POST /v1/chat/completions (validated, forwarded, NOT recorded)",
}


def print_table(rows: list[Row]) -> None:
    hdr = (f"{'mode':<10} {'conc':>4} | {'direct req/s':>12} {'gateway req/s':>13} {'ratio':>6} | "
           f"{'direct p50/p99 ms':>17} {'gateway p50/p99 ms':>18} {'added p50 ms':>12} | "
           f"{'gw CPU%':>7} {'gw CPU us/req':>13} | {'served 2xx':>10} {'recorded':>8}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        d, g = r.direct, r.gateway
        check = "" if g.recorded == g.served else "  <-- MISMATCH"
        print(f"{r.mode:<10} {r.conc:>4} | {d.rps:>12,.0f} {g.rps:>13,.0f} {g.rps / d.rps if d.rps else 0:>6.3f} | "
              f"{f'{d.p50_ms:.3f} / {d.p99_ms:.3f}':>17} {f'{g.p50_ms:.3f} / {g.p99_ms:.3f}':>18} "
              f"{g.p50_ms - d.p50_ms:>12.3f} | {_f(g.cpu_pct, '.0f'):>7} {_f(g.cpu_us_per_req, ',.0f'):>13} | "
              f"{g.served:>10,} {_f(g.recorded, ',d'):>8}{check}")
    names = [n for n in REFERENCES if any(n in r.refs for r in rows)]
    if not names:
        return
    print()
    print("references, same run (what the gateway's recorded path is compared with):")
    for n in names:
        print(f"  {n}: {REFERENCES[n]}")
    hdr2 = f"{'mode':<10} {'conc':>4}"
    for n in [*names, "gateway"]:
        hdr2 += f" | {n + ' req/s':>17} {'p50/p99 ms':>16} {'CPU us/req':>10}"
    print(hdr2)
    print("-" * len(hdr2))
    for r in rows:
        line = f"{r.mode:<10} {r.conc:>4}"
        for x in [r.refs.get(n) for n in names] + [r.gateway]:
            if x is None:
                line += f" | {'-':>17} {'-':>16} {'-':>10}"
            else:
                line += (f" | {x.rps:>17,.0f} {f'{x.p50_ms:.3f} / {x.p99_ms:.3f}':>16} "
                         f"{_f(x.cpu_us_per_req, ',.0f'):>10}")
        print(line)


# ------------------------------------------------------------------------------------------ main

def prerequisites(force_python: bool) -> tuple[str, str, list[str]]:
    """(upstream kind, load kind, notes)."""
    notes: list[str] = []
    up_kind = "nginx" if nginx_binary() and not force_python else "python"
    load_kind = "wrk" if shutil.which("wrk") and not force_python else "python"
    if not force_python and (up_kind == "python" or load_kind == "python"):
        missing = [n for n, k in (("nginx-light", up_kind), ("wrk", load_kind)) if k == "python"]
        notes.append(f"WARNING: {', '.join(missing)} not installed: falling back to Python "
                     f"({'aiohttp fake upstream' if up_kind == 'python' else ''}"
                     f"{' + ' if len(missing) == 2 else ''}"
                     f"{'aiohttp load generator' if load_kind == 'python' else ''}); these numbers understate "
                     f"the gateway. Install with: apt-get install nginx-light wrk")
    elif force_python:
        notes.append("NOTE: --python-fallback: Python fake upstream and load generator (slow, shares the CPUs)")
    return up_kind, load_kind, notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="gateway overhead benchmark (direct vs gateway, one run)")
    ap.add_argument("--duration", type=int, default=10, help="seconds of load per cell (default %(default)s)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64], help="default: 1 64")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--sessions", type=int, default=64, help="session ids used round-robin (default 64)")
    ap.add_argument("--warmup", type=int, default=2, help="seconds of warm-up load per mode (default 2)")
    ap.add_argument("--max-requests", type=int, default=2_000_000, help="cap on requests per cell")
    ap.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (default 1: leaves a core to the "
                    "gateway)")
    ap.add_argument("--no-proxy", action="store_true", help="skip the forwarding-only proxy reference")
    ap.add_argument("--no-passthrough", action="store_true", help="skip the gateway's sessionless (unrecorded) "
                    "passthrough reference")
    ap.add_argument("--python-fallback", action="store_true", help="use the Python upstream and load generator")
    ap.add_argument("--profile", metavar="DIR", help="also record the gateway with py-spy under c=64 non-stream "
                    "load and print the top functions (raw stacks saved in DIR)")
    ap.add_argument("--profile-duration", type=int, default=10)
    ap.add_argument("--profile-mode", choices=MODES, default="non-stream")
    ap.add_argument("--profile-concurrency", type=int, default=64)
    ap.add_argument("--telemetry", choices=("strict", "best_effort"), default="strict",
                    help="the gateway's telemetry mode (default %(default)s: the targets are for strict)")
    ap.add_argument("--profile-top", type=int, default=10)
    ap.add_argument("--gateway-src", type=Path, default=REPO, metavar="DIR",
                    help="directory holding the gateway/ and store/ packages to run (the working directory of "
                    "`python -m gateway`; default: this repository), e.g. an unpacked `git archive` of a commit")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (db, logs, config)")
    args = ap.parse_args(argv)
    if args.duration < 1 or args.duration > 600 or args.sessions < 1:
        ap.error("--duration must be 1..600 s and --sessions >= 1")
    args.gateway_src = args.gateway_src.resolve()
    if not (args.gateway_src / "gateway" / "__main__.py").is_file():
        ap.error(f"--gateway-src {args.gateway_src} has no gateway/__main__.py")

    up_kind, load_kind, notes = prerequisites(args.python_fallback)
    workdir = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    db = workdir / "bench.db"
    up: FakeUpstream | None = None
    gw: Server | None = None
    proxy: Server | None = None
    total_served = 0
    exit_code = 0
    try:
        up = start_upstream(up_kind)
        loader = Loader(workdir, load_kind, args.wrk_threads, args.max_requests)
        gw_port = free_port()
        cfg = workdir / "gateway.yaml"
        cfg.write_text(gateway_config(gw_port, db, up, args.telemetry))
        gw = Server("gateway", [sys.executable, "-m", "gateway", "--config", str(cfg)], gw_port, "/readyz",
                    workdir / "gateway.log", cwd=args.gateway_src)
        if not args.no_proxy:
            pport = free_port()
            proxy = Server("proxy", [sys.executable, str(HERE / "forward_proxy.py"), "--upstream", up.base,
                                     "--port", str(pport)], pport, "/healthz", workdir / "proxy.log")
        sid_paths = [f"/v1/sessions/bench-{i:03d}{CHAT_PATH}" for i in range(args.sessions)]
        print(f"gateway benchmark (direct = straight to the fake upstream; gateway = session path, {args.telemetry} "
              "telemetry)")
        for n in notes:
            print(n)
        print(f"upstream: {up.kind} (fixed answers) at {up.base}; load: {load_kind}"
              f"{f' ({args.wrk_threads} thread)' if load_kind == 'wrk' else ''}; gateway: python -m gateway "
              f"(uvicorn, 1 process, pid {gw.pid}, "
              f"from {args.gateway_src}), sqlite {db}")
        print(f"{args.duration} s per cell, {args.sessions} session ids round-robin, warm-up {args.warmup} s per "
              f"mode; cpus: {os.cpu_count()}; load average {os.getloadavg()[0]:.2f}")
        print(flush=True)

        def measure(target: str, mode: str, c: int, seconds: int) -> LoadResult:
            nonlocal total_served
            stream = mode == "stream"
            body = request_body(mode)
            if target == "direct":
                base, paths, server = up.base, [(up.stream_base_url if stream else up.plain_base_url)[len(up.base):]
                                                 + CHAT_PATH], None
            elif target == "proxy":
                assert proxy is not None
                base, paths, server = proxy.base, [("/s/v1" if stream else "/n/v1") + CHAT_PATH], proxy
            elif target == "passthrough":
                assert gw is not None
                base, paths, server = gw.base, ["/v1" + CHAT_PATH], gw
            else:
                assert gw is not None
                base, paths, server = gw.base, sid_paths, gw
            before = count_steps(db) if target in ("gateway", "passthrough") else 0
            c0 = _proc_cpu_s(server.pid) if server else 0.0
            h0 = _host_cpu()
            res = loader.run(base, paths, body, stream, c, seconds)
            elapsed = res.window_s + res.mean_ms / 1000
            if server is not None and elapsed > 0:
                res.cpu_pct = 100 * (_proc_cpu_s(server.pid) - c0) / elapsed
            h1 = _host_cpu()
            res.host_cpu_pct = 100 * (h1[0] - h0[0]) / max(1.0, h1[1] - h0[1])
            if target == "gateway":
                res.recorded = count_steps(db) - before
                total_served += res.served
            elif target == "passthrough" and count_steps(db) != before:
                raise RuntimeError("sessionless passthrough calls were recorded: the benchmark's accounting "
                                   "assumes they are not")
            if res.errors or res.non2xx or res.bad_stream:
                print(f"  note: {target} {mode} c={c}: errors={res.errors} non2xx={res.non2xx} "
                      f"streams without [DONE]={res.bad_stream}", flush=True)
            return res

        refs = [n for n, on in (("proxy", proxy is not None), ("passthrough", not args.no_passthrough)) if on]
        for mode in args.modes:  # warm-up: sessions loaded, pools filled, code paths hot
            if args.warmup > 0:
                for target in ("direct", "gateway", *refs):
                    measure(target, mode, 64, args.warmup)

        rows: list[Row] = []
        for mode in args.modes:
            for c in args.concurrency:
                row = Row(mode, c, measure("direct", mode, c, args.duration),
                          measure("gateway", mode, c, args.duration))
                for n in refs:
                    row.refs[n] = measure(n, mode, c, args.duration)
                rows.append(row)
                g = row.gateway
                print(f"  measured {mode} c={c}: direct {row.direct.rps:,.0f} req/s, gateway {g.rps:,.0f} req/s "
                      f"(p50 {g.p50_ms:.3f} ms, host CPU {g.host_cpu_pct:.0f}%)"
                      + "".join(f", {n} {x.rps:,.0f} req/s" for n, x in row.refs.items()), flush=True)

        profile_text = None
        if args.profile:
            profile_text, pres = run_profile(args, gw, loader, Path(args.profile))
            total_served += pres.served

        print()
        print_table(rows)
        print()
        recorded = count_steps(db)
        if recorded == total_served:
            print(f"recorded steps = {recorded:,}, gateway requests served (2xx) = {total_served:,}  (equal: OK)")
        else:
            exit_code = 1
            print("!" * 78)
            print(f"MISMATCH: recorded steps = {recorded:,}, gateway requests served (2xx) = {total_served:,}")
            print(f"step statuses: {step_status_counts(db)}")
            print("!" * 78)
        if any(r.gateway.recorded != r.gateway.served for r in rows):
            exit_code = 1
            print("MISMATCH in at least one cell (see the table)")

        c1 = [(r.mode, r.gateway.p50_ms - r.direct.p50_ms) for r in rows if r.conc == 1]
        c64 = [(r.mode, r.gateway.rps) for r in rows if r.conc == 64]
        if c1:
            ok1 = all(v <= TARGET_ADDED_P50_MS for _, v in c1)
            print(f"target p50 added latency <= {TARGET_ADDED_P50_MS:g} ms at concurrency 1: "
                  + ", ".join(f"{m} {v:.3f} ms" for m, v in c1) + f"  -> {'PASS' if ok1 else 'FAIL'}")
        else:
            print("target p50 added latency at concurrency 1: not measured (add 1 to --concurrency)")
        if c64:
            ok64 = all(v >= TARGET_RPS_C64 for _, v in c64)
            print(f"target >= {TARGET_RPS_C64:,.0f} requests/s at concurrency 64: "
                  + ", ".join(f"{m} {v:,.0f} req/s" for m, v in c64) + f"  -> {'PASS' if ok64 else 'FAIL'}")
        else:
            print("target requests/s at concurrency 64: not measured (add 64 to --concurrency)")
        if load_kind != "wrk" or up.kind != "nginx":
            print("(Python fallback upstream/load generator in use: see the warning above)")
        if profile_text is not None:
            print()
            print(f"py-spy profile of the gateway under c=64 {args.profile_mode} load ({args.profile_duration} s, "
                  f"{pres.rps:,.0f} req/s while sampled, gateway CPU {_f(pres.cpu_pct, '.0f')}%), "
                  f"raw stacks in {args.profile}:")
            print(profile_text)
    finally:
        for s in (proxy, gw):
            if s is not None:
                s.stop()
        if up is not None:
            up.stop()
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
