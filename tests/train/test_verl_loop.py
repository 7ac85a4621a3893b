"""verl's own ``AgentLoopWorker.generate_sequences`` (verl 0.9.1) driving
:class:`rollout.train.verl_loop.LauncherAgentLoop`, registered from an agent loop config YAML as
verl loads one: each prompt's ``rollout.n`` samples are one launcher job (the real gateway with
token capture, the scripted fake model behind it, a two-turn fixture env in the sandbox, graded by
its rule evaluator), and verl's ``DataProto`` holds the recorded token ids, the loss mask, the
logprobs, the graded reward, verl's ``uid`` and its staleness fields. Runs in ``.venv-verl``
(``scripts/setup_verl.sh``); skipped where verl is not importable."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

verl_agent_loop = pytest.importorskip(
    "verl.experimental.agent_loop.agent_loop",
    reason="verl is not importable here: run in .venv-verl (scripts/setup_verl.sh; docs/training.md)",
)

import numpy as np  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.protocol import DataProto  # type: ignore[import-not-found]  # noqa: E402

from rollout.jobs.options import JobOptions  # noqa: E402
from rollout.train.sync import set_policy_version  # noqa: E402
from rollout.train.trl_rollout import policy_gateway  # noqa: E402
from store import Store  # noqa: E402
from store.queries import ViewerQueries  # noqa: E402
from tests.fake_upstream import (  # noqa: E402
    IM_END,
    FakeUpstream,
    fake_completion_ids,
    fake_logprob,
    fake_prompt_ids,
    token_rule,
)
from tests.train.toy_env import make_toy_env  # noqa: E402

RUNTIME = """
from env.runtime_kit import openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    client = openai_client(req, max_retries=0)
    msgs = [{"role": "user", "content": req.env_params["dataset"]["q"]}]
    first = client.chat.completions.create(model=req.model, messages=msgs).choices[0].message.content or ""
    msgs += [{"role": "assistant", "content": first}, {"role": "user", "content": "the tool says: ok"}]
    client.chat.completions.create(model=req.model, messages=msgs)
    return SimulationStartResult(session_id=req.session_id, status="succeeded")

run_runtime(main)
"""
EVALUATOR = """
def evaluate(request, spec, trajectory):
    return 10 if trajectory.steps[0].content == "yes" else 3
"""
ANSWER = "yes"
N = 2
VERSION = 7


def make_env(root: Path) -> None:
    make_toy_env(root, RUNTIME, EVALUATOR)


class ThreadedUpstream:
    """The fake upstream on its own event loop thread (the gateway is a child process and the
    test's own loop is verl's), answering every chat call ``ANSWER`` with token ids and logprobs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ThreadedUpstream:
        self.thread.start()
        self.up = FakeUpstream()
        asyncio.run_coroutine_threadsafe(self.up.start(), self.loop).result(30)
        self.up.add_rule(token_rule(text=ANSWER, pieces=[ANSWER]))
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.up.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def verl_config() -> Any:
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "n": N,
                    "prompt_length": 64,
                    "response_length": 96,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": -1,
                    "calculate_log_probs": True,
                    "agent": {"default_agent_loop": "launcher"},
                    "val_kwargs": {"top_p": 1.0, "top_k": -1, "temperature": 0.0},
                }
            },
            "data": {},
        }
    )


def verl_worker(config: Any, tokenizer: Any, loop_config: Path) -> Any:
    """verl's ``AgentLoopWorker`` without its Ray and model-server set-up (no LLM server: the
    launcher's sessions call the gateway), its agent loops registered from ``loop_config`` as its
    ``__init__`` does."""
    worker = verl_agent_loop.AgentLoopWorker.__new__(verl_agent_loop.AgentLoopWorker)
    worker.config, worker.rollout_config = config, config.actor_rollout_ref.rollout
    worker.llm_client, worker.tokenizer, worker.processor, worker.hf_model_type = None, tokenizer, None, None
    worker.dataset_cls, worker.tools, worker.reward_loop_worker_handles = None, [], None
    worker.distillation_enabled, worker.mm_processor_kwargs = False, {}
    for entry in OmegaConf.load(loop_config):
        verl_agent_loop._agent_loop_registry[entry.name] = entry
    return worker


async def recorded(db_url: str, job_ids: list[str]) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    store = Store(db_url)
    try:
        sessions = {r.session_id: r for j in job_ids for r in await store.job_sessions(j)}
        q = ViewerQueries(store.reader)
        steps = {sid: await q.steps(sid) for sid in sessions}
    finally:
        await store.close()
    return sessions, steps


def generate(tmp_path: Path, uids: list[str] | None) -> tuple[DataProto, str]:
    """verl's worker on two prompts (cases ``a``, ``b``), each ``N`` times; its output and the store."""
    from rollout.train.tiny import _tokenizer

    make_env(tmp_path / "envs")
    db = f"sqlite://{tmp_path / 't.db'}"
    with (
        ThreadedUpstream() as up,
        policy_gateway(tmp_path, db, up.up.base_url, retry={"max_attempts": 1}) as (cfg, gateway_url),
    ):
        job = tmp_path / "job.yaml"
        job.write_text(
            yaml.safe_dump(
                json.loads(
                    JobOptions(
                        agent_root=tmp_path / "envs",
                        env_names=["toy"],
                        gateway_base_url=gateway_url,
                        gateway_config=cfg,
                        llm_model=["policy"],
                        enable_evaluation=True,
                        db_path=db,
                        pool_size=2,
                        max_retries=0,
                    ).model_dump_json(exclude_unset=True)
                )
            )
        )
        loop_config = tmp_path / "agent_loops.yaml"
        loop_config.write_text(
            yaml.safe_dump(
                [
                    {
                        "name": "launcher",
                        "_target_": "rollout.train.verl_loop.LauncherAgentLoop",
                        "job_options": str(job),
                        "out_dir": str(tmp_path / "jobs"),
                    }
                ]
            )
        )
        set_policy_version(gateway_url, VERSION)  # the trainer's weights version, stamped on every step
        worker = verl_worker(verl_config(), _tokenizer(), loop_config)
        columns: dict[str, Any] = {
            "raw_prompt": np.array(
                [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], dtype=object
            ),
            "extra_info": np.array(
                [{"case_id": "a", "index": 0}, {"case_id": "b", "index": 1}], dtype=object
            ),
            "index": np.array([0, 1], dtype=object),
        }
        if uids is not None:
            columns["uid"] = np.array(uids, dtype=object)
        prompts = DataProto.from_single_dict(columns, meta_info={"global_steps": 1})
        batch = prompts.repeat(
            repeat_times=N, interleave=True
        )  # as verl's trainer repeats a prompt rollout.n times
        return asyncio.run(worker.generate_sequences(batch)), db


def test_verls_worker_builds_its_batch_from_launcher_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out, db = generate(tmp_path, ["uid-0", "uid-1"])
    assert len(out) == 2 * N
    nt = out.non_tensor_batch
    assert list(nt["uid"]) == [
        "uid-0",
        "uid-0",
        "uid-1",
        "uid-1",
    ]  # verl's uid, untouched (its trainer checks it)
    jobs = sorted(p.stem for p in (tmp_path / "jobs").glob("*.jsonl"))
    assert [j[:-9] for j in jobs] == [
        "verl-uid-0",
        "verl-uid-1",
    ]  # one launcher job per prompt (a unique suffix)
    sids = [str(s) for s in nt["session_id"]]
    sessions, steps = asyncio.run(recorded(db, jobs))
    assert [sessions[s].job_id for s in sids] == [jobs[0], jobs[0], jobs[1], jobs[1]]  # its n samples
    assert [sessions[s].case_id for s in sids] == ["a", "a", "b", "b"]
    assert len(set(sids)) == 2 * N
    groups = [str(g) for g in nt["group_id"]]
    assert groups[0] == groups[1] != groups[2] == groups[3]  # a prompt's samples: one launcher group
    assert all(sessions[s].group_id == g for s, g in zip(sids, groups, strict=True))
    assert (
        list(nt["min_global_steps"]) == list(nt["max_global_steps"]) == [VERSION] * 4
    )  # verl's staleness fields
    prompt_len, resp_len = 64, 96
    for i, sid in enumerate(sids):
        case = sessions[sid].case_id
        s1, s2 = (st for st in steps[sid] if st["status"] == "ok")
        p1 = fake_prompt_ids([{"role": "user", "content": f"say {case}"}])
        c1 = fake_completion_ids(ANSWER)
        p2 = fake_prompt_ids(
            [
                {"role": "user", "content": f"say {case}"},
                {"role": "assistant", "content": ANSWER},
                {"role": "user", "content": "the tool says: ok"},
            ]
        )
        assert (s1["prompt_token_ids"], s1["completion_token_ids"], s2["prompt_token_ids"]) == (p1, c1, p2)
        between = p2[len(p1) + len(c1) :]
        response = c1 + between + c1
        mask = [1] * len(c1) + [0] * len(between) + [1] * len(c1)
        row = out.batch
        prompt_ids = row["prompts"][i].tolist()
        assert prompt_ids[prompt_len - len(p1) :] == p1  # verl left-pads the prompt
        assert row["attention_mask"][i].tolist() == (
            [0] * (prompt_len - len(p1))
            + [1] * len(p1)
            + [1] * len(response)
            + [0] * (resp_len - len(response))
        )
        assert row["responses"][i].tolist()[: len(response)] == response
        assert row["response_mask"][i].tolist() == mask + [0] * (resp_len - len(response))
        assert (
            row["input_ids"][i].tolist()[prompt_len - len(p1) : prompt_len + len(response)] == p1 + response
        )
        logprobs = [fake_logprob(t) for t in c1] + [0.0] * len(between) + [fake_logprob(t) for t in c1]
        assert row["rollout_log_probs"][i].tolist() == logprobs + [0.0] * (resp_len - len(response))
        reward = [0.0] * resp_len
        reward[len(response) - 1] = 10.0  # the graded reward on the last response token
        assert row["rm_scores"][i].tolist() == reward and sessions[sid].reward == 10.0
        assert c1[-1] == IM_END and nt["__num_turns__"][i] == 4
        assert nt["policy_versions"][i] == [VERSION] and nt["case_id"][i] == case
        assert {s1["policy_version"], s2["policy_version"]} == {VERSION}


def test_without_verls_uid_the_launcher_group_is_the_uid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out, db = generate(tmp_path, None)
    nt = out.non_tensor_batch
    jobs = sorted(p.stem for p in (tmp_path / "jobs").glob("*.jsonl"))
    assert [j[:-9] for j in jobs] == ["verl-a-0", "verl-b-1"]  # keyed by case and row index
    sessions, _ = asyncio.run(recorded(db, jobs))
    groups = [sessions[str(s)].group_id for s in nt["session_id"]]
    assert groups[0] == groups[1] != groups[2] == groups[3]
    assert list(nt["uid"]) == groups == list(nt["group_id"])  # GRPO groups verl's rows by the launcher group
