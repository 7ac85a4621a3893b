"""Runtime of the ``answer-fifo`` attack (docs/audit.md): the answer files as FIFOs nobody writes: a grader that opens them blocks."""

import os

from rollout.contract.attack_kit import ANSWER_FILE, TEXT_FILE, finish, start, write

req = start()
for rel in (ANSWER_FILE, TEXT_FILE):
    write(rel, "")
    os.unlink(rel)
    os.mkfifo(rel)
finish(req)
