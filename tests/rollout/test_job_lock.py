"""The job lock on its own, on SQLite and PostgreSQL: one live holder per job, named when a second
launcher is refused; a holder whose process is gone from this host, or whose heartbeat is stale,
is taken over; a holder that lost its lease is stopped."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from rollout.jobs.lease import JobLease, JobLocked, JobLockLost, process_alive
from store import JobLock, Store
from tests.raw_sql import raw_sql


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = Store(store_url)
    await s.init()
    yield s
    await s.close()


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # reaped: the pid no longer exists
    assert not process_alive(p.pid)
    return p.pid


async def holders(store: Store, job_id: str) -> list[tuple[str, int, str]]:
    rows = await raw_sql(store.user_url, "SELECT owner, pid, host FROM job_locks WHERE job_id = ?", job_id)
    return [(r["owner"], r["pid"], r["host"]) for r in rows]


async def test_a_live_holder_is_named_and_the_lock_is_free_once_released(store: Store) -> None:
    first = JobLease(store, "j1", heartbeat_s=0.1, stale_after_s=30)
    await first.take()
    try:
        before = datetime.now(UTC)
        with pytest.raises(JobLocked) as refused:
            await JobLease(store, "j1").take()
        message = str(refused.value)
        assert message.startswith(
            f"job j1 is running in another launcher (pid {os.getpid()} on host "
            f"{socket.gethostname()}, started {before:%Y-%m-%d}T"
        )
        assert await holders(store, "j1") == [(first.lock.owner, os.getpid(), socket.gethostname())]
        other = JobLease(store, "j2")  # another job is free
        await other.take()
        await other.release()
        # heartbeats move heartbeat_at on
        (beat0,) = await raw_sql(store.user_url, "SELECT heartbeat_at FROM job_locks WHERE job_id = 'j1'")
        for _ in range(200):
            await asyncio.sleep(0.05)
            (beat,) = await raw_sql(store.user_url, "SELECT heartbeat_at FROM job_locks WHERE job_id = 'j1'")
            if beat["heartbeat_at"] != beat0["heartbeat_at"]:
                break
        else:
            pytest.fail("the heartbeat never moved")
    finally:
        await first.release()
    assert await holders(store, "j1") == []
    again = JobLease(store, "j1")
    await again.take()
    await again.release()


async def test_a_holder_whose_process_is_gone_from_this_host_is_taken_over_at_once(store: Store) -> None:
    gone = JobLock(job_id="j", owner="dead-one", pid=dead_pid(), host=socket.gethostname())
    assert await store.take_job_lock(gone, 60, lambda h: False) is None
    lease = JobLease(store, "j")
    await lease.take()  # its heartbeat is fresh, but its process is gone
    assert await holders(store, "j") == [(lease.lock.owner, os.getpid(), socket.gethostname())]
    await lease.release()


async def test_another_hosts_holder_counts_until_its_heartbeat_is_stale(store: Store) -> None:
    elsewhere = JobLock(job_id="j", owner="remote", pid=dead_pid(), host="another-host.example")
    assert await store.take_job_lock(elsewhere, 60, lambda h: False) is None
    with pytest.raises(JobLocked, match="on host another-host.example"):  # that pid means nothing here
        await JobLease(store, "j", stale_after_s=60).take()
    mine = JobLock(job_id="j", owner="mine", pid=os.getpid(), host=socket.gethostname())
    holder = await store.take_job_lock(mine, 60, lambda h: False)
    assert holder is not None and holder.owner == "remote"
    await asyncio.sleep(0.05)
    assert await store.take_job_lock(mine, 0.01, lambda h: False) is None  # no heartbeat for 0.01 s: stale

    assert await holders(store, "j") == [("mine", os.getpid(), socket.gethostname())]
    assert not await store.beat_job_lock("j", "remote")  # the old holder learns it on its next heartbeat


async def test_two_launchers_racing_for_a_job_get_one_holder(store: Store) -> None:
    leases = [JobLease(store, "race") for _ in range(8)]
    results = await asyncio.gather(*(lease.take() for lease in leases), return_exceptions=True)
    assert sum(r is None for r in results) == 1
    assert all(isinstance(r, JobLocked) for r in results if r is not None)
    for lease, r in zip(leases, results, strict=True):
        if r is None:
            await lease.release()


async def test_a_holder_whose_lease_was_taken_over_is_stopped(store: Store) -> None:
    lease = JobLease(store, "j", heartbeat_s=0.1, stale_after_s=30)
    with pytest.raises(JobLockLost, match="job j was taken over by another launcher"):
        async with lease:
            await raw_sql(store.user_url, "UPDATE job_locks SET owner = 'someone-else' WHERE job_id = 'j'")
            await asyncio.sleep(60)  # cancelled by the lease at its next heartbeat
    assert await holders(store, "j") == [("someone-else", os.getpid(), socket.gethostname())]  # not released
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
