"""The launcher's own cost per session, beside spawning the same runtime bare, in one run.

    python benchmarks/launcher_bench.py [--sessions 1000] [--pool-size 32] [--memory-sizes 1000 4000] [--memory-cases N]
                                        [--ray-sessions 200] [--ray-pool-size 8] [--profile DIR] [--src DIR]
                                        [--quick] [--json PATH]

The runtime reads its start request and prints a result line (no model call). Measured in turn:
- ``bare``: the runtime spawned ``--sessions`` times, ``--pool-size`` at once (asyncio
  subprocesses, the start request on stdin, the result line read): the floor;
- ``launcher``: a whole job of ``--sessions`` sessions at ``--pool-size`` (``run_job`` in a
  child process: the gateway it starts, SQLite, every session planned, run, closed on the gateway,
  graded by a rule evaluator, written back, the JSONL), ``--sandbox none`` so that both run the
  same process; timed from the first session's start to the job's return;
- peak RSS of that launcher process at each of ``--memory-sizes`` (one child each; with
  ``--memory-cases N`` each size is N cases x size/N samples, so the dataset stays the same);
- with ``--ray-sessions`` > 0: the same job on a local two-node Ray cluster (``--mode ray``)
  against ``--mode local`` at ``--ray-pool-size``: per-session overhead of Ray.
``--profile DIR`` records the launcher child of the main measurement and its gateway with py-spy
(a tool: ``pip install py-spy``) and prints their top functions by own time. Results: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _bench
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

RUNTIME = """import json, sys
r = json.loads(sys.stdin.readline())
print(json.dumps({"session_id": r["session_id"], "status": "succeeded", "metrics": {"ok": 1}}))
"""
EVALUATOR = """def evaluate(request, spec, trajectory):
    return 10 if request.start_result is not None and request.start_result.metrics.get("ok") == 1 else 0
"""


def make_env(root: Path, n: int, resources: dict[str, Any] | None = None) -> Path:
    d = root / "envs" / "bench"
    (d / "data").mkdir(parents=True, exist_ok=True)
    (d / "runtime.py").write_text(RUNTIME)
    (d / "rule_evaluator.py").write_text(EVALUATOR)
    (d / "data" / "cases.jsonl").write_text("".join(json.dumps({"id": f"c{i}"}) + "\n" for i in range(n)))
    runtime: dict[str, Any] = {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 120}
    if resources:
        runtime["resources"] = resources
    (d / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "bench",
                "dataset": {"format": "jsonl", "path": "data/cases.jsonl", "id_field": "id"},
                "runtime": runtime,
                "max_steps": 1,
            }
        )
    )
    (root / "gw.yaml").write_text(
        yaml.safe_dump(
            {
                "storage_config": {"db_url": f"sqlite://{root / 'trajs.db'}"},
                "llm_routes": {"none": {"base_url": "http://127.0.0.1:9/v1"}},
            }
        )
    )  # never called
    return d


async def bare(n: int, pool: int, runtime: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the runtimes) to spawn the runtime ``n`` times, ``pool`` at
    once, each fed a start request."""
    sem = asyncio.Semaphore(pool)

    async def one(i: int) -> None:
        async with sem:
            req = (
                json.dumps(
                    {
                        "session_id": f"s{i}",
                        "gateway_base_url": "http://127.0.0.1:9/v1/sessions/s",
                        "model": "none",
                    }
                ).encode()
                + b"\n"
            )
            p = await asyncio.create_subprocess_exec(
                sys.executable,
                str(runtime),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            out, _ = await p.communicate(req)
            assert p.returncode == 0 and json.loads(out.splitlines()[-1])["status"] == "succeeded", out

    t0, c0 = time.perf_counter(), _bench.cpu_s(resource.RUSAGE_CHILDREN)
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - t0, _bench.cpu_s(resource.RUSAGE_CHILDREN) - c0


def child(args: argparse.Namespace) -> None:
    """One job in this process; prints one JSON line: seconds, sessions, peak RSS."""
    from rollout.jobs.options import JobOptions
    from rollout.jobs.run import run_job

    root = Path(args.root)
    cases = args.cases or args.child  # sessions = cases x samples (rl_group_size)
    make_env(root, cases, {"num_cpus": 1 / 32} if args.mode == "ray" else None)
    opts = JobOptions.model_validate(
        {
            "rl_group_size": args.child // cases,
            "agent_root": root / "envs",
            "gateway_config": root / "gw.yaml",
            "llm_model": "none",
            "db_path": f"sqlite://{root / 'trajs.db'}",
            "enable_evaluation": True,
            "pool_size": args.pool_size,
            "sandbox": args.sandbox,
            "grader_isolation": args.grader_isolation,
            "out": root / "out.jsonl",
            "job_id": f"bench-{args.mode}-{args.child}",
            **({"mode": "ray", "ray_address": args.ray_address} if args.mode == "ray" else {}),
        }
    )
    t: dict[str, float] = {}
    gateway: list[int] = []
    spies: list[subprocess.Popen[bytes]] = []

    def started(job_id: str, n: int) -> None:
        t["start"] = time.perf_counter()
        gateway.extend(_children_running("gateway"))
        t["gw_start"] = sum(_proc_cpu(pid) for pid in gateway)  # its start-up, before any session
        if args.profile_gateway and gateway:  # py-spy on the gateway too: it stops when the gateway exits
            spies.append(
                subprocess.Popen(
                    [
                        _bench.py_spy(),
                        "record",
                        "-r",
                        "200",
                        "--gil",
                        "--nonblocking",
                        "-f",
                        "raw",
                        "-o",
                        args.profile_gateway,
                        "--pid",
                        str(gateway[0]),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def done(record: Any) -> None:
        t["gw_end"] = sum(_proc_cpu(pid) for pid in gateway)  # last reading while it still runs

    result = asyncio.run(run_job(opts, on_start=started, on_done=done))
    seconds = time.perf_counter() - t["start"]
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the check reads anything
    for spy in spies:
        spy.wait(timeout=120)
    cpu_self, cpu_children = _bench.cpu_s(), _bench.cpu_s(resource.RUSAGE_CHILDREN)
    sessions = scored = 0
    with result.out.open() as fh:  # line by line: the check must not hold the records either
        for line in fh:
            r = json.loads(line)
            sessions += 1
            scored += r["eval_status"] == "scored" and r["score"] == 10.0
    print(
        json.dumps(
            {
                "seconds": seconds,
                "sessions": sessions,
                "scored": scored,
                "rss_mib": rss_mib,
                "cpu_self_s": cpu_self,
                "cpu_children_s": cpu_children,
                "gateway_start_s": t.get("gw_start"),
                "gateway_run_s": t.get("gw_end", 0) - t.get("gw_start", 0) if gateway else None,
            }
        )
    )


def _children_running(module: str) -> list[int]:
    """Pids of this process's children started as ``python -m <module>``."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            if (
                d.name.isdigit()
                and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid()
                and module.encode() in (d / "cmdline").read_bytes().split(b"\0")
            ):
                found.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process (0.0 once it is gone)."""
    with contextlib.suppress(OSError):
        return _bench.proc_cpu_s(pid)
    return 0.0


SRC = REPO  # the tree whose launcher is measured (--src)


def run_child(
    n: int,
    pool: int,
    mode: str = "local",
    ray_address: str | None = None,
    profile: Path | None = None,
    cases: int = 0,
    sandbox: str = "none",
    grader_isolation: str | None = None,
) -> dict[str, Any]:
    """One job of ``n`` sessions in a child process: ``cases`` distinct cases (``n`` divisible by
    it) of ``n / cases`` samples each, or one case per session (0); ``sandbox`` and
    ``grader_isolation`` as the job's options."""
    root = Path(tempfile.mkdtemp(prefix="launcher-bench-"))
    cmd = (
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            str(n),
            "--root",
            str(root),
            "--pool-size",
            str(pool),
            "--mode",
            mode,
            "--cases",
            str(cases),
            "--sandbox",
            sandbox,
        ]
        + (["--grader-isolation", grader_isolation] if grader_isolation else [])
        + (["--ray-address", ray_address] if ray_address else [])
    )
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        cmd = [
            _bench.py_spy(),
            "record",
            "-r",
            "200",
            "--gil",
            "--nonblocking",
            "-f",
            "raw",
            "-o",
            str(profile / f"launcher-{mode}-{n}.txt"),
            "--",
            *cmd,
            "--profile-gateway",
            str(profile / f"gateway-{mode}-{n}.txt"),
        ]
    try:
        p = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(SRC)},
            timeout=3600,
        )
        if p.returncode != 0:
            raise SystemExit(f"launcher child failed ({p.returncode}): {p.stderr[-3000:]}")
        res: dict[str, Any] = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if res["sessions"] != n or res["scored"] != n:
        raise SystemExit(
            f"MISMATCH: {n} sessions planned, {res['sessions']} recorded, {res['scored']} graded 10"
        )
    return res


def main() -> None:
    ap = _bench.parser(__doc__, quick={"sessions": 40, "pool_size": 8, "memory_sizes": [40]})
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--pool-size", type=int, default=32)
    ap.add_argument("--memory-sizes", type=int, nargs="*", default=[1000, 4000])
    ap.add_argument(
        "--memory-cases",
        type=int,
        default=0,
        help="distinct cases in the memory runs, each size then being that many cases x "
        "size/cases samples (0: one case per session, so the dataset grows with the size)",
    )
    ap.add_argument("--ray-sessions", type=int, default=0, help="0: no Ray comparison")
    ap.add_argument("--ray-pool-size", type=int, default=8)
    ap.add_argument("--profile", type=Path)
    ap.add_argument(
        "--src",
        type=Path,
        help="measure the launcher of another tree (e.g. a commit's `git archive <commit> | tar -x -C DIR`)",
    )
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="local", help=argparse.SUPPRESS)
    ap.add_argument("--ray-address", help=argparse.SUPPRESS)
    ap.add_argument("--profile-gateway", help=argparse.SUPPRESS)
    ap.add_argument("--cases", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--sandbox", default="none", help=argparse.SUPPRESS)
    ap.add_argument("--grader-isolation", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        return child(args)
    global SRC
    SRC = (args.src or REPO).resolve()
    report = _bench.Report("launcher_bench", args)
    tmp = Path(tempfile.mkdtemp(prefix="launcher-bench-rt-"))
    runtime = tmp / "runtime.py"
    runtime.write_text(RUNTIME)
    n, pool = args.sessions, args.pool_size
    report.line(
        f"{n} sessions, pool {pool}, runtime: python reads its request and prints a result (no model call); "
        f"launcher from {SRC}"
    )
    bare_s, bare_cpu = asyncio.run(bare(n, pool, runtime))
    launched = run_child(n, pool, profile=args.profile)
    bare2_s, bare2_cpu = asyncio.run(bare(n, pool, runtime))  # again after: machine noise hits both alike
    floor, rt_cpu = (bare_s + bare2_s) / 2, (bare_cpu + bare2_cpu) / 2
    gw_cpu = launched["cpu_children_s"] - rt_cpu  # the launcher's children: the gateway and the runtimes
    ratio = launched["seconds"] / floor
    table = _bench.Table(
        f"{n} sessions at pool {pool}: bare spawn (mean of before and after) vs a launcher job",
        ["run", ("seconds", ".2f"), ("ms/session", ".2f"), ("vs bare", ".2f"), ("CPU ms/session", ".1f")],
    )
    table.add(
        f"bare spawn ({bare_s:.2f} s before, {bare2_s:.2f} s after)",
        floor,
        1000 * floor / n,
        1.0,
        1000 * rt_cpu / n,
    )
    table.add(
        "launcher job (recorded, closed, graded)",
        launched["seconds"],
        1000 * launched["seconds"] / n,
        ratio,
        1000 * launched["cpu_self_s"] / n,
    )
    table.add("  its gateway (children minus the runtimes)", None, None, None, 1000 * gw_cpu / n)
    if launched.get("gateway_run_s") is not None:
        table.add(
            f"  its gateway measured (/proc; {launched['gateway_start_s']:.2f} s to start)",
            None,
            None,
            None,
            1000 * launched["gateway_run_s"] / n,
        )
    report.table(table)
    report.value("ratio", ratio)
    report.line(
        f"ratio launcher / bare: {ratio:.2f}x (target <= 1.3x): {'PASS' if ratio <= 1.3 else 'FAIL'}; "
        f"launcher cost {1000 * pool * (launched['seconds'] - floor) / n:.1f} ms of wall time per session "
        f"slot"
    )
    mc = args.memory_cases
    if mc and any(size % mc for size in args.memory_sizes):
        raise SystemExit(f"--memory-cases {mc} must divide every --memory-sizes value")
    memory = _bench.Table(
        "the launcher's peak RSS", ["sessions", "shape", ("peak RSS MiB", ".1f"), ("seconds", ".1f")]
    )
    for size in args.memory_sizes:
        res = launched if size == n and args.profile is None and not mc else run_child(size, pool, cases=mc)
        shape = f"{mc} cases x {size // mc} samples" if mc else f"{size} cases x 1 sample"
        memory.add(size, shape, res["rss_mib"], res["seconds"])
    if args.memory_sizes:
        report.table(memory)
    if args.profile is not None:
        for who in ("launcher", "gateway"):
            raw = args.profile / f"{who}-local-{n}.txt"
            if not raw.exists():
                report.line(f"\n{who}: no profile recorded")
                continue
            report.line(f"\n{who}: top functions by own time (py-spy, {raw}):")
            for f, share in _bench.top_own(raw):
                report.line(f"  {100 * share:5.1f}%  {f}")
    if args.ray_sessions:
        ray_compare(args.ray_sessions, args.ray_pool_size, report)
    shutil.rmtree(tmp, ignore_errors=True)
    report.finish()


def ray_compare(n: int, pool: int, report: _bench.Report) -> None:
    from tests.rollout.ray_cluster import RayCluster

    cluster = RayCluster().start()
    try:
        cluster.add_worker(num_cpus=2)
        local = run_child(n, pool)
        ray = run_child(n, pool, mode="ray", ray_address=cluster.address)
    finally:
        cluster.stop()
    table = _bench.Table(
        f"Ray vs local, {n} sessions at pool {pool} (two-node cluster on this machine)",
        ["mode", ("seconds", ".2f"), ("vs local", ".2f"), ("added ms per session", ".1f")],
    )
    table.add("local", local["seconds"], 1.0, None)
    table.add(
        "ray",
        ray["seconds"],
        _bench.ratio(ray["seconds"], local["seconds"]),
        1000 * pool * (ray["seconds"] - local["seconds"]) / n,
    )
    report.table(table)


if __name__ == "__main__":
    main()
