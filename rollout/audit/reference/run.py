"""Runtime of the audit's reference run (docs/audit.md): ``bash solve.sh`` of a Harbor task's solution
(bound read-only, ``ROLLOUT_SOLUTION_DIR``), else the case's answer from ``references.json`` beside
this file (env name -> case id -> answer, written by the audit) as ``outputs/answer.json``, else a
failed result saying there is no reference."""

import json
import os
import subprocess
import sys
from pathlib import Path

from rollout.contract.attack_kit import ANSWER_FILE, finish, start, write

req = start()
solution = os.environ.get("ROLLOUT_SOLUTION_DIR")
refs = Path(__file__).with_name("references.json")
answers = json.loads(refs.read_text()).get(req.agent_name, {}) if refs.is_file() else {}
if solution:
    rc = subprocess.run(
        ["bash", os.path.join(solution, "solve.sh")], stdout=sys.stderr, check=False
    ).returncode
    finish(
        req,
        status="succeeded" if rc == 0 else "failed",
        metrics={"reference": "solution/solve.sh", "exit": rc},
    )
elif req.case_id in answers:
    write(ANSWER_FILE, json.dumps(answers[req.case_id]))
    finish(req, metrics={"reference": "expected.json"})
finish(req, status="failed", metrics={"reference": None})
