"""A tiny tool-calling env and the fake model's answers for the viewer tests.

The runtime asks the model, runs each ``read_log`` tool call (a long log text ending in
``TOOL_END``) and answers it, until the model replies with text. The evaluator gives 10 when the
reply is the case's hidden ``expected`` value, else 2 with a reason naming both. The case row also
holds a hidden ``secret`` that the runtime must never see (it asserts so).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.fake_upstream import FakeRequest, Reply, chat_completion

TOOL_END = "END-OF-TOOL-OUTPUT-7731"
SECRET = "HIDDEN-SECRET-9431"
RIGHT, WRONG = "ANSWER-42", "ANSWER-7"
SCRIPT_FILE = "<script>.html"
"""The name of a file each session leaves in its workspace (its first line: ``SCRIPT_TEXT``)."""
SCRIPT_TEXT = "<script>document.title = 'pwned'</script>"

RUNTIME = (
    '''
import os
from env.runtime_kit import openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

TOOL = {"type": "function", "function": {"name": "read_log", "description": "read a log file",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}
LOG = "\\n".join(f"Dec 10 06:55:{i % 60:02d} sshd[{1000 + i}]: Failed password for root from 10.0.0.{i % 250}"
                 for i in range(120)) + "\\nTOOL_END_MARK"

def leave_files():
    """The agent's words in its workspace: a file named like a script tag, links, binary bytes."""
    os.makedirs("notes", exist_ok=True)
    with open("notes/SCRIPT_NAME", "w") as f:
        f.write("SCRIPT_TEXT\\n" + "a-very-long-line-" * 400 + "\\n")
    with open("notes/blob.bin", "wb") as f:
        f.write(bytes(range(256)))
    os.symlink("/etc/passwd", "passwd")
    os.symlink("notes/blob.bin", "inner-link")

def main(req):
    row = req.env_params["dataset"]
    assert "expected" not in row and "secret" not in row, "hidden field leaked to the runtime"
    leave_files()
    if row.get("crash"):
        raise RuntimeError("agent crashed on purpose")
    client = openai_client(req, max_retries=0)
    messages = [{"role": "system", "content": "You answer questions about logs."},
                {"role": "user", "content": f"{row['q']} [sample {req.metadata['sample_index']}]"}]
    for _ in range(4):
        c = client.chat.completions.create(model=req.model, messages=messages, tools=[TOOL])
        msg = c.choices[0].message
        if not msg.tool_calls:
            return SimulationStartResult(session_id=req.session_id, status="succeeded", metrics={"answer": msg.content})
        messages.append({"role": "assistant", "content": msg.content or "",
                         "tool_calls": [tc.model_dump() for tc in msg.tool_calls]})
        for tc in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": LOG})
    return SimulationStartResult(session_id=req.session_id, status="failed", error_text="no answer")

run_runtime(main)
'''.replace("TOOL_END_MARK", TOOL_END)
    .replace("SCRIPT_NAME", SCRIPT_FILE)
    .replace("SCRIPT_TEXT", SCRIPT_TEXT)
)

EVALUATOR = """
def evaluate(request, spec, trajectory):
    row = request.env_params["dataset"]
    got = trajectory.final_response
    if got == row["expected"]:
        return {"score": 10, "reason": "correct", "artifacts": {"answer": got}}
    return {"score": 2, "reason": f"expected {row['expected']}, got {got!r}", "artifacts": {"answer": got}}
"""

CASES = [
    {"id": "logs", "q": "How many failed logins?", "expected": RIGHT, "secret": SECRET},
    {"id": "direct", "q": "Answer directly.", "expected": RIGHT, "secret": SECRET, "direct": True},
    {"id": "crash", "q": "crash", "expected": RIGHT, "secret": SECRET, "crash": True},
]


def make_env(root: Path) -> Path:
    """Write the env under ``root/toy`` and return ``root``."""
    env_dir = root / "toy"
    (env_dir / "data").mkdir(parents=True)
    (env_dir / "runtime.py").write_text(RUNTIME)
    (env_dir / "rule_evaluator.py").write_text(EVALUATOR)
    (env_dir / "data" / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CASES))
    cfg = {
        "name": "toy",
        "dataset": {
            "format": "jsonl",
            "path": "data/cases.jsonl",
            "id_field": "id",
            "hidden_fields": ["expected", "secret"],
        },
        "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 60},
        "max_steps": 6,
    }
    (env_dir / "env.yaml").write_text(yaml.safe_dump(cfg))
    return root


def gateway_config(path: Path, upstream_url: str, db: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "storage_config": {"db_url": f"sqlite://{db}"},
                "llm_routes": {"fake": {"base_url": upstream_url}},
            }
        )
    )
    return path


def model_reply(diverge: bool):  # type: ignore[no-untyped-def]
    """The fake model: a ``read_log`` tool call first (unless the question says to answer
    directly), then the answer ``RIGHT``; with ``diverge``, sample 1 answers ``WRONG``."""

    def reply(req: FakeRequest) -> Reply:
        body: dict[str, Any] = req.json if isinstance(req.json, dict) else {}
        messages = body.get("messages") or []
        user = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        if messages and messages[-1].get("role") == "user" and "directly" not in user:
            call = {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_log", "arguments": json.dumps({"name": "auth.log"})},
            }
            return Reply.json(
                chat_completion(
                    None,
                    tool_calls=[call],
                    finish_reason="tool_calls",
                    reasoning="I should read the log first.",
                )
            )
        text = WRONG if diverge and "[sample 1]" in user else RIGHT
        return Reply.json(chat_completion(text))

    return reply
