"""The feed's groups, recorded in a real SQLite store and read through the feed service, turned
into trainers' batches: exact token ids, loss masks (1 model, 0 tool/environment), aligned
logprobs and the graded reward; invalid samples dropped with their reason, never zeros; TRL's own
GRPOTrainer consuming the ``rollout_func`` output."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollout.results.feed_schema import FeedGroupOut, GroupPage
from rollout.servers.feed.app import FeedSettings, create_feed_app
from rollout.train.adapters import (
    ENV_TOKEN_LOGPROB,
    Dropped,
    TrainSample,
    VerifiersRollout,
    convert,
    env_reward,
    to_skyrl,
    to_slime,
    to_trl,
    to_verifiers,
    to_verl,
    train_sample,
)
from store import SessionStep, Store
from store.feed import FeedQueries
from tests.feed.helpers import finish, session, step
from tests.train.shapes import SLIME_SAMPLE_FIELDS, SLIME_STATUSES, AgentLoopOutput, GeneratorOutput

pytestmark = pytest.mark.skipif(
    "prompt_token_ids" not in SessionStep.__table__.c,  # type: ignore[attr-defined]
    reason="this store version has no token columns (gateway token capture)",
)

EOS = 65


def tok(
    sid: str,
    seq: int,
    prompt: list[int] | None,
    completion: list[int] | None,
    logprobs: list[float | None] | None,
    version: int | None,
    **kw: Any,
) -> SessionStep:
    row = step(
        sid,
        seq,
        f"answer {seq}",
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=logprobs,
        policy_version=version,
    )
    for name, value in kw.items():  # finish_reason, status
        setattr(row, name, value)
    return row


# g1: a 2-turn session whose second prompt extends the first prompt + completion (tool tokens 20, 21
#     between), a 1-turn one, and a 2-turn one whose second prompt rewrote the history;
# g2: an infrastructure failure (no steps) and a valid 1-turn session;
# g3: a broken grader and a valid session recorded without token ids;
# g4: two valid sessions, one without logprobs.
STEPS = {
    "g1-0": [
        tok("g1-0", 1, [1, 2, 3], [10, 11, EOS], [-0.1, -0.2, -0.3], 3),
        tok("g1-0", 2, [1, 2, 3, 10, 11, EOS, 20, 21], [12, EOS], [-0.4, -0.5], 4),
    ],
    "g1-1": [tok("g1-1", 1, [1, 2, 3], [13, EOS], [-0.6, -0.7], 4)],
    "g1-2": [
        tok("g1-2", 1, [1, 2, 3], [14, EOS], [-0.8, -0.9], 4),
        tok("g1-2", 2, [1, 2, 3, 99, 20], [15, EOS], [-1.0, -1.1], 4),
    ],
    "g2-0": [],
    "g2-1": [tok("g2-1", 1, [4, 5], [16, EOS], [-0.1, -0.1], 5)],
    "g3-0": [tok("g3-0", 1, [6], [17, EOS], [-0.1, -0.1], 5)],
    "g3-1": [step("g3-1", 1, "no tokens")],
    "g4-0": [tok("g4-0", 1, [7, 8], [18, EOS], [-0.2, -0.3], 5)],
    "g4-1": [tok("g4-1", 1, [7, 8], [19, 30, EOS], None, 5, finish_reason="length", status="truncated")],
}
SCORES: dict[str, tuple[float | None, str | None, dict[str, Any]]] = {
    "g1-0": (10.0, "scored", {}),
    "g1-1": (0.0, "scored", {}),
    "g1-2": (5.0, "scored", {}),
    "g2-0": (None, "infra_error", {"status": "error", "outcome": "setup_failed"}),
    "g2-1": (7.0, "scored", {}),
    "g3-0": (None, "grader_broken", {"eval_reason": "grader bug"}),
    "g3-1": (10.0, "scored", {}),
    "g4-0": (10.0, "scored", {}),
    "g4-1": (2.0, "scored", {}),
}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = Store(f"sqlite://{tmp_path}/t.db")
    await s.init()
    await s.add_job_sessions(
        [session(sid, "j", sid[:2], int(sid[3:]), case=f"case-{sid[:2]}") for sid in STEPS]
    )
    await s.write_batch([st for rows in STEPS.values() for st in rows], [])
    for sid, (score, status, extra) in SCORES.items():
        await finish(s, sid, score, status, **extra)
    yield s
    await s.close()


async def read_groups(store: Store, **params: Any) -> list[FeedGroupOut]:
    app = create_feed_app(FeedQueries(store.reader), FeedSettings(min_valid=1))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://feed") as c:
        r = await c.get("/v1/jobs/j/groups", params={"view": "tokens", **params})
        assert r.status_code == 200, r.text
    groups = GroupPage.model_validate(r.json()).groups
    return sorted(groups, key=lambda g: g.group_id)


def by_session(samples: list[TrainSample]) -> dict[str, TrainSample]:
    return {s.session_id: s for s in samples}


async def test_samples_become_one_exact_sequence_and_invalid_ones_are_dropped_with_reasons(
    store: Store,
) -> None:
    conv = convert(await read_groups(store))
    got = by_session(conv.samples)
    assert sorted(got) == ["g1-0", "g1-1", "g2-1", "g4-0", "g4-1"]
    two = got["g1-0"]
    assert two.prompt_ids == [1, 2, 3]
    assert two.completion_ids == [10, 11, EOS, 20, 21, 12, EOS]
    assert two.completion_mask == [1, 1, 1, 0, 0, 1, 1]
    assert two.completion_logprobs == [-0.1, -0.2, -0.3, ENV_TOKEN_LOGPROB, ENV_TOKEN_LOGPROB, -0.4, -0.5]
    assert (two.reward, two.steps, two.policy_versions, two.truncated) == (10.0, [1, 2], [3, 4], False)
    assert two.advantage is not None and two.advantage > 0
    one = got["g1-1"]
    assert (one.prompt_ids, one.completion_ids, one.completion_mask, one.reward) == (
        [1, 2, 3],
        [13, EOS],
        [1, 1],
        0.0,
    )
    assert got["g4-1"].completion_logprobs == [None, None, None] and got["g4-1"].truncated
    reasons = {(d.group_id, d.session_id): d.reason for d in conv.dropped}
    assert reasons == {
        (
            "g1",
            "g1-2",
        ): "not one sequence: step 2 does not extend the previous prompt + completion (2 sequences)",
        ("g2", "g2-0"): "invalid: infrastructure failure (setup_failed)",
        ("g3", "g3-0"): "invalid: evaluation grader_broken: grader bug",
        ("g3", "g3-1"): "no token ids on step 1 (a route without token capture)",
    }


async def test_trl_rollout_output_holds_whole_groups_of_num_generations(store: Store) -> None:
    groups = await read_groups(store)
    batch = to_trl(groups, num_generations=2)
    assert batch.group_ids == ["g1", "g4"]
    out = batch.output
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward", "session_id"}
    assert out["session_id"] == ["g1-0", "g1-1", "g4-0", "g4-1"]
    assert out["prompt_ids"] == [[1, 2, 3], [1, 2, 3], [7, 8], [7, 8]]
    assert out["completion_ids"] == [[10, 11, EOS, 20, 21, 12, EOS], [13, EOS], [18, EOS], [19, 30, EOS]]
    assert out["env_mask"] == [[1, 1, 1, 0, 0, 1, 1], [1, 1], [1, 1], [1, 1, 1]]
    assert out["logprobs"] == [
        [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5],
        [-0.6, -0.7],
        [-0.2, -0.3],
        [None, None, None],
    ]
    assert out["env_reward"] == [10.0, 0.0, 10.0, 2.0]
    for key in ("completion_ids", "logprobs", "env_mask"):
        assert [len(x) for x in out[key]] == [7, 2, 2, 3]
    group_drops = {d.group_id: d.reason for d in batch.dropped if d.session_id is None}
    assert group_drops == {
        "g2": "1 of 2 samples convertible, fewer than num_generations=2",
        "g3": "0 of 2 samples convertible, fewer than num_generations=2",
    }
    assert len(batch.dropped) == 2 + 4  # the two groups, and the four samples of test above
    one = to_trl(groups, num_generations=1)
    assert one.group_ids == ["g1", "g2", "g4"]
    assert ("g1", "g1-1", "beyond num_generations=1") in [
        (d.group_id, d.session_id, d.reason) for d in one.dropped
    ]
    assert env_reward([], [], env_reward=out["env_reward"]) == [10.0, 0.0, 10.0, 2.0]
    with pytest.raises(ValueError):
        to_trl(groups, num_generations=0)


async def test_untrainable_and_stale_groups_are_dropped_whole(store: Store) -> None:
    groups = await read_groups(store, max_policy_lag=1)  # newest version 5: g1 (version 3) is 2 behind
    g1 = next(g for g in groups if g.group_id == "g1")
    assert "stale" in g1.flags and not g1.trainable
    batch = to_trl(groups, num_generations=2)
    assert batch.group_ids == ["g4"]
    assert Dropped("g1", None, "group not trainable: stale") in batch.dropped
    conv = convert(groups)
    assert "g1-0" not in by_session(conv.samples)
    assert Dropped("g1", None, "group not trainable: stale") in conv.dropped


async def test_scores_view_is_refused(store: Store) -> None:
    (g1, *_) = await read_groups(store, view="scores")
    with pytest.raises(ValueError, match="view=tokens"):
        train_sample(g1, g1.samples[0])


# importing verl (in .venv-verl) imports Ray's state API from its old path
@pytest.mark.filterwarnings("ignore:Ray state API is no longer experimental:DeprecationWarning")
async def test_verl_agent_loop_output_matches_verls_fields(store: Store) -> None:
    got = by_session(convert(await read_groups(store)).samples)
    out = AgentLoopOutput.model_validate(to_verl(got["g1-0"]))  # verl's shape, strict, no unknown field
    assert out.prompt_ids == [1, 2, 3] and out.response_ids == [10, 11, EOS, 20, 21, 12, EOS]
    assert out.response_mask == [1, 1, 1, 0, 0, 1, 1]
    assert out.response_logprobs == [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5]
    assert (out.reward_score, out.num_turns) == (10.0, 4)
    assert out.extra_fields["session_id"] == "g1-0" and out.extra_fields["policy_versions"] == [3, 4]
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (
        3,
        4,
    )  # verl's names
    unknown = AgentLoopOutput.model_validate(to_verl(got["g4-1"]))
    assert unknown.response_logprobs is None and unknown.reward_score == 2.0  # all or none
    try:
        from rollout.train.adapters import verl_agent_loop_output

        real = verl_agent_loop_output(got["g1-0"])
    except ImportError:
        return  # verl is not installed: its shape is the fixture above
    assert real.response_ids == out.response_ids and real.reward_score == 10.0


async def test_skyrl_and_slime_shapes(store: Store) -> None:
    got = by_session(convert(await read_groups(store)).samples)
    samples = [got["g1-0"], got["g1-1"]]
    sky = to_skyrl(samples)
    assert set(sky) == set(GeneratorOutput.__annotations__)
    assert sky["loss_masks"] == [[1, 1, 1, 0, 0, 1, 1], [1, 1]]
    assert sky["rewards"] == [10.0, 0.0] and sky["stop_reasons"] == ["stop", "stop"]
    assert sky["rollout_logprobs"] == [[-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5], [-0.6, -0.7]]
    assert sky["trajectory_ids"] == [
        {"instance_id": "g1", "repetition_id": 0},
        {"instance_id": "g1", "repetition_id": 1},
    ]
    assert to_skyrl([got["g4-0"], got["g4-1"]])["rollout_logprobs"] is None
    sl = to_slime(got["g1-0"], group_index=3)
    assert set(sl) <= SLIME_SAMPLE_FIELDS and sl["status"] in SLIME_STATUSES
    assert sl["tokens"] == [1, 2, 3, 10, 11, EOS, 20, 21, 12, EOS] and sl["response_length"] == 7
    assert len(sl["loss_mask"]) == len(sl["rollout_log_probs"]) == sl["response_length"]
    assert (sl["reward"], sl["group_index"], sl["index"], sl["weight_versions"]) == (10.0, 3, 0, ["3", "4"])
    assert to_slime(got["g4-1"], group_index=0)["status"] == "truncated"


def _tiny_trl_parts() -> tuple[Any, Any]:
    """A tokenizer and a one-layer causal LM built in memory (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(EOS)} | {"<eos>": EOS, "<pad>": EOS + 1, "<unk>": EOS + 2}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # type: ignore[assignment]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=EOS + 1,
        eos_token_id=EOS,
        bos_token_id=None,
    )
    return tokenizer, LlamaForCausalLM(config)


# TRL 1.16 still calls transformers' names deprecated in v5 (``is_gradient_checkpointing``)
@pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning")
async def test_trls_grpo_trainer_trains_on_the_rollout_output(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("trl")
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    groups = {g.case_id: g for g in await read_groups(store)}
    seen: list[list[str]] = []

    def rollout_func(prompts: list[str], trainer: Any) -> dict[str, list[Any]]:
        cases = [p for i, p in enumerate(prompts) if i % 2 == 0]  # each prompt comes num_generations times
        assert prompts == [c for c in cases for _ in range(2)]
        batch = to_trl([groups[c] for c in cases], num_generations=2)
        assert batch.group_ids == [groups[c].group_id for c in cases]  # the prompts' groups, all whole
        seen.append(batch.output["session_id"])
        return batch.output

    tokenizer, model = _tiny_trl_parts()
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=16,
        use_cpu=True,
        report_to=[],
        max_steps=1,
        save_strategy="no",
        bf16=False,
        seed=0,
        activation_checkpointing=False,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list([{"prompt": "case-g1"}, {"prompt": "case-g4"}]),
        rollout_func=rollout_func,
    )
    scored = trainer._generate_and_score_completions(
        [{"prompt": c} for c in ("case-g1",) * 2 + ("case-g4",) * 2]
    )
    assert scored["completion_ids"][0].tolist() == [10, 11, EOS, 20, 21, 12, EOS]
    assert scored["tool_mask"][0].tolist() == [1, 1, 1, 0, 0, 1, 1]  # TRL's loss mask: env tokens out
    assert scored["tool_mask"][1].tolist()[:2] == [1, 1]
    adv = scored["advantages"].tolist()  # GRPO over each group's env_reward: (10, 0) and (10, 2)
    assert adv[0] > 0 > adv[1] and adv[2] > 0 > adv[3]
    assert adv[0] == pytest.approx(-adv[1]) and adv[2] == pytest.approx(-adv[3])
    assert scored["num_items_in_batch"].item() == 5 + 2 + 2 + 3  # model tokens only
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    assert seen and all(set(s) <= {"g1-0", "g1-1", "g4-0", "g4-1"} for s in seen)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


async def test_verifiers_turns_round_trip_through_verifiers_own_types(store: Store) -> None:
    vf_types = pytest.importorskip("verifiers.types", reason="verifiers is not installed")
    from pydantic import TypeAdapter

    groups = await read_groups(store)
    out = {s.session_id: to_verifiers(g, s) for g in groups for s in g.samples}
    rows = {sid: r for sid, r in out.items() if isinstance(r, VerifiersRollout)}
    assert sorted(rows) == ["g1-0", "g1-1", "g1-2", "g2-1", "g4-0"]  # g1-2: per turn, no prefix needed
    dropped = {sid: r.reason for sid, r in out.items() if isinstance(r, Dropped)}
    assert dropped == {
        "g2-0": "invalid: infrastructure failure (setup_failed)",
        "g3-0": "invalid: evaluation grader_broken: grader bug",
        "g3-1": "no token ids on step 1 (a route without token capture)",
        "g4-1": "no logprobs on step 1",
    }
    two = rows["g1-0"]
    assert (two.group_id, two.case_id, two.trajectory_id, two.sample_index, two.reward, two.is_truncated) == (
        "g1",
        "case-g1",
        "g1-0",
        0,
        10.0,
        False,
    )
    assert (two.turn_seqs, two.turn_versions) == ([1, 2], [3, 4])
    assert two.turns == [
        {
            "prompt_ids": [1, 2, 3],
            "prompt_mask": [0, 0, 0],
            "completion_ids": [10, 11, EOS],
            "completion_mask": [1, 1, 1],
            "completion_logprobs": [-0.1, -0.2, -0.3],
            "overlong_prompt": False,
            "is_truncated": False,
            "routed_experts": None,
        },
        {
            "prompt_ids": [1, 2, 3, 10, 11, EOS, 20, 21],
            "prompt_mask": [0] * 8,
            "completion_ids": [12, EOS],
            "completion_mask": [1, 1],
            "completion_logprobs": [-0.4, -0.5],
            "overlong_prompt": False,
            "is_truncated": False,
            "routed_experts": None,
        },
    ]
    assert rows["g1-2"].turns[1]["prompt_ids"] == [1, 2, 3, 99, 20]
    step_tokens = TypeAdapter(vf_types.TrajectoryStepTokens)
    response_fields = set(vf_types.ResponseTokens.model_fields)
    for r in rows.values():
        for turn in r.turns:
            assert step_tokens.validate_python(turn, strict=True) == turn
            resp = vf_types.ResponseTokens(**{k: v for k, v in turn.items() if k in response_fields})
            assert resp.model_dump(include=response_fields - {"multi_modal_data", "prompt_attribution"}) == {
                k: turn[k] for k in response_fields - {"multi_modal_data", "prompt_attribution"}
            }
