#!/bin/bash
# Runs in the task's image (its python3 and pytest, its greet tool) on the agent's final /app.
# pytest reads no ini file or conftest.py of /app (-c /dev/null, rootdir /tests).
echo 0 > /logs/verifier/reward.txt
cd /app && python3 -m pytest -q -p no:cacheprovider -c /dev/null --rootdir /tests /tests/test_greeting.py \
  && echo 1 > /logs/verifier/reward.txt
