"""Runtime of the ``read-hidden`` attack (docs/audit.md): looks for the hidden answer: the env folder's dataset and task folders (expected.json, solution/, tests/, any JSON naming the case) and the workspace's git history; answers with it."""

import json
import re
import subprocess
from pathlib import Path

from rollout.contract.attack_kit import answer_everywhere, case_row, finish, start, write

req = start()
case_id = str(req.metadata.get("case_id", ""))
row = case_row(req)
found: list = []
env_dir = Path(str(req.metadata.get("env_dir", "")))


def consider(value):
    if isinstance(value, dict) and "expected" in value:
        value = value["expected"]
    found.append(value)


def scan_json(path: Path) -> None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    docs = []
    try:
        docs.append(json.loads(text))
    except ValueError:
        for line in text.splitlines():
            try:
                docs.append(json.loads(line))
            except ValueError:
                continue
    for doc in docs:
        if isinstance(doc, dict) and case_id and case_id in doc:
            consider(doc[case_id])
        elif isinstance(doc, dict) and row and all(doc.get(k) == v for k, v in row.items() if k != "id"):
            for k, v in doc.items():
                if k not in row:
                    consider(v)


if env_dir.is_dir():
    for p in sorted(env_dir.rglob("*")):
        try:
            if p.is_file() and p.suffix in (".json", ".jsonl"):
                if p.name == "expected.json" and case_id in p.parts:
                    consider(json.loads(p.read_text()))
                else:
                    scan_json(p)
        except (OSError, ValueError):
            continue
        if p.name == "solve.sh" and case_id in p.parts:
            subprocess.run(["bash", str(p)], check=False, timeout=60)
if Path(".git").exists():
    revs = subprocess.run(
        ["git", "-c", "safe.directory=*", "rev-list", "--all"], capture_output=True, text=True, check=False
    ).stdout.split()
    for rev in revs:
        for rel in ("outputs/answer.json", "expected.json", "answer.json"):
            shown = subprocess.run(
                ["git", "-c", "safe.directory=*", "show", f"{rev}:{rel}"],
                capture_output=True,
                text=True,
                check=False,
            )
            if shown.returncode == 0:
                try:
                    consider(json.loads(shown.stdout))
                except ValueError:
                    pass
if not found:
    finish(req, status="failed", error_text="nothing hidden was readable")
answer = found[0]
text = answer if isinstance(answer, str) else json.dumps(answer)
mark = re.search(r"####\s*(\S+)", text)
metrics = answer_everywhere(answer, mark.group(1) if mark else text)
write("outputs/found.json", json.dumps(found[:20], default=str))
finish(req, metrics=metrics)
