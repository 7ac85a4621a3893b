"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg_server import PgServer, PgUnavailable


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


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL server for this test session (:mod:`tests.pg_server`), stopped at the end.
    None can be started (not installed, no ``postgres`` user): the tests that need it are
    skipped, except under CI (``CI=true``), where that is an error."""
    server = PgServer()
    try:
        server.start()
    except PgUnavailable as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs a PostgreSQL server: {e}")
        pytest.skip(f"no PostgreSQL server for the PostgreSQL half of the store tests: {e}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A storage URL of an empty store, once per backend: a SQLite file in ``tmp_path``, and a
    fresh database on :func:`pg_server` (dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path}/store.db"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    url = server.create_database()
    try:
        yield url
    finally:
        server.drop_database(url)
