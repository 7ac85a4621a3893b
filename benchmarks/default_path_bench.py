"""The default path's speed as three ratios, in one run: the sandboxed launcher against bare bwrap.

    python benchmarks/default_path_bench.py [--sessions 1000] [--pool-size 32] [--rounds 3]
                                            [--image-sessions 20] [--image REF] [--before DIR] [--quick] [--json PATH]

The runtime is launcher_bench's: it reads its start request and prints a result (no model call).
Each round runs, one after the other (so machine noise hits them alike), and the medians over
``--rounds`` are compared:

- ``bare bwrap``: the runtime spawned ``--sessions`` times, ``--pool-size`` at once, each by a
  plain ``bwrap`` (new namespaces, the host's ``/`` read-only, its own ``/tmp``, ``/proc`` and
  ``/dev``): the floor of a sandboxed session;
- ``launcher, in-process grading``: a whole launcher job of ``--sessions`` sessions in a child
  process (gateway, SQLite, every session in the runtime sandbox, closed, graded, kept, written
  back), ``--sandbox bwrap --grader-isolation none``;
- ``launcher, grader sandbox``: the same with ``--grader-isolation bwrap`` (the default).

Ratio 1 and 2: each launcher variant's median over bare bwrap's (targets 1.5x and 2x). With
``--before DIR`` (another tree, e.g. ``git archive <commit> | tar -x -C DIR``) each round also runs
both launcher variants of that tree, so that before and after are compared in one run. Ratio 3:
a session's start in a cached image (``--image``, the stand-in scripts/build_base_images.sh
builds) against a host-toolchain session, ``--image-sessions`` each, alternately, median per
session (target 1.5x): the image looked up and its workspace seeded as the scheduler does each
attempt, then ``run_runtime`` in the image, vs ``run_runtime`` alone; skipped with the reason when
the image tools or the image are missing. Results: benchmarks/README.md.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _bench
import launcher_bench
import yaml

from rollout.contract.protocol import SimulationStartRequest
from rollout.core.envs import Case, load_env_config
from rollout.sandbox.images import (
    ImageError,
    at_workdir,
    in_store,
    missing_tools,
    resolve,
    seed_workspace,
    source_for,
)
from rollout.sandbox.runner import run_runtime, sandbox_support

IMAGE = "localhost/rollout-test/python:3"
IMAGE_RUNTIME = (
    "import json, sys; r = json.loads(sys.stdin.readline()); "
    "print(json.dumps({'session_id': r['session_id'], 'status': 'succeeded'}))"
)
TARGETS = {"in-process grading": 1.5, "grader sandbox": 2.0}


def bwrap_argv(bwrap: str, runtime: Path) -> list[str]:
    """A plain bubblewrap around the runtime: what a sandboxed session cannot cost less than."""
    return [
        bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--tmpfs",
        "/tmp",
        "--ro-bind",
        str(runtime),
        str(runtime),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--",
        sys.executable,
        str(runtime),
    ]


async def bare_bwrap(n: int, pool: int, argv: list[str]) -> float:
    """Wall seconds to run ``argv`` ``n`` times, ``pool`` at once, each fed a start request."""
    sem = asyncio.Semaphore(pool)

    async def one(i: int) -> None:
        async with sem:
            req = json.dumps({"session_id": f"s{i}"}).encode() + b"\n"
            p = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            out, err = await p.communicate(req)
            if p.returncode != 0 or json.loads(out.splitlines()[-1])["status"] != "succeeded":
                raise SystemExit(f"bare bwrap failed ({p.returncode}): {err.decode()[-2000:]}")

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - t0


def image_skip(ref: str) -> str | None:
    """Why the image ratio cannot be measured here (None: it can)."""
    missing = missing_tools()
    if missing:
        return f"image tools missing: {', '.join(missing)} (docs/images.md)"
    if not in_store(ref):
        return f"{ref} is not in the local container store: run scripts/build_base_images.sh"
    return None


async def image_starts(n: int, ref: str, tmp: Path) -> dict[str, list[float]]:
    """Seconds per session start, ``host`` and ``image`` alternately, ``n`` each after one warm-up."""
    envs = {}
    for kind in ("host", "image"):
        d = tmp / f"img-{kind}"
        (d / "data").mkdir(parents=True)
        (d / "data" / "cases.jsonl").write_text('{"id": "0"}\n')
        (d / "env.yaml").write_text(
            yaml.safe_dump(
                {
                    "name": f"img-{kind}",
                    "dataset": {"path": "data/cases.jsonl"},
                    **({"image": ref} if kind == "image" else {}),
                    "runtime": {"command": ["python3", "-c", IMAGE_RUNTIME], "timeout_s": 60},
                }
            )
        )
        envs[kind] = load_env_config(d / "env.yaml")
    case = Case(env_name="img", case_id="0", row={"id": "0"})
    source = source_for(envs["image"], case)
    assert source is not None
    await asyncio.to_thread(resolve, source)  # unpacked once: the cache is warm after

    async def one(kind: str, i: int) -> float:
        cfg, ws = envs[kind], tmp / f"ws-{kind}-{i}"
        ws.mkdir()
        req = SimulationStartRequest(
            job_id="bench",
            session_id=f"{kind}{i}",
            agent_name="b",
            agent_id="b",
            group_id="g",
            gateway_base_url=f"http://127.0.0.1:9/v1/sessions/{kind}{i}",
            model="m",
        )
        t0 = time.perf_counter()
        image = None
        source = source_for(cfg, case)
        if source is not None:  # as the scheduler starts each attempt in an image
            image = at_workdir(await asyncio.to_thread(resolve, source), cfg)
            await asyncio.to_thread(seed_workspace, image, ws)
        out = await run_runtime(cfg, req, ws, {}, image=image)
        dt = time.perf_counter() - t0
        if out.status != "succeeded":
            raise SystemExit(f"{kind} session failed: {out.error_text} {out.stderr_tail}")
        shutil.rmtree(ws, ignore_errors=True)
        return dt

    return await _bench.alternate(n, ("host", "image"), one, warmup=1)


def main() -> int:
    ap = _bench.parser(__doc__, quick={"sessions": 100, "pool_size": 8, "rounds": 2, "image_sessions": 5})
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--pool-size", type=int, default=32)
    ap.add_argument(
        "--rounds", type=int, default=3, help="rounds of the three job variants; medians compared"
    )
    ap.add_argument("--image-sessions", type=int, default=20, help="0: no image ratio")
    ap.add_argument(
        "--image", default=IMAGE, help="a cached image (default: the stand-in of build_base_images.sh)"
    )
    ap.add_argument("--before", type=Path, help="also run the launcher of this tree in every round")
    args = ap.parse_args()
    report = _bench.Report("default_path_bench", args)
    n, pool = args.sessions, args.pool_size
    support = sandbox_support()
    tmp = Path(tempfile.mkdtemp(prefix="default-path-bench-"))
    try:
        runtime = tmp / "runtime.py"
        runtime.write_text(launcher_bench.RUNTIME)
        argv = bwrap_argv(support.bwrap, runtime)
        report.line(
            f"{n} sessions at pool {pool}, {args.rounds} rounds; runtime: reads its request, prints a result"
        )
        trees = {
            "": launcher_bench.REPO,
            **({f" ({args.before})": args.before.resolve()} if args.before else {}),
        }
        got: dict[str, list[float]] = {"bare bwrap": []}
        for _ in range(args.rounds):
            got["bare bwrap"].append(asyncio.run(bare_bwrap(n, pool, argv)))
            for suffix, src in trees.items():
                launcher_bench.SRC = src
                for label, isolation in (("in-process grading", "none"), ("grader sandbox", "bwrap")):
                    res = launcher_bench.run_child(n, pool, sandbox="bwrap", grader_isolation=isolation)
                    got.setdefault(label + suffix, []).append(res["seconds"])
        floor = statistics.median(got["bare bwrap"])
        table = _bench.Table(
            f"{n} sessions at pool {pool}: median of {args.rounds} rounds",
            [
                "run",
                ("median s", ".2f"),
                "all rounds s",
                ("ms/session", ".2f"),
                ("vs bare bwrap", ".2f"),
                "target",
            ],
        )
        table.add(
            "bare bwrap spawn",
            floor,
            " ".join(f"{s:.2f}" for s in got["bare bwrap"]),
            1000 * floor / n,
            1.0,
            None,
        )
        for label, target in ((label + suffix, t) for suffix in trees for label, t in TARGETS.items()):
            med = statistics.median(got[label])
            ratio = med / floor
            report.value(f"ratio {label}", ratio)
            table.add(
                f"launcher, {label}",
                med,
                " ".join(f"{s:.2f}" for s in got[label]),
                1000 * med / n,
                ratio,
                f"<= {target}x: {'PASS' if ratio <= target else 'FAIL'}",
            )
        report.table(table)
        skip = image_skip(args.image) if args.image_sessions else "--image-sessions 0"
        if skip is not None:
            report.line(f"image ratio: skipped: {skip}")
        else:
            try:
                starts = asyncio.run(image_starts(args.image_sessions, args.image, tmp))
            except ImageError as e:
                report.line(f"image ratio: skipped: {e}")
            else:
                host, image = _bench.ms(starts["host"]), _bench.ms(starts["image"])
                ratio = image / host
                report.value("ratio image start", ratio)
                t = _bench.Table(
                    f"session start, {args.image_sessions} each alternately (ms)",
                    ["session", ("median", ".1f"), ("p90", ".1f"), ("vs host", ".2f"), "target"],
                )
                t.add("host toolchain", host, _bench.ms(starts["host"], 90), 1.0, None)
                t.add(
                    f"cached image {args.image}",
                    image,
                    _bench.ms(starts["image"], 90),
                    ratio,
                    f"<= 1.5x: {'PASS' if ratio <= 1.5 else 'FAIL'}",
                )
                report.table(t)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
