#!/bin/bash
# Compares /workspace/errors.txt with the count taken from the task's own copy of the log (the
# agent may have changed its app.log); writes reward.json.
expected=$(grep -c ERROR /tests/app.log)
got=$(tr -d '[:space:]' < /workspace/errors.txt 2>/dev/null)
if [ "$got" = "$expected" ]; then
  echo "{\"reward\": 1.0, \"expected\": $expected}" > /logs/verifier/reward.json
else
  echo "{\"reward\": 0.0, \"expected\": $expected}" > /logs/verifier/reward.json
fi
echo "expected $expected, got '$got'"
