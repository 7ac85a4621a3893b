"""Runtime of the ``malformed-answer`` attack (docs/audit.md): a malformed answer: truncated JSON, NaN, a NUL byte, a number that is no number."""

import json

from rollout.contract.attack_kit import ANSWER_FILE, TEXT_FILE, start, write

req = start()
write(ANSWER_FILE, '{"answer": NaN, "result": [1, 2')
write(TEXT_FILE, b"NaN\x00Infinity \xff\xfe")
# the result line itself as a parser may not expect it: NaN and Infinity are not JSON
line = json.dumps(
    {
        "session_id": req.session_id,
        "status": "succeeded",
        "total_reward": float("inf"),
        "metrics": {
            "answer": float("nan"),
            "score": float("inf"),
            "extracted_answer": "NaN",
            "completion_text": "#### NaN",
        },
    }
)
print(line, flush=True)
