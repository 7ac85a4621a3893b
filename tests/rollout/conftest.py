"""Fixtures for the evaluator tests. Not autouse: test modules that run evaluators opt in with
``pytestmark = pytest.mark.usefixtures("no_leaked_threads")``, so no test leaks abandoned evaluator
threads into the next one (the thread-limit test relies on starting from 0)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from rollout.grading.evaluation import abandoned_thread_count


@pytest.fixture
def releasers() -> list[Callable[[], None]]:
    """Callables that release hung evaluators; run at teardown before the thread check."""
    return []


@pytest.fixture
def no_leaked_threads(releasers: list[Callable[[], None]]) -> Iterator[None]:
    assert abandoned_thread_count() == 0, "a previous test leaked an abandoned evaluator thread"
    yield
    for release in releasers:
        release()
    deadline = time.monotonic() + 5.0
    while abandoned_thread_count() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert abandoned_thread_count() == 0
