"""The CLI's logging: notices printed bare and once; handlers it did not make (a host's, pytest's
own capture) keep every record."""

from __future__ import annotations

import logging
import subprocess
import sys

from rollout.core.logs import setup_logging
from tests.test_launcher import REPO


def test_setup_logging_leaves_handlers_it_did_not_make_alone() -> None:
    root = logging.getLogger()
    foreign = logging.Handler()
    root.addHandler(foreign)
    try:
        setup_logging("warning")
        assert foreign.filters == []
    finally:
        root.removeHandler(foreign)


def test_a_notice_is_printed_once_and_bare_in_a_fresh_process() -> None:
    code = (
        "import logging; from rollout.core.logs import setup_logging, notices; setup_logging('info'); "
        "notices.warning('warning: x'); logging.getLogger('rollout.jobs').warning('y')"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    lines = p.stderr.splitlines()
    assert (
        lines[0] == "warning: x" and len(lines) == 2 and lines[1].endswith("y") and "rollout.jobs" in lines[1]
    )
