"""TRL's ``rollout_func`` on launcher jobs (docs/training.md, "Training with TRL").

Each call runs the prompts' cases as one launcher job (``run_job``: sessions x samples through
the gateway, in the sandbox, graded by the env's rule evaluator), reads the job's groups through
the feed's group logic (``load_groups``, ``view=tokens``) and converts them with the adapters: the
exact token ids, the loss mask (1 model, 0 tool/environment), the sampling logprobs and the graded
reward. A sample that cannot be trained on (infrastructure failure, evaluator error, not one
sequence, ...) is never a row: its case is run again for the missing samples, at most
``max_reruns`` more jobs, else :class:`ShortBatchError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gateway.settings import GatewaySettings
from rollout.errors import RolloutError
from rollout.jobs.options import JobOptions
from rollout.jobs.processes import start_gateway
from rollout.jobs.run import run_job
from rollout.results.feed_schema import FeedGroupOut
from rollout.results.groups import GroupOptions, load_groups
from rollout.train.adapters import Dropped, TrainSample, convert, trl_rows
from store import Store
from store.feed import FeedQueries

__all__ = ["Collected", "JobRollout", "ShortBatchError", "StepStats", "batch_stats", "policy_gateway"]

PASS_SCORE = 10.0
"""A sample passes when its graded reward is at least this (the bundled envs grade 0..10)."""


@contextlib.contextmanager
def policy_gateway(
    out_dir: Path, db_url: str, upstream_url: str, route: str = "policy", **route_settings: Any
) -> Iterator[tuple[Path, str]]:
    """A gateway for a whole training run, started once (``out_dir/gateway.yaml``, logs in
    ``out_dir/logs``): its one route ``route`` goes to ``upstream_url`` (the policy server) with
    token capture, one call at a time (``route_settings`` added to the route). Yields the config
    file and the session URL, for ``JobOptions(gateway_config=..., gateway_base_url=...)``."""
    cfg = out_dir / "gateway.yaml"
    data = {
        "storage_config": {"db_url": db_url},
        "llm_routes": {
            route: {
                "base_url": upstream_url,
                "capture": "tokens",
                "max_concurrency": 1,
                "read_timeout_s": 3600,
                **route_settings,
            }
        },
    }
    cfg.write_text(yaml.safe_dump(data))
    child = asyncio.run(start_gateway(GatewaySettings.model_validate(data), out_dir / "logs"))
    try:
        yield cfg, child.url
    finally:
        child.stop()


class ShortBatchError(RolloutError, RuntimeError):
    """A case still lacked trainable samples after every rerun allowed."""


@dataclass
class Collected:
    """Samples per case id (in the order they were recorded: trainable samples, or with
    ``scores_only`` the valid samples' scores), the jobs run, and what was dropped."""

    samples: dict[str, list[Any]]
    jobs: list[str] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)


@dataclass(frozen=True)
class StepStats:
    """One batch handed to TRL: mean reward, pass rate, groups whose samples disagree (not all the
    same reward: only those carry a GRPO signal), model tokens trained (``env_mask`` ones), rows,
    samples dropped (and rerun), jobs run."""

    mean_reward: float
    pass_rate: float
    disagreeing_groups: int
    groups: int
    tokens_trained: int
    rows: int
    dropped: int
    jobs: int
    seconds: float = 0.0


def batch_stats(
    rows: dict[str, list[Any]],
    num_generations: int,
    *,
    dropped: int = 0,
    jobs: int = 0,
    pass_score: float = PASS_SCORE,
) -> StepStats:
    """The :class:`StepStats` of a ``rollout_func`` output whose groups are ``num_generations``
    consecutive rows."""
    rewards = [float(r) for r in rows["env_reward"]]
    groups = [rewards[i : i + num_generations] for i in range(0, len(rewards), num_generations)]
    return StepStats(
        mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
        pass_rate=sum(r >= pass_score for r in rewards) / len(rewards) if rewards else 0.0,
        disagreeing_groups=sum(len(set(g)) > 1 for g in groups),
        groups=len(groups),
        tokens_trained=sum(sum(m) for m in rows["env_mask"]),
        rows=len(rewards),
        dropped=dropped,
        jobs=jobs,
    )


async def read_job_samples(
    db_url: str, job_id: str
) -> tuple[list[FeedGroupOut], list[TrainSample], list[Dropped]]:
    """Every group of a finished job (the feed's groups, ``view=tokens``, one valid sample enough
    to be trainable) and their conversion."""
    store = Store(db_url)
    try:
        queries = FeedQueries(store.reader)
        gids = await queries.group_ids(job_id)
        entries = await queries.ready_entries(job_id)
        built = await load_groups(
            queries, job_id, [entries.get(g) for g in gids], gids, GroupOptions(min_valid=1, view="tokens")
        )
    finally:
        await store.close()
    groups = [g for g, _ in built]
    conv = convert(groups)
    return groups, conv.samples, conv.dropped


class JobRollout:
    """Runs cases as launcher jobs from ``template`` (its gateway, store, env, route, evaluation
    and sandbox settings; ``case_ids``, ``rl_group_size``, ``job_id``, ``out`` and
    ``llm_temperature`` are set per job) and hands TRL the recorded samples.

    ``rollout_func`` is the ``GRPOTrainer(rollout_func=...)`` argument: the prompts are case ids,
    each ``num_generations`` times in a row. ``history`` holds each call's :class:`StepStats`;
    ``batches`` (with ``keep_batches``) each call's rows as handed to TRL."""

    def __init__(
        self,
        template: JobOptions,
        num_generations: int,
        *,
        job_prefix: str = "train",
        out_dir: Path | None = None,
        max_reruns: int = 2,
        pass_score: float = PASS_SCORE,
        keep_batches: bool = False,
        on_job: Callable[[str], None] | None = None,
        calls_done: int = 0,
    ) -> None:
        if num_generations < 1:
            raise ValueError("num_generations must be at least 1")
        self.template, self.num_generations = template, num_generations
        self.job_prefix, self.out_dir, self.max_reruns = job_prefix, out_dir, max_reruns
        self.pass_score, self.keep_batches, self.on_job = pass_score, keep_batches, on_job
        self.history: list[StepStats] = []
        self.batches: list[dict[str, list[Any]]] = []
        self._calls = calls_done  # a resumed run's next job is step calls_done + 1

    async def collect(
        self,
        case_ids: Sequence[str],
        samples: int,
        tag: str,
        temperature: float | None = None,
        scores_only: bool = False,
    ) -> Collected:
        """``samples`` trainable samples (:class:`TrainSample`) of each case: one job, then reruns
        of the cases short of samples (one job for them, its group size the largest shortfall;
        extra samples are left unused) while reruns are left. ShortBatchError when a case stays
        short. ``scores_only``: the scores of valid samples instead (an evaluation needs no
        tokens: a sample that is not one sequence still counts)."""
        want = list(dict.fromkeys(case_ids))
        got = Collected({c: [] for c in want})
        stopped: list[str] = []
        for attempt in range(1 + self.max_reruns):
            short = {c: samples - len(got.samples[c]) for c in want if len(got.samples[c]) < samples}
            if not short:
                break
            job_id = f"{self.job_prefix}-{tag}" + (f"-rerun{attempt}" if attempt else "")
            update: dict[str, Any] = {
                "case_ids": sorted(short),
                "rl_group_size": max(short.values()),
                "job_id": job_id,
                "resume": False,
            }
            if temperature is not None:
                update["llm_temperature"] = temperature
            if self.out_dir is not None:
                update["out"] = self.out_dir / f"{job_id}.jsonl"
            result = await run_job(self.template.model_copy(update=update))
            if result is not None and result.stopped:
                stopped.append(f"{job_id}: {result.stopped}")
            got.jobs.append(job_id)
            if self.on_job:
                self.on_job(job_id)
            groups, converted, dropped = await read_job_samples(self.template.db_path, job_id)
            taken: list[tuple[str, Any]] = [(s.case_id, s) for s in converted]
            if scores_only:
                taken = [
                    (g.case_id, x.score) for g in groups for x in g.samples if x.valid and x.score is not None
                ]
                dropped = [
                    Dropped(g.group_id, x.session_id, f"invalid: {x.invalid_reason}")
                    for g in groups
                    for x in g.samples
                    if not x.valid
                ]
            got.dropped += dropped
            for case, x in taken:
                if case in got.samples and len(got.samples[case]) < samples:
                    got.samples[case].append(x)
        missing = {c: len(v) for c, v in got.samples.items() if len(v) < samples}
        if missing:
            reasons = sorted({d.reason for d in got.dropped})
            raise ShortBatchError(
                f"after {len(got.jobs)} job(s) ({', '.join(got.jobs)}), cases short of {samples} "
                f"trainable samples: {missing}; dropped: {reasons}"
                + (f"; stopped early: {stopped}" if stopped else "")
            )
        return got

    def rollout_func(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        """TRL's ``rollout_func``: one row per prompt, in order (``prompt_ids``, ``completion_ids``,
        ``logprobs``, ``env_mask``, ``env_reward``, ``session_id``)."""
        start = time.monotonic()
        cases = [str(p) for p in prompts]
        counts: dict[str, int] = {}
        for c in cases:
            counts[c] = counts.get(c, 0) + 1
        self._calls += 1
        got = asyncio.run(self.collect(list(counts), max(counts.values()), f"step{self._calls:04d}"))
        queues = {c: list(v) for c, v in got.samples.items()}
        rows = trl_rows([queues[c].pop(0) for c in cases])
        stats = batch_stats(
            rows,
            self.num_generations,
            dropped=len(got.dropped),
            jobs=len(got.jobs),
            pass_score=self.pass_score,
        )
        self.history.append(replace(stats, seconds=time.monotonic() - start))
        if self.keep_batches:
            self.batches.append(rows)
        return rows
