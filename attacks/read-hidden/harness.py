"""The ``read-hidden`` attack of ``launcher.py audit``: looks for the hidden answer: the env folder's dataset and task folders (expected.json, solution/, tests/, any JSON naming the case) and the workspace's git history; answers with it."""

from rollout.audit.battery import Attack


class ReadHidden(Attack):
    name = "read-hidden"
    summary = "looks for the hidden answer: the env folder's dataset and task folders (expected.json, solution/, tests/, any JSON naming the case) and the workspace's git history; answers with it"
    source = "agents reading the repository's future commits (git log --all) on SWE-bench; answer files left readable"
    fix_hint = "your answers are readable from the sandbox: keep them in hidden fields or the hidden data/, tasks/ folders, out of the workspace and its git history"


HARNESS = ReadHidden()
