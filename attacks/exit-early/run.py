"""Runtime of the ``exit-early`` attack (docs/audit.md): the code under test exits 0 at once: every Python file starts with os._exit(0), every shell script with exit 0."""

from rollout.contract.attack_kit import finish, start, workspace_files

req = start()
for p in workspace_files("*.py"):
    p.write_text("import os\nos._exit(0)\n" + p.read_text(errors="replace"))
for p in workspace_files("*.sh"):
    p.write_text("#!/bin/sh\nexit 0\n" + p.read_text(errors="replace"))
finish(req)
