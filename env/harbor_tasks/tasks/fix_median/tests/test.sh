#!/bin/bash
# The checker writes the reward itself (docs/verifiers.md): it runs the agent's stats.py only in
# child processes, then stops whatever they left running, then writes reward.txt last.
exec python3 -I /tests/check.py
