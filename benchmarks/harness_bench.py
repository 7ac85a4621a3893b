"""Per-session cost of running a harness (the in-sandbox wrapper) beside an env runtime, in one run.

    python benchmarks/harness_bench.py [--sessions 30] [--quick] [--json PATH]

Both go through ``rollout.sandbox.runner.run_runtime`` in the bubblewrap sandbox, alternating so machine
noise hits both alike:

- ``runtime``: an env's own runtime (``python -c``: read the start request, print a result line);
- ``runtime+protocol``: the same importing ``rollout.contract.protocol`` first (pydantic: what every
  runtime built on ``env/runtime_kit.py`` pays anyway);
- ``harness``: ``python -m rollout.contract.harness_runtime`` with a tiny harness whose CLI is ``/bin/sh``
  writing ``outputs/answer.json``: the wrapper's own cost (import, ``launch``, files, the CLI's
  start, reading the answer) on top of a runtime's.

Prints median and p90 per session (ms), and the harness's overhead (ms) and ratio against each.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import _bench
import yaml

from rollout.contract.protocol import SimulationStartRequest
from rollout.core.envs import load_env_config
from rollout.sandbox.harness_cache import InstalledHarness, ensure_installed, load_harness
from rollout.sandbox.runner import CODE_ROOT, RuntimeCommand, run_runtime, sandbox_support

RUNTIME = (
    "import json, sys; r = json.loads(sys.stdin.read()); "
    "print(json.dumps({'session_id': r['session_id'], 'status': 'succeeded'}))"
)
PROTOCOL_RUNTIME = "import rollout.contract.protocol; " + RUNTIME
PLUGIN = """
from rollout.contract.harness import Harness, HarnessLaunch

class Echo(Harness):
    name, version = "bench-echo", "1"

    def launch(self, ctx):
        return HarnessLaunch(argv=["/bin/sh", "-c", "mkdir -p outputs && echo '{}' > outputs/answer.json"])

HARNESS = Echo()
"""


def _request(sid: str) -> SimulationStartRequest:
    return SimulationStartRequest(
        job_id="bench",
        session_id=sid,
        agent_name="bench",
        agent_id="b",
        group_id="g",
        gateway_base_url=f"http://127.0.0.1:9/v1/sessions/{sid}",
        model="m",
        env_params={"dataset": {"id": "0", "instruction": "write {}"}},
    )


async def main() -> None:
    ap = _bench.parser(__doc__, quick={"sessions": 3})
    ap.add_argument("--sessions", type=int, default=30, help="sessions of each kind")
    args = ap.parse_args()
    report = _bench.Report("harness_bench", args)
    sandbox_support()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env_dir = root / "envs" / "bench"
        (env_dir / "tasks" / "0").mkdir(parents=True)
        (env_dir / "env.yaml").write_text(
            yaml.safe_dump(
                {
                    "name": "bench",
                    "dataset": {"format": "task_dirs", "path": "tasks"},
                    "runtime": {"command": ["{python}", "-c", RUNTIME], "timeout_s": 60},
                }
            )
        )
        cfg = load_env_config(env_dir / "env.yaml")
        with_protocol = cfg.model_copy(
            update={
                "runtime": cfg.runtime.model_copy(
                    update={
                        "command": ["{python}", "-c", PROTOCOL_RUNTIME],
                        "env": {"PYTHONPATH": str(CODE_ROOT)},
                    }
                )
            }
        )
        (root / "plugin").mkdir()
        (root / "plugin" / "harness.py").write_text(PLUGIN)
        loaded = load_harness(str(root / "plugin"))
        h = InstalledHarness(
            name=loaded.name,
            folder=loaded.folder,
            install_dir=ensure_installed(loaded.harness, root / "cache"),
        )
        command = RuntimeCommand(
            argv=h.argv(), folders=[h.folder, h.install_dir], env={"PYTHONPATH": str(CODE_ROOT)}
        )

        async def one(kind: str, i: int) -> float:
            ws = Path(tempfile.mkdtemp(dir=root))
            t0 = time.perf_counter()
            out = await run_runtime(
                with_protocol if kind == "runtime+protocol" else cfg,
                _request(f"k{i}"),
                ws,
                {},
                command=command if kind == "harness" else None,
            )
            assert out.status == "succeeded", (kind, out.error_text, out.stderr_tail[-500:])
            return time.perf_counter() - t0

        times = await _bench.alternate(args.sessions, ("runtime", "runtime+protocol", "harness"), one)
    med = {k: _bench.ms(v) for k, v in times.items()}
    table = _bench.Table(
        f"per session, bubblewrap sandbox, {args.sessions} sessions of each kind",
        [
            "kind",
            ("median ms", ".1f"),
            ("p90 ms", ".1f"),
            ("harness adds ms", "+.1f"),
            ("harness / kind", ".2f"),
        ],
    )
    for k, v in times.items():
        table.add(
            k,
            med[k],
            _bench.ms(v, 90),
            med["harness"] - med[k] if k != "harness" else None,
            _bench.ratio(med["harness"], med[k]) if k != "harness" else None,
        )
    report.table(table)
    report.finish()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
