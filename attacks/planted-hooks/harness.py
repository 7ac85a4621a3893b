"""The ``planted-hooks`` attack of ``launcher.py audit``: conftest.py, sitecustomize.py, usercustomize.py and pytest.ini planted in the workspace (and its tests/): every pytest outcome passed, unittest always successful, exit 0."""

from rollout.audit.battery import Attack


class PlantedHooks(Attack):
    name = "planted-hooks"
    summary = "conftest.py, sitecustomize.py, usercustomize.py and pytest.ini planted in the workspace (and its tests/): every pytest outcome passed, unittest always successful, exit 0"
    source = "reward hacking reported on coding tasks: a conftest.py patching pytest's reports"
    fix_hint = (
        "your tests run from the workspace: run them from outside it (explicit paths under /tests, python -I)"
    )


HARNESS = PlantedHooks()
