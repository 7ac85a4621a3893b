"""What keeping a session's final workspace costs, and how fast a job is regraded from the store.

    python benchmarks/regrade_bench.py [--rounds 50] [--sessions 400] [--quick] [--json PATH]

1. For each bundled workspace task: a workspace made as the scheduler makes it (the task's
   ``files/`` copied in) plus an ``outputs/answer.json``; then, ``--rounds`` times each, the copy
   itself (the reference: what every session already pays), ``build_archive`` (walk, tar, gzip),
   storing the row (``Store.save_workspace_archive``) and ``restore_workspace``. Also one 4 MiB
   workspace (half text, half random bytes). Prints ms per session and archive/copy ratios.
2. A stored job of ``--sessions`` gsm8k sessions (store API, one recorded step each, kept
   workspaces) regraded with the bundled gsm8k evaluator by ``regrade_job``: sessions per second.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _bench

REPO = Path(__file__).resolve().parents[1]

from rollout.core.envs import WorkspaceArchiveConfig, load_cases, load_env_config  # noqa: E402
from rollout.jobs.regrade import RegradeOptions, regrade_job  # noqa: E402
from rollout.jobs.workspace_archive import build_archive, keep_workspace, restore_workspace  # noqa: E402
from store import JobEnvironment, SessionWorkspace, Store, step_record  # noqa: E402
from store.session_result import SessionResult  # noqa: E402


async def archive_costs(rounds: int, tmp: Path, report: _bench.Report) -> None:
    store = Store(f"sqlite:///{tmp / 'archive.db'}")
    await store.init()
    cfg = WorkspaceArchiveConfig()
    workspaces: list[tuple[str, Path]] = []
    for task in sorted((REPO / "env" / "workspace" / "tasks").iterdir()):
        workspaces.append((task.name, task / "files"))
    big = tmp / "big-src"
    big.mkdir()
    (big / "text.log").write_text("2024-01-01 sshd[1]: Failed password for root from 10.0.0.1\n" * 35_000)
    (big / "random.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    workspaces.append(("4 MiB workspace", big))
    table = _bench.Table(
        f"keeping a final workspace, median of {rounds} sessions each",
        [
            "workspace",
            ("files KB", ".1f"),
            ("copy ms", ".2f"),
            ("archive ms", ".2f"),
            ("store ms", ".2f"),
            ("restore ms", ".2f"),
            ("gz KB", ".1f"),
            ("archive/copy", ".2f"),
        ],
    )
    for i, (name, src) in enumerate(workspaces):
        copy_t, arch_t, store_t, rest_t = [], [], [], []
        size = gz = 0
        for r in range(rounds):
            ws = tmp / f"ws-{i}-{r}"
            t0 = time.perf_counter()
            ws.mkdir()
            shutil.copytree(src, ws, dirs_exist_ok=True)
            copy_t.append(time.perf_counter() - t0)
            (ws / "outputs").mkdir()
            (ws / "outputs" / "answer.json").write_text(json.dumps({"answer": 42}))
            t0 = time.perf_counter()
            kept = build_archive(ws, cfg)
            arch_t.append(time.perf_counter() - t0)
            assert kept.status == "kept" and kept.archive is not None, kept.reason
            t0 = time.perf_counter()
            await store.save_workspace_archive(
                SessionWorkspace(
                    session_id=f"s-{i}-{r}", job_id="bench", env_name="workspace", **kept.columns()
                )
            )
            store_t.append(time.perf_counter() - t0)
            dest = tmp / f"restored-{i}-{r}"
            dest.mkdir()
            t0 = time.perf_counter()
            restore_workspace(kept.archive, None, dest)
            rest_t.append(time.perf_counter() - t0)
            size, gz = kept.total_bytes, len(kept.archive)
            shutil.rmtree(ws)
            shutil.rmtree(dest)
        table.add(
            name,
            size / 1024,
            _bench.ms(copy_t),
            _bench.ms(arch_t),
            _bench.ms(store_t),
            _bench.ms(rest_t),
            gz / 1024,
            _bench.ratio(_bench.ms(arch_t), _bench.ms(copy_t)),
        )
    await store.close()
    report.table(table)


async def regrade_speed(n: int, tmp: Path, report: _bench.Report) -> None:
    cfg = load_env_config(REPO / "env" / "gsm8k" / "env.yaml")
    cases = load_cases(cfg)
    db = f"sqlite:///{tmp / 'regrade.db'}"
    store = Store(db)
    await store.init()
    rows = [
        JobEnvironment(
            session_id=f"s{i}",
            job_id="bench",
            env_name="gsm8k",
            case_id=cases[i % len(cases)].case_id,
            llm_model="m",
            group_id=f"g{i % len(cases)}",
            sample_index=i // len(cases),
            env_params={**cfg.params, "dataset": cases[i % len(cases)].row},
        )
        for i in range(n)
    ]
    await store.add_job_sessions(rows)
    steps = []
    for i, r in enumerate(rows):
        final = cases[i % len(cases)].row["answer"].split("####")[-1].strip() if i % 2 else "I do not know"
        steps.append(
            step_record(
                session_id=r.session_id,
                seq=1,
                step_id=1,
                llm_model="m",
                endpoint="chat.completions",
                response={
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": final},
                        }
                    ]
                },
            )
        )
    await store.write_batch(steps, [])
    empty = tmp / "empty-ws"
    empty.mkdir()
    for r in rows:
        await store.finish_job_session(
            r.session_id,
            SessionResult(
                reward=0.0,
                evaluation={"status": "scored", "score": 0.0},
                status="succeeded",
                eval_status="scored",
                runtime_result={"session_id": r.session_id, "status": "succeeded"},
            ),
        )
        await keep_workspace(store, r, WorkspaceArchiveConfig(), empty)
    await store.close()
    t0 = time.perf_counter()
    result = await regrade_job(
        RegradeOptions(job_id="bench", db_path=db, agent_root=REPO / "env", out=tmp / "regrade.jsonl")
    )
    elapsed = time.perf_counter() - t0
    passed = sum(1 for r in result.regraded if r.after_score == 10.0)
    report.value("regrade_sessions_per_s", n / elapsed)
    report.line(
        f"\nregrade of {n} gsm8k sessions: {elapsed:.2f} s, {n / elapsed:.0f} sessions/s "
        f"({len(result.regraded)} regraded, {passed} now score 10, {len(result.not_regraded)} not regraded)"
    )


async def main() -> int:
    ap = _bench.parser(__doc__, quick={"rounds": 3, "sessions": 20})
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--sessions", type=int, default=400)
    args = ap.parse_args()
    report = _bench.Report("regrade_bench", args)
    with tempfile.TemporaryDirectory(prefix="regrade-bench-") as d:
        await archive_costs(args.rounds, Path(d), report)
        await regrade_speed(args.sessions, Path(d), report)
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
