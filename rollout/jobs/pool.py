"""The worker pool: runs a job's planned sessions (``rollout.core.plan``), exactly ``pool_size``
attempts at once (``rollout.jobs.attempt``), retries after their backoff ahead of sessions not
started yet, a circuit breaker (``rollout.jobs.breaker``) holding new attempts while the gateway is
down, and the grader open while it runs. Ctrl-C cancels the attempts in flight cleanly.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from rollout.core.envs import EnvConfig
from rollout.core.plan import RowSource
from rollout.errors import RolloutError
from rollout.grading.grader import Grader, grader_mode
from rollout.jobs.attempt import Attempts, Executor, Retry, Work
from rollout.jobs.breaker import BreakerEvent, CircuitBreaker
from rollout.jobs.gateway_client import GatewayClient, gateway_client
from rollout.jobs.options import JobContext, JobOptions
from rollout.results.report import SessionRecord
from rollout.sandbox.runtime_local import pidfd_child_watcher
from store import GRADER_BROKEN, JobEnvironment, Store

log = logging.getLogger(__name__)


class JobStopped(RolloutError, RuntimeError):
    """The job stopped early: the circuit breaker gave up (the gateway or its upstream stayed
    unavailable; ``kind`` ``breaker``) or ``max_broken_graders`` broken-grader findings were made
    (``broken_graders``). Sessions not finished are left for ``--resume``; the message says why."""

    def __init__(self, reason: str, kind: Literal["breaker", "broken_graders"] = "breaker") -> None:
        super().__init__(reason)
        self.kind = kind


class Pool:
    """Runs a job's session rows with ``opts.pool_size`` workers. ``envs`` maps env name to config.
    ``on_done`` is called with each record, ``on_breaker`` with each change of the circuit breaker
    (also kept in ``breaker_events``). ``rng`` draws the backoff jitter; ``executor`` runs each
    attempt's runtime (default: on this machine); ``keep_records`` False: finished records are
    passed to ``on_done`` only, not kept (a job of any size in flat memory)."""

    def __init__(
        self,
        store: Store,
        opts: JobOptions,
        ctx: JobContext,
        envs: Mapping[str, EnvConfig],
        on_done: Callable[[SessionRecord], None] | None = None,
        on_breaker: Callable[[BreakerEvent], None] | None = None,
        rng: random.Random | None = None,
        executor: Executor | None = None,
        keep_records: bool = True,
    ) -> None:
        self.store = store
        self.opts = opts
        self.ctx = ctx
        self.envs = envs
        self.keep_records = keep_records
        self.on_done = on_done
        self.on_breaker = on_breaker
        self.records: list[SessionRecord] = []
        self.breaker_events: list[BreakerEvent] = []
        self._rng = rng or random.Random()
        self._executor = executor
        self._gateway: GatewayClient | None = None
        self._attempts: Attempts | None = None
        self._queue: asyncio.PriorityQueue[tuple[int, int, Work | None]] = asyncio.PriorityQueue()
        self._seq = 0
        self._left = 0
        self._room = asyncio.Semaphore(1)
        self._feeder: asyncio.Task[None] | None = None
        self._timers: set[asyncio.Task[None]] = set()
        self._workers: list[asyncio.Task[None]] = []
        self._stop_reason: str | None = None
        self._broken: Counter[str] = Counter()
        self._stop_when_told: str | None = None
        self.breaker = CircuitBreaker(opts.breaker, self._probe, self._breaker_event)

    async def run(self, rows: Sequence[JobEnvironment] | RowSource) -> list[SessionRecord]:
        """Run every row (a list, or a ``RowSource`` read page by page: at most about two pools'
        worth of rows wait in memory); returns one record per finished session (cancelled ones
        are absent; empty unless ``keep_records``). Cancelling this coroutine cancels the attempts
        in flight cleanly. Raises JobStopped when the job stopped early (records so far are in
        ``records``)."""
        if not isinstance(rows, RowSource):
            rows = list(rows)
            prior = await self.store.job_attempts(rows[0].job_id) if rows else {}
            source = RowSource.of(rows, prior)
        else:
            source = rows
        with pidfd_child_watcher():
            async with gateway_client(self.ctx.gateway_url, self.ctx.gateway_api_key) as gateway:
                self._gateway = gateway
                attempts = self._attempts = Attempts(
                    self.store,
                    self.opts,
                    self.ctx,
                    self.envs,
                    gateway,
                    breaker=self.breaker,
                    executor=self._executor,
                    rng=self._rng,
                    on_grader_broken=self._grader_broken,
                )
                try:
                    if not self.opts.enable_evaluation:
                        await self._run(source)
                    else:
                        async with Grader(
                            grader_mode(None, self.opts.grader_job_mode()), work_dir=self.ctx.workspace_root
                        ) as grader:
                            await grader.start(
                                p.parent.parent for p in map(attempts.evaluator, self.envs.values()) if p
                            )
                            attempts.grader = grader
                            try:
                                await self._run(source)
                            finally:  # controls still being graded end while the grader is open
                                await attempts.aclose()
                                attempts.grader = None
                finally:
                    await attempts.aclose()  # idempotent: the workspace removals, the controls
        if self._stop_reason is not None:
            raise JobStopped(self._stop_reason, "broken_graders" if self._stop_when_told else "breaker")
        return self.records

    async def _run(self, source: RowSource) -> None:
        self._left = source.total
        self._room = asyncio.Semaphore(2 * max(1, self.opts.pool_size))
        n = min(self.opts.pool_size, max(1, source.total))
        if not source.total:
            self._put(9, None)
        feeder = self._feeder = asyncio.create_task(self._feed(source), name="pool-feed")
        self._workers = [asyncio.create_task(self._worker(), name=f"worker-{i}") for i in range(n)]
        try:
            await asyncio.wait([*self._workers, feeder], return_when=asyncio.FIRST_EXCEPTION)
            if feeder.done() and not feeder.cancelled() and feeder.exception() is not None:
                raise feeder.exception()  # type: ignore[misc]  # the rows could not be read
            while pending := [t for t in self._workers if not t.done()]:
                self._raise_if_a_worker_died()  # at once: the others would wait for its session forever
                await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            self._raise_if_a_worker_died()
        finally:
            for t in [feeder, *self._workers, *self._timers]:
                t.cancel()
            await asyncio.gather(feeder, *self._workers, *self._timers, return_exceptions=True)
            await self.breaker.aclose()

    async def _feed(self, source: RowSource) -> None:
        """Queue the rows of ``source`` in order, a page at a time, keeping at most two pools of
        them queued (a worker taking one makes room)."""
        queued = 0
        async for rows, prior in source.pages():
            for r in rows:
                await self._room.acquire()
                self._put(1, Work(r, r.attempts + 1, r.attempts + 1, list(prior.get(r.session_id, []))))
                queued += 1
        if queued < source.total:  # rows gone from the store meanwhile: the job must still end
            log.error(
                "%d planned session(s) were not found in the store and did not run", source.total - queued
            )
            for _ in range(source.total - queued):
                self._finished_one()

    def _put(self, priority: int, work: Work | None) -> None:
        self._seq += 1
        self._queue.put_nowait((priority, self._seq, work))

    def _schedule(self, work: Work, delay_s: float) -> None:
        """Queue ``work`` again after ``delay_s`` seconds, ahead of sessions not started yet."""

        async def later() -> None:
            await asyncio.sleep(delay_s)
            self._put(0, work)

        task = asyncio.create_task(later(), name=f"retry-{work.row.session_id}")
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    def _finished_one(self) -> None:
        self._left -= 1
        if self._left == 0:
            for _ in self._workers:
                self._put(9, None)

    def _breaker_event(self, ev: BreakerEvent) -> None:
        self.breaker_events.append(ev)
        if self.on_breaker:
            self.on_breaker(ev)
        if ev.state == "stopped":
            self._stop(ev.reason)

    def _stop(self, reason: str) -> None:
        """Stop the job: the attempts in flight are cancelled (resumable); ``run`` raises JobStopped."""
        self._stop_reason = reason
        if self._attempts is not None:
            self._attempts.stop_reason = reason
        for t in [*self._workers, *self._timers, *([self._feeder] if self._feeder else [])]:
            t.cancel()

    async def _probe(self) -> str | None:
        assert self._gateway is not None
        return await self._gateway.ready(self.ctx.models)

    def _grader_broken(self, env_name: str, reason: str | None) -> None:
        """Count a broken-grader finding; the job stops (resumable) once ``max_broken_graders``
        are found, after that session's record is out."""
        self._broken[env_name] += 1
        n = sum(self._broken.values())
        limit = self.opts.max_broken_graders
        if limit and n >= limit and self._stop_when_told is None:
            self._stop_when_told = (
                f"{n} broken-grader finding(s) ({', '.join(f'{e}: {k}' for e, k in sorted(self._broken.items()))}):"
                f" the grader fails without the agent (--max-broken-graders {limit}); the sessions not run are"
                " left for --resume"
            )

    def _raise_if_a_worker_died(self) -> None:
        """A worker that died of a bug fails the job loudly."""
        for t in self._workers:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]

    async def _worker(self) -> None:
        assert self._attempts is not None
        while True:
            priority, _, work = await self._queue.get()
            if work is None:
                return
            if priority == 1:
                self._room.release()
            if not await self.breaker.wait_ready():
                return
            done = await self._attempts.run(work)
            if isinstance(done, Retry):
                self._schedule(work, done.delay_s)
                continue
            if self.keep_records:
                self.records.append(done)
            self._finished_one()
            if self.on_done:
                self.on_done(done)
            if (
                self._stop_when_told is not None
                and self._stop_reason is None
                and self._left > 0  # none left: the job ended, its report names the finding
                and done.eval_status == GRADER_BROKEN  # a finding's own record is out, never cancelled
            ):
                self._stop(self._stop_when_told)
