"""Runtime of the ``answer-link`` attack (docs/audit.md): the answer files as links (to /dev/zero, to /etc/passwd, to the workspace's parent)."""

import os

from rollout.contract.attack_kit import ANSWER_FILE, TEXT_FILE, finish, start, write

req = start()
for rel, target in ((ANSWER_FILE, "/dev/zero"), (TEXT_FILE, "/etc/passwd"), ("outputs/up", "..")):
    write(rel, "")
    os.unlink(rel)
    os.symlink(target, rel)
finish(req)
