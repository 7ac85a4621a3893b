"""What grading costs per session: in the grader sandbox next to in the launcher, in one run.

    python benchmarks/grading_bench.py [--sessions 256] [--pool-size 32] [--rounds 2] [--quick] [--json PATH]

Each session is a bundled workspace task's final workspace (its ``files/`` plus a correct
``outputs/answer.json``) graded by the bundled workspace evaluator through ``rollout.grading.Grader``
(workspace copy, evaluator, clean-up), ``--pool-size`` at a time, as the scheduler grades. For each
isolation (``none``: a thread of the launcher; ``bwrap``: the grader sandbox, each evaluation forked
by the fork server; ``bwrap/helpers``: the same with the server forking a helper per evaluation, as
without root; ``bwrap/exec``: the same sandbox starting an interpreter) it prints the wall time per
session at that concurrency (job wall time / sessions, the launcher's view), the launcher's own CPU
per session and, as root with a cgroup v1 ``cpuacct`` hierarchy, the CPU of everything (the
launcher, the fork server, the sandboxes) per session; then what the sandbox adds, against the 50 ms budget per session.
Then the bundled Harbor tasks (``env/harbor_tasks``), solved by their ``solution/solve.sh``, verified
by ``rollout.grading.verifier.run_verifier`` (their ``tests/test.sh`` in a verifier sandbox) at the
same concurrency: the verifier's wall time per session. Last, a control grading (what failure
attribution adds when a grading fails, ``rollout.grading.attribution``: the task's untouched files
copied into a fresh folder and graded in the grader sandbox, at most once per case and job) at the
same concurrency, next to a normal grading in the sandbox.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import _bench

from rollout.contract.protocol import EvalRequest, EvalSpec, Trajectory
from rollout.core.envs import Case
from rollout.grading.attribution import Controls
from rollout.grading.grader import Grader
from rollout.grading.verifier import run_verifier

REPO = Path(__file__).resolve().parents[1]
EVALUATOR = REPO / "env" / "workspace" / "rule_evaluator.py"
BUDGET_MS = 50.0


def workspaces(tmp: Path, n: int) -> list[tuple[Path, dict[str, object]]]:
    """``n`` final workspaces, round robin over the bundled workspace tasks, each with its expected answer."""
    tasks = sorted(p for p in (REPO / "env" / "workspace" / "tasks").iterdir() if p.is_dir())
    out = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        ws = tmp / f"ws{i}"
        shutil.copytree(task / "files", ws) if (task / "files").is_dir() else ws.mkdir()
        expected = json.loads((task / "expected.json").read_text())
        (ws / "outputs").mkdir(exist_ok=True)
        (ws / "outputs" / "answer.json").write_text(json.dumps(expected))
        out.append((ws, expected))
    return out


FORK_SERVER: dict[str, bool | Literal["helpers"]] = {"": True, "helpers": "helpers", "exec": False}


async def grade_all(
    isolation: str,
    items: list[tuple[Path, dict[str, object]]],
    pool: int,
    tmp: Path,
    usage: Callable[[], float] | None,
) -> tuple[float, float, int, float | None]:
    """(wall s, launcher CPU s, sessions scored 10, CPU s of everything: None when unknown) for
    grading every item ``pool`` at a time."""
    gate = asyncio.Semaphore(pool)
    spec = EvalSpec(eval_id="workspace/rule", timeout_s=60.0, evaluator_path=str(EVALUATOR))
    mode, _, how = isolation.partition("/")
    async with Grader(mode, work_dir=tmp, fork_server=FORK_SERVER[how]) as grader:  # type: ignore[arg-type]
        await grader.start([EVALUATOR.parent.parent])

        async def one(i: int, ws: Path, expected: dict[str, object]) -> float | None:
            req = EvalRequest(
                job_id="bench",
                session_id=f"s{i}",
                env_name="workspace",
                case_id=str(i),
                group_id="g",
                sample_index=0,
                model="m",
                env_params={"dataset": {"expected": expected}},
            )
            async with gate:
                out = await grader.evaluate(EVALUATOR, req, spec, Trajectory(session_id=f"s{i}"), ws)
            return out.score

        await one(-1, *items[0])  # the fork server is up
        u0 = usage() if usage else None
        with _bench.timed() as t:
            scores = await asyncio.gather(*(one(i, ws, exp) for i, (ws, exp) in enumerate(items)))
        total = usage() - u0 if usage and u0 is not None else None
        return t.wall_s, t.cpu_s, sum(1 for s in scores if s == 10.0), total


async def control_all(n: int, pool: int, tmp: Path) -> tuple[float, int]:
    """(wall s, controls graded) for ``n`` control gradings (each a case of its own: no sharing),
    ``pool`` at a time, in the grader sandbox."""
    tasks = sorted(p for p in (REPO / "env" / "workspace" / "tasks").iterdir() if p.is_dir())
    spec = EvalSpec(eval_id="workspace/rule", timeout_s=60.0, evaluator_path=str(EVALUATOR))
    gate = asyncio.Semaphore(pool)
    controls = Controls(tmp)
    async with Grader("bwrap", work_dir=tmp) as grader:
        await grader.start([EVALUATOR.parent.parent])

        async def one(i: int) -> str:
            task = tasks[i % len(tasks)]
            expected = json.loads((task / "expected.json").read_text())
            files = task / "files"
            case = Case(
                env_name="workspace",
                case_id=f"{task.name}-{i}",
                row={"expected": expected},
                files_dir=str(files) if files.is_dir() else None,
            )
            req = EvalRequest(
                job_id="bench",
                session_id=f"c{i}",
                env_name="workspace",
                case_id=case.case_id,
                group_id="g",
                sample_index=0,
                model="m",
                env_params={"dataset": case.row},
            )

            async def grade(ws: Path) -> object:
                return await grader.evaluate(EVALUATOR, req, spec, Trajectory(session_id=f"c{i}"), ws)

            async with gate:
                return (await controls.control(case, grade)).evaluation.status  # type: ignore[arg-type]

        with _bench.timed() as t:
            statuses = await asyncio.gather(*(one(i) for i in range(n)))
    return t.wall_s, sum(1 for s in statuses if s == "scored")


async def verify_all(n: int, pool: int, tmp: Path) -> tuple[float, int]:
    """(wall s, sessions rewarded 1) for verifying ``n`` solved Harbor workspaces ``pool`` at a time."""
    tasks = sorted(p for p in (REPO / "env" / "harbor_tasks" / "tasks").iterdir() if p.is_dir())
    solved = []
    for task in tasks:
        ws = tmp / f"solved-{task.name}"
        shutil.copytree(task / "environment", ws) if (task / "environment").is_dir() else ws.mkdir()
        subprocess.run(["bash", str(task / "solution" / "solve.sh")], cwd=ws, check=True, capture_output=True)
        solved.append((ws, task / "tests"))
    gate = asyncio.Semaphore(pool)

    async def one(i: int) -> float | None:
        ws, tests = solved[i % len(solved)]
        async with gate:
            return (await run_verifier(ws, tests, timeout_s=120.0, label=f"bench-{i}")).reward

    with _bench.timed() as t:
        rewards = await asyncio.gather(*(one(i) for i in range(n)))
    return t.wall_s, sum(1 for r in rewards if r == 1.0)


async def main() -> int:
    ap = _bench.parser(__doc__, quick={"sessions": 16, "pool_size": 4, "rounds": 1})
    ap.add_argument("--sessions", type=int, default=256)
    ap.add_argument("--pool-size", type=int, default=32)
    ap.add_argument(
        "--rounds", type=int, default=2, help="alternating rounds per isolation; the best is kept"
    )
    args = ap.parse_args()
    report = _bench.Report("grading_bench", args)
    with (
        tempfile.TemporaryDirectory(prefix="grading-bench-") as d,
        _bench.cpuacct_group("grading-bench") as usage,
    ):
        tmp = Path(d)
        items = workspaces(tmp, args.sessions)
        best: dict[str, tuple[float, float, int, float | None]] = {}
        for _ in range(args.rounds):
            for isolation in ("none", "bwrap", "bwrap/helpers", "bwrap/exec"):
                got = await grade_all(isolation, items, args.pool_size, tmp, usage)
                if isolation not in best or got[0] < best[isolation][0]:
                    best[isolation] = got
        n = args.sessions
        n_verify = max(1, n // 4)
        wall, rewarded = await verify_all(n_verify, args.pool_size, tmp)
        control_wall, controls_scored = await control_all(n, args.pool_size, tmp)
    table = _bench.Table(
        f"grading per session at pool {args.pool_size} (best of {args.rounds} rounds)",
        [
            "grading",
            "sessions",
            ("wall ms/session", ".1f"),
            ("launcher CPU ms/session", ".1f"),
            ("all CPU ms/session", ".1f"),
            "passed",
            ("vs in-process", ".2f"),
        ],
    )
    none_ms = best["none"][0] / n * 1000
    labels = {
        "none": "in-process (none)",
        "bwrap": "grader sandbox (bwrap, fork server)",
        "bwrap/helpers": "grader sandbox, fork server with a helper each",
        "bwrap/exec": "grader sandbox, an interpreter each",
    }
    for isolation, (w, cpu, passed, total) in best.items():
        table.add(
            labels[isolation],
            n,
            w / n * 1000,
            cpu / n * 1000,
            None if total is None else total / n * 1000,
            passed,
            _bench.ratio(w / n * 1000, none_ms),
        )
    table.add(
        "Harbor verifier (test.sh)",
        n_verify,
        wall / n_verify * 1000,
        None,
        None,
        rewarded,
        _bench.ratio(wall / n_verify * 1000, none_ms),
    )
    bwrap_ms = best["bwrap"][0] / n * 1000
    table.add(
        "control grading (bwrap, untouched files)",
        n,
        control_wall / n * 1000,
        None,
        None,
        controls_scored,
        _bench.ratio(control_wall / n * 1000, none_ms),
    )
    report.table(table)
    report.value("control_vs_grading", control_wall / n * 1000 / bwrap_ms)
    report.line(
        f"a control grading costs {control_wall / n * 1000:.1f} ms against {bwrap_ms:.1f} ms for a normal "
        f"grading in the sandbox ({control_wall / n * 1000 / bwrap_ms:.2f}x); it runs only after a grading "
        "failure, once per case and job"
    )
    added = (best["bwrap"][0] - best["none"][0]) / n * 1000
    report.value("sandbox_added_ms", added)
    report.line(
        f"the grader sandbox adds {added:.1f} ms of wall time per session; budget {BUDGET_MS:.0f} ms: "
        f"{'PASS' if added <= BUDGET_MS else 'OVER'}"
    )
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
