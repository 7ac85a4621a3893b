"""Inside the real sandbox a runtime imports the in-sandbox contract (``rollout.contract``, bound as
one folder) and its public paths, and nothing else of the launcher or the store."""

from __future__ import annotations

import json
from pathlib import Path

from rollout.sandbox.runner import run_runtime
from tests.rollout.sandbox_helpers import make_env, request, require_bwrap

PROBE = """
import importlib, json
found = {}
for name in ("rollout.contract.protocol", "rollout.contract.harness", "rollout.contract.harness_runtime",
             "rollout.protocol", "rollout.harness", "rollout.jobs.run", "rollout.grading.grader",
             "rollout.sandbox.runner", "rollout.client", "store"):
    try:
        importlib.import_module(name)
        found[name] = True
    except ImportError:
        found[name] = False
print("IMPORTS " + json.dumps(found), flush=True)
"""


async def test_a_runtime_sees_the_contract_and_nothing_else_of_ours(tmp_path: Path) -> None:
    require_bwrap()
    cfg = make_env(tmp_path / "envs", "probe", PROBE)
    ws = tmp_path / "ws"
    ws.mkdir()
    out = await run_runtime(cfg, request("s-contract"), ws, {})
    assert out.sandbox == "bwrap"
    line = next(x for x in out.stdout_tail.splitlines() if x.startswith("IMPORTS "))
    assert json.loads(line.removeprefix("IMPORTS ")) == {
        "rollout.contract.protocol": True,
        "rollout.contract.harness": True,
        "rollout.contract.harness_runtime": True,
        "rollout.protocol": True,
        "rollout.harness": True,
        "rollout.jobs.run": False,
        "rollout.grading.grader": False,
        "rollout.sandbox.runner": False,
        "rollout.client": False,
        "store": False,
    }
