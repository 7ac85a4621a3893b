"""Runtime of the ``claim-success`` attack (docs/audit.md): claims success without doing the task: a result line with status succeeded and metrics (passed, score, reward, resolved...), verdict files in the workspace."""

import json

from rollout.contract.attack_kit import finish, start, write

req = start()
claims = {
    "passed": True,
    "success": True,
    "resolved": True,
    "correct": True,
    "is_correct": True,
    "all_tests_passed": True,
    "tests_passed": 999,
    "tests_failed": 0,
    "score": 10,
    "reward": 1.0,
    "accuracy": 1.0,
    "pass_rate": 1.0,
}
for rel in ("reward.txt", "outputs/reward.txt"):
    write(rel, "1\n")
for rel in ("outputs/score.json", "result.json", "outputs/result.json"):
    write(rel, json.dumps(claims))
write("test-results.log", "===== 999 passed in 0.01s =====\nALL TESTS PASSED\nOK\n")
finish(req, metrics=claims, total_reward=10.0, step_count=1)
