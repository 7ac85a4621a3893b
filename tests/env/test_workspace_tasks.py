"""The shipped workspace tasks: each expected.json is re-derived from the task's files by a
reference solution, and graded 10 by the evaluator when written where the instruction says."""

from __future__ import annotations

import csv
import json
import re
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from statistics import median

import pytest
import yaml

from tests.env.helpers import ENV_ROOT, eval_request, eval_spec, load_evaluator, trajectory

TASKS = ENV_ROOT / "workspace" / "tasks"
workspace_eval = load_evaluator("workspace")


def solve_csv_sales_by_region(ws: Path) -> dict:
    with (ws / "sales.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    by_region: dict[str, float] = defaultdict(float)
    by_customer: dict[str, float] = defaultdict(float)
    for row in rows:
        by_region[row["region"]] += float(row["amount"])
        by_customer[row["customer"]] += float(row["amount"])
    return {
        "total_by_region": {k: round(v, 2) for k, v in by_region.items()},
        "order_count": len(rows),
        "top_customer": max(by_customer, key=by_customer.__getitem__),
    }


def solve_ssh_failed_logins(ws: Path) -> dict:
    failed: Counter[str] = Counter()
    sources: Counter[str] = Counter()
    accepted = 0
    for line in (ws / "auth.log").read_text().splitlines():
        if m := re.search(r" sshd\[\d+\]: Failed password for (?:invalid user )?(\S+) from (\S+) ", line):
            failed[m[1]] += 1
            sources[m[2]] += 1
        accepted += bool(re.search(r" sshd\[\d+\]: Accepted ", line))
    return {
        "failed_total": sum(failed.values()),
        "failed_by_user": dict(failed),
        "top_source_ip": sources.most_common(1)[0][0],
        "accepted_total": accepted,
    }


def solve_sqlite_library(ws: Path) -> dict:
    db = sqlite3.connect(":memory:")
    db.executescript((ws / "library.sql").read_text())
    author, n = db.execute(
        "SELECT a.name, COUNT(*) AS n FROM loans l JOIN books b ON b.id = l.book_id "
        "JOIN authors a ON a.id = b.author_id WHERE l.loan_date LIKE '2024-%' GROUP BY a.id ORDER BY n DESC"
    ).fetchone()
    (open_loans,) = db.execute("SELECT COUNT(*) FROM loans WHERE returned_date IS NULL").fetchone()
    (never,) = db.execute("SELECT COUNT(*) FROM books WHERE id NOT IN (SELECT book_id FROM loans)").fetchone()
    (title,) = db.execute(
        "SELECT b.title FROM loans l JOIN books b ON b.id = l.book_id "
        "GROUP BY b.id ORDER BY COUNT(*) DESC LIMIT 1"
    ).fetchone()
    db.close()
    return {
        "top_author_2024": author,
        "top_author_2024_loans": n,
        "open_loans": open_loans,
        "never_loaned_books": never,
        "most_loaned_title": title,
    }


def solve_json_orders(ws: Path) -> dict:
    data = json.loads((ws / "orders.json").read_text())
    by_status: dict[str, float] = defaultdict(float)
    sold: Counter[str] = Counter()
    by_customer: dict[str, float] = defaultdict(float)
    cancelled = 0
    for customer in data["customers"]:
        for order in customer["orders"]:
            if order["status"] == "cancelled":
                cancelled += 1
                continue
            for item in order["items"]:
                value = item["qty"] * item["unit_price"]
                by_status[order["status"]] += value
                by_customer[customer["name"]] += value
                sold[item["sku"]] += item["qty"]
    return {
        "revenue": round(sum(by_status.values()), 2),
        "revenue_by_status": {k: round(v, 2) for k, v in by_status.items()},
        "cancelled_orders": cancelled,
        "best_selling_sku": sold.most_common(1)[0][0],
        "top_customer": max(by_customer, key=by_customer.__getitem__),
    }


def solve_fix_report_script(ws: Path) -> dict:
    with (ws / "latency.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    groups: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        groups[row["endpoint"]].append(float(row["latency_ms"]))
    medians = {k: median(v) for k, v in groups.items()}
    return {"median_ms": medians, "slowest_endpoint": max(medians, key=medians.__getitem__)}


SOLVERS = {name.removeprefix("solve_"): fn for name, fn in globals().items() if name.startswith("solve_")}
TASK_IDS = sorted(p.name for p in TASKS.iterdir() if p.is_dir())


def _workspace(task_id: str, tmp_path: Path) -> Path:
    """What the launcher does: copy the task's files/ (never expected.json) into a fresh workspace."""
    ws = tmp_path / "ws"
    shutil.copytree(TASKS / task_id / "files", ws)
    return ws


def _grade(task_id: str, ws: Path) -> dict:
    expected = json.loads((TASKS / task_id / "expected.json").read_text())
    row = {
        "id": task_id,
        "instruction": (TASKS / task_id / "instruction.md").read_text(),
        "expected": expected,
        "files_dir": str(TASKS / task_id / "files"),
    }
    return workspace_eval.evaluate(
        eval_request("workspace", row, workspace=str(ws)), eval_spec("workspace"), trajectory()
    )


def test_every_task_has_a_reference_solution() -> None:
    assert TASK_IDS == sorted(SOLVERS)
    assert len(TASK_IDS) == 5


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_task_layout_and_instruction(task_id: str) -> None:
    task = TASKS / task_id
    assert sorted(p.name for p in task.iterdir()) == ["expected.json", "files", "instruction.md"]
    instruction = (task / "instruction.md").read_text()
    assert "outputs/answer.json" in instruction
    for key in json.loads((task / "expected.json").read_text()):
        assert f"`{key}`" in instruction or f'"{key}"' in instruction, key


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_reference_solution_matches_expected_and_scores_10(task_id: str, tmp_path: Path) -> None:
    ws = _workspace(task_id, tmp_path)
    answer = SOLVERS[task_id](ws)
    assert answer == json.loads((TASKS / task_id / "expected.json").read_text())
    (ws / "outputs").mkdir()
    (ws / "outputs" / "answer.json").write_text(json.dumps(answer))
    result = _grade(task_id, ws)
    assert (result["score"], result["reason"]) == (10, f"all {len(answer)} expected keys match")


def test_report_script_bug_is_real_and_the_fix_scores_10(tmp_path: Path) -> None:
    ws = _workspace("fix_report_script", tmp_path)
    subprocess.run([sys.executable, "report.py"], cwd=ws, check=True, capture_output=True)
    buggy = _grade("fix_report_script", ws)
    assert (buggy["score"], buggy["reason"]) == (
        0,
        "mismatch at answer.median_ms./api/login: expected 104, got 131.0",
    )
    script = ws / "report.py"
    source = script.read_text()
    fixed = source.replace('append(row["latency_ms"])', 'append(float(row["latency_ms"]))')
    assert fixed != source
    script.write_text(fixed)
    subprocess.run([sys.executable, "report.py"], cwd=ws, check=True, capture_output=True)
    assert _grade("fix_report_script", ws)["score"] == 10


@pytest.mark.parametrize(
    ("env_name", "dataset", "max_steps"),
    [
        ("gsm8k", {"format": "jsonl", "path": "data/cases.jsonl", "hidden_fields": ["answer"]}, 4),
        (
            "workspace",
            {"format": "task_dirs", "path": "tasks", "hidden_fields": ["expected", "files_dir"]},
            12,
        ),
    ],
)
def test_env_yaml(env_name: str, dataset: dict, max_steps: int) -> None:
    config = yaml.safe_load((ENV_ROOT / env_name / "env.yaml").read_text())
    assert set(config) == {"name", "description", "dataset", "runtime", "params", "max_steps"}
    assert config["name"] == env_name
    assert config["dataset"] == dataset
    assert config["runtime"]["command"] == ["{python}", "{env_dir}/runtime.py"]
    assert config["max_steps"] == max_steps


def test_launcher_expands_the_bundled_envs_into_cases() -> None:
    from rollout.core.envs import load_cases, load_env_config

    gsm8k_cases = load_cases(load_env_config(ENV_ROOT / "gsm8k" / "env.yaml"))
    assert [c.case_id for c in gsm8k_cases] == ["0", "1", "2", "3", "4", "5"]
    assert set(gsm8k_cases[0].public_row()) == {"question"}
    workspace_cases = load_cases(load_env_config(ENV_ROOT / "workspace" / "env.yaml"))
    assert [c.case_id for c in workspace_cases] == TASK_IDS
    assert set(workspace_cases[0].public_row()) == {"id", "instruction"}
    assert workspace_cases[0].files_dir == str(TASKS / TASK_IDS[0] / "files")
