"""The ``shadow-path`` attack of ``launcher.py audit``: executables named python, python3, pytest, curl, bash, git, node, make in the workspace and its bin/, .venv/bin/, node_modules/.bin/: each prints a passing test run and exits 0."""

from rollout.audit.battery import Attack


class ShadowPath(Attack):
    name = "shadow-path"
    summary = "executables named python, python3, pytest, curl, bash, git, node, make in the workspace and its bin/, .venv/bin/, node_modules/.bin/: each prints a passing test run and exits 0"
    source = "graders that run tools found on a PATH holding a workspace folder (./bin, .venv/bin)"
    fix_hint = "your grader runs a tool from the workspace: call tools by absolute path, with a PATH of system folders"


HARNESS = ShadowPath()
