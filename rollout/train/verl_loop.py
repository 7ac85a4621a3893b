"""verl's agent loop on launcher jobs (docs/training.md, "verl's agent loop").

:class:`LauncherAgentLoop` is a verl 0.9.1 ``AgentLoopBase``: each ``run`` is one sample of a
dataset row's case, drawn from a launcher job (sessions through the gateway, in the sandbox, graded
by the env's rule evaluator) run with :class:`~rollout.train.trl_rollout.JobRollout`'s machinery;
the ``rollout.n`` calls that share verl's ``uid`` (one prompt's repeats) share one job, so their
samples are one launcher group. The output is :func:`~rollout.train.adapters.to_verl`'s: exact
token ids, the loss mask, the sampling logprobs, the graded reward and verl's staleness fields.
Needs verl, so it runs in ``.venv-verl`` (``scripts/setup_verl.sh``), not beside the ``train`` extra.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from verl.experimental.agent_loop.agent_loop import (  # type: ignore[import-not-found]
    AgentLoopBase,
    AgentLoopOutput,
)

from rollout.jobs.options import JobOptions
from rollout.train.adapters import TrainSample, to_verl
from rollout.train.trl_rollout import Collected, JobRollout

__all__ = ["LauncherAgentLoop", "load_job_options"]

log = logging.getLogger(__name__)


def load_job_options(source: str | Path | Mapping[str, Any]) -> JobOptions:
    """The job template: a mapping of ``JobOptions`` fields, or a YAML/JSON file of them."""
    if isinstance(source, Mapping):
        return JobOptions.model_validate(dict(source))
    data = yaml.safe_load(Path(source).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{source}: not a mapping of JobOptions fields")
    return JobOptions.model_validate(data)


@dataclass
class _Draw:
    """One job's samples of a case, handed out one per ``run`` call in arrival order."""

    task: asyncio.Task[Collected]
    taken: int = 0


_DRAWS: dict[str, _Draw] = {}
"""The job in flight per verl ``uid``, shared by the loop instances (verl makes one per sample)."""

_JOB_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
"""One job at a time per event loop: a job's pool installs the process's child watcher for its
sandboxed runtimes, so two jobs in one process would swap it under each other."""


async def _one_job_at_a_time(
    rollout: JobRollout, case_id: str, n: int, tag: str, temperature: float | None
) -> Collected:
    lock = _JOB_LOCKS.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with lock:
        return await rollout.collect([case_id], n, tag, temperature=temperature)


class LauncherAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """verl's agent loop: the row's case (``extra_info["case_id"]``) run as a launcher job.

    Constructor keywords (from the agent loop config YAML, next to ``_target_``): ``job_options``
    (a YAML/JSON file or mapping of ``JobOptions``: env, gateway, route, store, sandbox),
    ``job_prefix`` (default ``verl``), ``out_dir`` (each job's JSONL), ``max_reruns`` (default 2)."""

    def __init__(
        self,
        *args: Any,
        job_options: str | Path | Mapping[str, Any],
        job_prefix: str = "verl",
        out_dir: str | None = None,
        max_reruns: int = 2,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("name", None)  # the registry entry's own name, passed along by hydra
        super().__init__(*args, **kwargs)
        self.template = load_job_options(job_options)
        self.job_prefix, self.max_reruns = job_prefix, max_reruns
        self.out_dir = Path(out_dir) if out_dir else None

    def _draw(self, uid: str, case_id: str, temperature: float | None) -> tuple[_Draw, int]:
        n = int(self.rollout_config.n)
        draw = _DRAWS.get(uid)
        if draw is None:  # the uid's first call, or one past its rollout.n: a job of its own
            rollout = JobRollout(
                self.template, n, job_prefix=self.job_prefix, out_dir=self.out_dir, max_reruns=self.max_reruns
            )
            tag = f"{uid}-{uuid.uuid4().hex[:8]}"  # unique: a row without verl's uid keys on case and index
            draw = _Draw(asyncio.ensure_future(_one_job_at_a_time(rollout, case_id, n, tag, temperature)))
            _DRAWS[uid] = draw
        index = draw.taken
        draw.taken += 1
        if draw.taken >= n:
            del _DRAWS[uid]
        return draw, index

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One trained sample of the row's case as verl's ``AgentLoopOutput``. The job runs at
        ``sampling_params["temperature"]``; ``top_p``/``top_k`` are the route's. A case short of
        trainable samples after the reruns raises ``ShortBatchError``."""
        extra = kwargs.get("extra_info") or {}
        case_id = extra.get("case_id") if isinstance(extra, Mapping) else None
        if not isinstance(case_id, str) or not case_id:
            raise ValueError(
                f"the row has no extra_info['case_id'] (the launcher case to run): {json.dumps(extra)}"
            )
        uid = str(kwargs.get("uid") or f"{case_id}-{kwargs.get('index', 0)}")
        temperature = sampling_params.get("temperature")
        draw, index = self._draw(uid, case_id, None if temperature is None else float(temperature))
        got = await draw.task
        sample: TrainSample = got.samples[case_id][index]
        fields = to_verl(sample)
        if "uid" not in kwargs:  # verl's own uid, when it gave one, stays: its trainer checks it after
            fields["extra_fields"]["uid"] = got.samples[case_id][0].group_id
        log.debug("verl uid %s: sample %d of case %s is session %s", uid, index, case_id, sample.session_id)
        return AgentLoopOutput(**fields)
