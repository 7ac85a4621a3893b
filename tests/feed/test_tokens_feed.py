"""With token capture on the route, the feed's sequences are the exact recorded ids: a streamed
and a non-streamed call of one session merged into one sequence, the model's tokens masked, their
logprobs aligned, and the example trainer's loss input computed from them. Runs where the store
has the token columns (the gateway's token capture)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

from rollout.results.feed_schema import FeedGroupOut
from rollout.servers.feed.client import FeedClient
from store import SessionStep
from tests.fake_upstream import FakeUpstream
from tests.feed.helpers import ENV, REPO

pytestmark = pytest.mark.skipif(
    "prompt_token_ids" not in SessionStep.__table__.c,  # type: ignore[attr-defined]
    reason="this store version has no token columns (gateway token capture)",
)

RUNTIME = """
from env.runtime_kit import openai_client, run_runtime
from rollout.contract.protocol import SimulationStartResult

def main(req):
    client = openai_client(req, max_retries=0)
    msgs = [{"role": "user", "content": req.env_params["dataset"]["q"]}]
    stream = client.chat.completions.create(model=req.model, messages=msgs, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "again"}]
    client.chat.completions.create(model=req.model, messages=msgs)
    return SimulationStartResult(session_id=req.session_id, status="succeeded", metrics={"text": text})

run_runtime(main)
"""
EVALUATOR = """
def evaluate(request, spec, trajectory):
    return 10 if request.sample_index == 0 else 0
"""


def trainer_module() -> object:
    spec = importlib.util.spec_from_file_location("trainer_loop", REPO / "examples" / "trainer_loop.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


async def test_sequences_hold_the_recorded_token_ids_with_masks_and_logprobs(tmp_path: Path) -> None:
    from tests.fake_upstream import token_rule  # the scripted vLLM-style token answers

    env_dir = tmp_path / "envs" / "toy"
    (env_dir / "data").mkdir(parents=True)
    (env_dir / "runtime.py").write_text(RUNTIME)
    (env_dir / "rule_evaluator.py").write_text(EVALUATOR)
    (env_dir / "data" / "cases.jsonl").write_text(json.dumps({"id": "a", "q": "q a"}) + "\n")
    (env_dir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "toy",
                "dataset": {"format": "jsonl", "path": "data/cases.jsonl", "id_field": "id"},
                "runtime": {"command": ["{python}", "{env_dir}/runtime.py"], "timeout_s": 200},
                "max_steps": 4,
            }
        )
    )
    db = tmp_path / "t.db"
    async with FakeUpstream() as up:
        up.add_rule(token_rule())
        cfg = tmp_path / "gw.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "storage_config": {"db_url": f"sqlite://{db}"},
                    "llm_routes": {"fake": {"base_url": up.base_url, "capture": "tokens"}},
                }
            )
        )
        job = await asyncio.create_subprocess_exec(
            sys.executable,
            str(REPO / "launcher.py"),
            "--agent-root",
            str(tmp_path / "envs"),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--rl-group-size",
            "2",
            "--job-id",
            "j",
            "--no-progress",
            "--out",
            str(tmp_path / "o.jsonl"),
            env=ENV,
            cwd=str(tmp_path),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(job.communicate(), 300)
        assert job.returncode == 0, err.decode()
    feed = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "launcher.py"),
        "feed",
        "--db-path",
        f"sqlite://{db}",
        "--port",
        "0",
        env=ENV,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert feed.stdout is not None
        url = (await asyncio.wait_for(feed.stdout.readline(), 120)).decode().split()[2].rstrip("/")

        def read() -> list[FeedGroupOut]:
            with FeedClient(url) as c:
                return list(c.groups("j", wait_s=1, view="tokens"))

        (g,) = await asyncio.to_thread(read)
    finally:
        feed.terminate()
        await feed.wait()
    good = g.samples[0]
    st1, st2 = good.steps or []
    assert (
        st1.prompt_token_ids
        and st1.completion_token_ids
        and st2.prompt_token_ids
        and st2.completion_token_ids
    )
    assert st1.completion_logprobs is not None and st2.completion_logprobs is not None
    (seq,) = good.sequences or []
    assert seq.steps == [1, 2] and st2.extends_prefix is True
    assert seq.token_ids == st2.prompt_token_ids + st2.completion_token_ids
    between = len(st2.prompt_token_ids) - len(st1.prompt_token_ids) - len(st1.completion_token_ids)
    assert seq.mask == (
        [0] * len(st1.prompt_token_ids)
        + [1] * len(st1.completion_token_ids)
        + [0] * between
        + [1] * len(st2.completion_token_ids)
    )
    assert [lp for lp, m in zip(seq.logprobs, seq.mask, strict=True) if m] == (
        st1.completion_logprobs + st2.completion_logprobs
    )
    line = trainer_module().group_loss(g)  # type: ignore[attr-defined]
    lp_sum = sum(st1.completion_logprobs + st2.completion_logprobs)  # type: ignore[arg-type]
    assert good.advantage is not None and line["samples"][0]["logprob_sum"] == pytest.approx(lp_sum)
    assert line["samples"][0]["loss_term"] == pytest.approx(-good.advantage * lp_sum)
    assert line["loss"] is not None
