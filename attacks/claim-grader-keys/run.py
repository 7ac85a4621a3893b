"""Runtime of the ``claim-grader-keys`` attack (docs/audit.md): what the audit found in the env's grader
(``audit.json`` beside this file, written by the audit: env name -> metrics keys with passing values,
paths, file names) claimed on the result line and planted in the workspace."""

import json
import os
from pathlib import Path

from rollout.contract.attack_kit import finish, start, write

MARKERS = {".json": '{"passed": true, "score": 10, "reward": 1.0, "status": "passed"}', ".txt": "passed\n"}

req = start()
found = Path(__file__).with_name("audit.json")
claims = json.loads(found.read_text()).get(req.agent_name, {}) if found.is_file() else {}
metrics = dict(claims.get("metric_keys", {}))
for rel in claims.get("paths", []):
    for name in [rel.replace("*", "x")] if "*" in rel else [rel]:
        if not Path(name).is_dir():
            write(name, MARKERS.get(Path(name).suffix, "1\n"))
folders = ["."] + sorted({str(p.parent) for p in Path(".").rglob("*") if p.is_file()} - {"."})[:50]
for name in claims.get("names", []):
    for folder in folders:
        if not Path(folder, name).exists():
            write(os.path.join(folder, name), MARKERS.get(Path(name).suffix, "passed\n"))
finish(req, metrics=metrics, total_reward=10.0, step_count=1)
