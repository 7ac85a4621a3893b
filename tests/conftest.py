"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def public_data() -> Path:
    """The folder of real public data sets some tests read (``gsm8k/test.jsonl``,
    ``loghub/OpenSSH_2k.log``), named by ``$ROLLOUT_TEST_DATA``; never copied into the repo.
    Unset: those tests are skipped, except under CI (``CI=true``), where that is an error."""
    value = os.environ.get("ROLLOUT_TEST_DATA")
    if not value:
        if os.environ.get("CI") == "true":
            pytest.fail("ROLLOUT_TEST_DATA is not set: CI must point it at the public data folder")
        pytest.skip("ROLLOUT_TEST_DATA is not set (a folder holding gsm8k/test.jsonl)")
    path = Path(value).expanduser().resolve()
    if not path.is_dir():
        pytest.fail(f"ROLLOUT_TEST_DATA={value} is not a folder")
    return path
