"""Runtime of the ``huge-answer`` attack (docs/audit.md): a 300 MiB answer file (sparse): over the grader's copy cap, or too big to read."""

import os

from rollout.contract.attack_kit import ANSWER_FILE, finish, start, write

req = start()
path = write(ANSWER_FILE, '{"answer": "')
os.truncate(path, 300 * 1024 * 1024)
finish(req)
