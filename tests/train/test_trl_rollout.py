"""TRL's GRPOTrainer trained for 2 steps on launcher jobs: a tiny model built in memory served by
the policy server, a real gateway (token capture) in front of it, the real launcher running a
two-turn fixture env in the sandbox and grading it with its rule evaluator. The rows TRL received
are the recorded steps' token ids exactly (read back from the store), masked 1 on the model's
tokens and 0 on the environment's, with the graded rewards; an injected infrastructure failure
(the upstream answers 503 to one sample) never reaches the batch: its case is run again."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollout.jobs.options import JobOptions
from store import SessionStep, Store
from store.queries import ViewerQueries
from tests.fake_upstream import FakeRequest, FakeUpstream, Reply
from tests.train.toy_env import make_toy_env

pytestmark = [
    pytest.mark.train,
    pytest.mark.skipif(
        "prompt_token_ids" not in SessionStep.__table__.c,  # type: ignore[attr-defined]
        reason="this store version has no token columns (gateway token capture)",
    ),
    # TRL 1.16 still calls transformers' names deprecated in v5 (``is_gradient_checkpointing``)
    pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning"),
]

FAIL = "FAIL-ME"
RUNTIME = f"""
from env.runtime_kit import openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    client = openai_client(req, max_retries=0)
    q = req.env_params["dataset"]["q"] + (" {FAIL}" if req.metadata["sample_index"] == 1 else "")
    msgs = [{{"role": "user", "content": q}}]
    first = client.chat.completions.create(model=req.model, messages=msgs).choices[0].message.content or ""
    msgs += [{{"role": "assistant", "content": first}}, {{"role": "user", "content": "the tool says: ok"}}]
    client.chat.completions.create(model=req.model, messages=msgs)
    return SimulationStartResult(session_id=req.session_id, status="succeeded")

run_runtime(main)
"""
EVALUATOR = """
def evaluate(request, spec, trajectory):
    return 10 if len(trajectory.steps[0].content or "") % 2 == 0 else 0
"""


def make_env(root: Path) -> None:
    make_toy_env(root, RUNTIME, EVALUATOR)


class FaultyProxy:
    """The fake upstream, on its own event loop thread, in front of the policy server: a call
    whose messages contain ``FAIL`` gets a 503 (an upstream outage), every other is forwarded."""

    def __init__(self, target: str) -> None:
        self.target, self.failed, self.forwarded = target, 0, 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def rule(self, req: FakeRequest) -> Reply | None:
        if (
            req.method != "POST"
            or not req.path.endswith("/chat/completions")
            or not isinstance(req.json, dict)
        ):
            return None
        if FAIL in json.dumps(req.json.get("messages")):
            self.failed += 1
            return Reply.json({"error": {"message": "overloaded", "type": "server_error"}}, status=503)
        self.forwarded += 1
        session = {"X-Session-Id": req.headers["x-session-id"]} if "x-session-id" in req.headers else {}
        r = httpx.post(self.target + "/chat/completions", json=req.json, headers=session, timeout=600)
        return Reply.json(r.json(), status=r.status_code)

    def __enter__(self) -> FaultyProxy:
        self.thread.start()
        self.up = FakeUpstream()
        asyncio.run_coroutine_threadsafe(self.up.start(), self.loop).result(30)
        self.up.add_rule(self.rule)
        self.url = self.up.base_url
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.up.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def unpad(row: Any, mask: Any) -> list[int]:
    return [int(t) for t, m in zip(row.tolist(), mask.tolist(), strict=True) if m]


async def recorded(db_url: str, job_ids: list[str]) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    store = Store(db_url)
    try:
        sessions = {r.session_id: r for j in job_ids for r in await store.job_sessions(j)}
        q = ViewerQueries(store.reader)
        steps = {sid: await q.steps(sid) for sid in sessions}
    finally:
        await store.close()
    return sessions, steps


def test_grpo_trainer_receives_the_recorded_tokens_masks_and_rewards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rollout.train.adapters import env_reward
    from rollout.train.policy_server import PolicyServer
    from rollout.train.sync import PolicySync
    from rollout.train.tiny import tiny_policy
    from rollout.train.trl_rollout import JobRollout, policy_gateway

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    monkeypatch.chdir(tmp_path)
    make_env(tmp_path / "envs")
    db = f"sqlite://{tmp_path / 't.db'}"
    model, tokenizer = tiny_policy(seed=0)
    seen: list[dict[str, Any]] = []
    with (
        PolicyServer(model, tokenizer, seed=0, max_tokens_cap=12) as server,
        FaultyProxy(server.base_url) as up,
        policy_gateway(tmp_path, db, up.url, retry={"max_attempts": 1}) as (cfg, gateway_url),
    ):
        template = JobOptions(
            agent_root=tmp_path / "envs",
            env_names=["toy"],
            gateway_base_url=gateway_url,
            gateway_config=cfg,
            llm_model=["policy"],
            enable_evaluation=True,
            db_path=db,
            pool_size=2,
            max_retries=0,
        )
        rollout = JobRollout(
            template, num_generations=2, job_prefix="t", out_dir=tmp_path / "jobs", keep_batches=True
        )
        args = GRPOConfig(
            output_dir=str(tmp_path / "trl"),
            per_device_train_batch_size=2,
            num_generations=2,
            max_completion_length=1024,
            learning_rate=1e-3,
            beta=0.0,
            use_cpu=True,
            report_to=[],
            max_steps=2,
            save_strategy="no",
            bf16=False,
            seed=0,
            activation_checkpointing=False,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=env_reward,
            args=args,
            processing_class=tokenizer,
            train_dataset=Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}]),
            rollout_func=rollout.rollout_func,
            callbacks=[PolicySync(server.lock, gateway_url)],
        )
        score = trainer._generate_and_score_completions

        def spy(inputs: Any) -> Any:
            out = score(inputs)
            seen.append(out)
            return out

        trainer._generate_and_score_completions = spy  # type: ignore[method-assign]
        model.train()
        trainer.train()
    jobs = sorted(p.stem for p in (tmp_path / "jobs").glob("*.jsonl"))
    assert jobs == ["t-step0001", "t-step0001-rerun1", "t-step0002", "t-step0002-rerun1"]
    sessions, steps = asyncio.run(recorded(db, jobs))
    assert len(rollout.batches) == len(seen) == 2 and up.failed == 2
    infra = {sid for sid, s in sessions.items() if s.eval_status == "infra_error"}
    assert len(infra) == 2 and all(sessions[s].outcome == "upstream_unavailable" for s in infra)
    for version, (batch, got) in enumerate(zip(rollout.batches, seen, strict=True)):
        sids = batch["session_id"]
        assert len(sids) == 2 and not infra & set(sids)  # no infrastructure failure in the batch
        assert len({sessions[s].case_id for s in sids}) == 1  # one group: one case, two samples
        for i, sid in enumerate(sids):
            s1, s2 = (st for st in steps[sid] if st["status"] == "ok")
            p1, c1 = s1["prompt_token_ids"], s1["completion_token_ids"]
            p2, c2 = s2["prompt_token_ids"], s2["completion_token_ids"]
            between = p2[len(p1) + len(c1) :]
            assert p2[: len(p1) + len(c1)] == p1 + c1 and between  # the env's turn extends the prefix
            assert batch["prompt_ids"][i] == p1
            assert batch["completion_ids"][i] == c1 + between + c2
            assert batch["env_mask"][i] == [1] * len(c1) + [0] * len(between) + [1] * len(c2)
            assert (
                batch["logprobs"][i]
                == s1["completion_logprobs"] + [0.0] * len(between) + s2["completion_logprobs"]
            )
            assert batch["env_reward"][i] == sessions[sid].reward and sessions[sid].eval_status == "scored"
            assert {s1["policy_version"], s2["policy_version"]} == {version}  # PolicySync's bump per step
            # what TRL itself holds for the row: the same ids and loss mask
            assert unpad(got["prompt_ids"][i], got["prompt_mask"][i]) == p1
            n = int(got["completion_mask"][i].sum())
            assert got["completion_ids"][i].tolist()[:n] == c1 + between + c2
            assert got["tool_mask"][i].tolist()[:n] == batch["env_mask"][i]
    # every later call of a session continued its token ids at the policy server (none re-rendered)
    counts = server.policy.sessions.counts if server.policy.sessions is not None else {}
    later = sum(max(0, sum(st["status"] == "ok" for st in v) - 1) for v in steps.values())
    assert later >= 4 and counts == {"continued": later, "rendered": len(steps) - len(infra), "fallback": 0}
    rewards = [r for b in rollout.batches for r in b["env_reward"]]
    assert set(rewards) <= {0.0, 10.0}
    assert [h.rows for h in rollout.history] == [2, 2] and all(h.dropped >= 1 for h in rollout.history)
