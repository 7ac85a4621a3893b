"""What the network helper costs per sandbox start: forked (a child per start) vs gated (the helper
starts the command itself, as root), in one run.

    python benchmarks/netns_start_bench.py [--starts 200] [--rounds 4] [--quick] [--json PATH]

Each start goes through ``rollout.sandbox.netns.NetnsMaker.spawn`` as a session's sandbox does
(its network namespace made, a socket listening there, the command started with the session's
pipes and limits and waited for), the command being ``/bin/true`` instead of bwrap. CPU is read
from a ``cpuacct`` cgroup holding this process, the helper and everything it starts, minus this
process's own CPU: the helper's side per start, ``/bin/true``'s exec included (the same in both).
Rounds alternate the variants; needs root (the gated path) and cgroup v1 ``cpuacct``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable

import _bench

from rollout.sandbox.netns import NetnsMaker
from rollout.sandbox.runner import sandbox_support


async def _start(maker: NetnsMaker, gated: bool) -> None:
    pipes = [os.pipe() for _ in range(5)]  # stdin, stdout, stderr, status, environment
    os.close(pipes[4][1])
    theirs = [pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1], pipes[4][0]]
    try:
        spawned = await maker.spawn(
            ["/bin/true"], theirs, {"core": 0, "fsize": 1 << 30}, [], "/", gated=gated
        )
    finally:
        for fd in theirs:
            os.close(fd)
    try:
        status = await spawned.ended()
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"/bin/true ended with wait status {status}")
    finally:
        spawned.close()
        for fd in (pipes[0][1], pipes[1][0], pipes[2][0], pipes[3][0]):
            os.close(fd)


async def _round(usage: Callable[[], float], gated: bool, n: int) -> float:
    """CPU milliseconds per start of the helper and what it started, over ``n`` starts."""
    maker = NetnsMaker(41800)
    try:
        await _start(maker, gated)  # the helper is up
        u0, c0 = usage(), time.process_time()
        for _ in range(n):
            await _start(maker, gated)
        u1, c1 = usage(), time.process_time()
    finally:
        maker.close()
    return ((u1 - u0) - (c1 - c0)) / n * 1000


def main() -> int:
    ap = _bench.parser(__doc__, quick={"starts": 50, "rounds": 2})
    ap.add_argument("--starts", type=int, default=200, help="starts per round and variant")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    report = _bench.Report("netns_start_bench", args)
    sandbox_support()  # the open-files limit, as the launcher has it
    with _bench.cpuacct_group("netns-start-bench") as usage:
        if usage is None:
            print("netns_start_bench: needs root and a cgroup v1 cpuacct hierarchy", file=sys.stderr)
            return 1
        got: dict[str, list[float]] = {"forked": [], "gated": []}
        for _ in range(args.rounds):
            for kind in got:
                got[kind].append(asyncio.run(_round(usage, kind == "gated", args.starts)))
    table = _bench.Table(
        f"CPU per start, {args.starts} starts x {args.rounds} rounds each (alternating)",
        ["variant", ("median ms", ".2f"), ("all rounds ms", ""), ("vs forked", ".2f")],
    )
    med = {k: _bench.median(v) for k, v in got.items()}
    for k, v in got.items():
        table.add(k, med[k], " ".join(f"{x:.2f}" for x in v), _bench.ratio(med[k], med["forked"]))
    report.table(table)
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
