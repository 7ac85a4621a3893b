#!/bin/bash
# The task's unit tests on the agent's /workspace/stats.py (stdlib unittest, isolated mode: nothing
# of the workspace configures the interpreter); reward 1 when they all pass, else 0.
if python3 -I -m unittest discover -s /tests -p 'test_*.py' -v; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
