"""Group readiness in the store (the durable cursor) and what a group carries: validity,
GRPO advantages, token sequences and their masks."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from rollout.results.groups import (
    GroupOptions,
    advantages,
    build_group,
    invalid_reason,
    load_groups,
    token_sequences,
)
from store import Store
from store.feed import FeedQueries
from tests.feed.helpers import finish, make_job, step


async def test_a_group_is_ready_when_its_last_sample_finishes_in_ready_order(tmp_path: Path) -> None:
    store = Store(f"sqlite://{tmp_path}/t.db")
    await store.init()
    try:
        ids = await make_job(store, "j", {"g1": 2, "g2": 2, "g3": 1})
        q = FeedQueries(store.reader)
        await finish(store, ids["g1"][0], 10)
        await finish(store, ids["g2"][0], 3)
        assert await q.ready_after("j", 0, 10) == []  # no group complete yet
        await finish(store, ids["g2"][1], 5)  # g2 completes first
        await finish(store, ids["g3"][0], None, "infra_error", status="error", outcome="setup_failed")
        await finish(store, ids["g1"][1], 0)
        entries = await q.ready_after("j", 0, 10)
        assert [(e["ready_seq"], e["group_id"], e["revision"], e["n_samples"]) for e in entries] == [
            (1, "g2", 1, 2),
            (2, "g3", 1, 1),
            (3, "g1", 1, 2),
        ]
        assert [e["group_id"] for e in await q.ready_after("j", 1, 1)] == ["g3"]
        assert await q.progress("j") == {"sessions": 5, "finished": 5, "groups": 3, "groups_ready": 3}
        # finishing an already finished session again appends nothing
        await finish(store, ids["g1"][1], 0)
        assert [e["ready_seq"] for e in await q.ready_after("j", 0, 10)] == [1, 2, 3]
        # a resume reopens a session of a ready group: the group becomes ready again as revision 2
        await store.update_job_session(ids["g3"][0], finished=False)
        await finish(store, ids["g3"][0], 7)
        (again,) = await q.ready_after("j", 3, 10)
        assert (again["ready_seq"], again["group_id"], again["revision"]) == (4, "g3", 2)
    finally:
        await store.close()
    # durable: the entries are rows of the file
    con = sqlite3.connect(tmp_path / "t.db")
    assert con.execute("select group_id from feed_groups where job_id='j' order by ready_seq").fetchall() == [
        ("g2",),
        ("g3",),
        ("g1",),
        ("g3",),
    ]


def test_grpo_advantages_over_valid_samples_only() -> None:
    adv, mean, std = advantages([10.0, None, 0.0, 5.0])
    assert mean == 5.0 and std == pytest.approx(math.sqrt(50 / 3))
    assert adv[1] is None
    assert adv[0] == pytest.approx(5 / (math.sqrt(50 / 3) + 1e-6))
    assert adv[2] == pytest.approx(-5 / (math.sqrt(50 / 3) + 1e-6))
    assert adv[3] == 0.0
    assert advantages([10.0, None, 0.0], "none")[0] == [5.0, None, -5.0]
    assert advantages([4.0, 4.0])[0] == [0.0, 0.0]
    assert advantages([None, None]) == ([None, None], None, None)


def test_invalid_reasons_never_pass_a_zero_for_a_score() -> None:
    base = {"finished": True, "reward": 0.0}
    assert invalid_reason({**base, "eval_status": "scored"}) is None
    # a grading failure whose control graded is the agent's 0: valid (docs/trust-model.md)
    assert invalid_reason({**base, "eval_status": "error", "eval_reason": "KeyError"}) is None
    assert invalid_reason({**base, "eval_status": "timeout"}) is None
    assert (
        invalid_reason(
            {
                "finished": True,
                "reward": None,
                "eval_status": "grader_broken",
                "eval_reason": "grader broken: x",
            }
        )
        == "evaluation grader_broken: grader broken: x"
    )
    assert (
        invalid_reason(
            {"finished": True, "reward": None, "eval_status": "infra_error", "outcome": "setup_failed"}
        )
        == "infrastructure failure (setup_failed)"
    )
    assert invalid_reason({"finished": True, "reward": None, "eval_status": None}) == "not evaluated"
    assert invalid_reason({"finished": False, "reward": 5.0, "eval_status": "scored"}) == "unfinished"
    assert invalid_reason({"finished": True, "reward": float("nan"), "eval_status": "scored"}) is not None


def _tok(
    seq: int,
    prompt: list[int] | None,
    completion: list[int] | None,
    lp: list[float] | None = None,
    **kw: object,
) -> dict[str, object]:
    return {
        "seq": seq,
        "status": "ok",
        "is_trainable": True,
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "completion_logprobs": lp,
        **kw,
    }


def test_token_sequences_merge_extending_steps_and_mask_model_tokens() -> None:
    steps = [
        _tok(1, [1, 2], [3, 4], [-0.1, -0.2], policy_version=7),
        _tok(2, [1, 2, 3, 4, 5, 6], [7], [-0.3], policy_version=8),  # extends: tool output 5, 6 then 7
        _tok(3, [1, 9], [10], [-0.4]),  # history rewritten: a new sequence
        _tok(4, [1, 9, 10], [11], None),  # extends, logprobs unknown
        _tok(5, None, None),  # no token ids: breaks the sequence
        _tok(6, [1, 9, 10, 11], [12], [-0.5, -0.6]),  # logprobs of the wrong length: unknown
        {**_tok(7, [1], [2]), "is_trainable": False},  # a refunded call: left out
    ]
    s1, s2, s3 = token_sequences(steps)
    assert s1.steps == [1, 2] and s1.token_ids == [1, 2, 3, 4, 5, 6, 7]
    assert s1.mask == [0, 0, 1, 1, 0, 0, 1]
    assert s1.logprobs == [None, None, -0.1, -0.2, None, None, -0.3]
    assert s1.policy_versions == [7, 8]
    assert s2.steps == [3, 4] and s2.token_ids == [1, 9, 10, 11] and s2.mask == [0, 0, 1, 1]
    assert s2.logprobs == [None, None, -0.4, None]
    assert s3.steps == [6] and s3.mask == [0, 0, 0, 0, 1] and s3.logprobs == [None] * 5


def test_group_flags_too_few_valid_and_no_signal() -> None:
    rows = [
        {
            "env_id": f"s{k}",
            "job_id": "j",
            "group_id": "g",
            "env_name": "e",
            "case_id": "c",
            "llm_model": "m",
            "sample_index": k,
            "status": "succeeded",
            "finished": True,
            "reward": r,
            "eval_status": st,
        }
        for k, (r, st) in enumerate([(None, "grader_broken"), (6.0, "scored"), (None, "infra_error")])
    ]
    g = build_group(None, rows, {}, GroupOptions(min_valid=2))
    assert (g.n_valid, g.trainable, g.flags, g.cursor) == (1, False, ["too_few_valid"], None)
    assert [s.score for s in g.samples] == [None, 6.0, None]
    assert [s.advantage for s in g.samples] == [None, 0.0, None]
    assert [s.valid for s in g.samples] == [False, True, False]
    rows[0]["eval_status"], rows[0]["reward"] = "scored", 6.0
    g = build_group(None, rows, {}, GroupOptions(min_valid=2))
    assert (g.n_valid, g.trainable, g.flags) == (2, True, ["no_signal"])


def test_min_valid_is_at_least_one_so_a_group_without_a_valid_sample_is_never_trainable() -> None:
    rows = [
        {
            "env_id": f"s{k}",
            "job_id": "j",
            "group_id": "g",
            "env_name": "e",
            "case_id": "c",
            "llm_model": "m",
            "sample_index": k,
            "status": "succeeded",
            "finished": True,
            "reward": None,
            "eval_status": "error",
        }
        for k in range(2)
    ]
    g = build_group(None, rows, {}, GroupOptions(min_valid=1))
    assert (g.n_valid, g.trainable, g.flags, g.mean_score) == (0, False, ["too_few_valid"], None)
    for bad in (0, -3, True, 1.5):
        with pytest.raises(ValueError) as ei:
            GroupOptions(min_valid=bad)  # type: ignore[arg-type]
        assert str(ei.value) == (
            f"min_valid must be an integer >= 1 (a trainable group needs a valid sample), not {bad!r}"
        )


async def test_loaded_group_carries_steps_and_null_tokens_when_not_captured(tmp_path: Path) -> None:
    store = Store(f"sqlite://{tmp_path}/t.db")
    await store.init()
    try:
        ids = await make_job(store, "j", {"g": 2})
        await finish(store, ids["g"][0], 10)
        await finish(store, ids["g"][1], 2)
        q = FeedQueries(store.reader)
        entries = await q.ready_after("j", 0, 10)
        ((g, raw),) = await load_groups(q, "j", entries, ["g"], GroupOptions())
        assert (g.cursor, g.env, g.case_id, g.model, g.n_valid, g.trainable) == (
            1,
            "toy",
            "case-g",
            "m",
            2,
            True,
        )
        assert g.mean_score == 6.0 and g.std_score == 4.0
        assert g.ready_at is not None and g.ready_at.endswith("+00:00")
        assert [s.advantage for s in g.samples] == [pytest.approx(1.0), pytest.approx(-1.0)]
        (st,) = g.samples[0].steps or []
        assert st.messages == [{"role": "user", "content": "q1"}] and st.content == f"answer {ids['g'][0]}"
        assert (st.prompt_token_ids, st.completion_logprobs, st.policy_version) == (None, None, None)
        assert g.samples[0].sequences == []
        assert set(raw) == set(ids["g"])
        ((light, _),) = await load_groups(q, "j", entries, ["g"], GroupOptions(view="scores"))
        assert light.samples[0].steps is None and light.samples[0].score == 10.0
    finally:
        await store.close()


@pytest.mark.parametrize("view", ["full", "tokens", "scores"])
async def test_a_sample_whose_steps_span_another_route_is_invalid(tmp_path: Path, view: str) -> None:
    """A session run on route ``m`` whose steps include one answered by route ``strong`` (another
    model's tokens, e.g. recorded by a gateway that did not bind sessions to their route) is not
    trained on, whatever its score; so is one whose every step is of another route."""
    store = Store(f"sqlite://{tmp_path}/t.db")
    await store.init()
    try:
        ids = await make_job(store, "j", {"g": 3})
        mixed, foreign, clean = ids["g"]
        await store.write_batch([step(mixed, 2, "strong answer", llm_model="strong")], [])
        await store.reset_for_retry(foreign, 1)  # its steps moved away: its only step is now of "strong"
        await store.write_batch([step(foreign, 1, "strong", llm_model="strong")], [])
        for sid, score in ((mixed, 10), (foreign, 9), (clean, 2)):
            await finish(store, sid, score)
        q = FeedQueries(store.reader)
        entries = await q.ready_after("j", 0, 10)
        ((g, _),) = await load_groups(q, "j", entries, ["g"], GroupOptions(view=view, min_valid=1))  # type: ignore[arg-type]
        by_sid = {s.session_id: s for s in g.samples}
        assert (by_sid[mixed].valid, by_sid[mixed].score, by_sid[mixed].advantage) == (False, None, None)
        assert by_sid[mixed].invalid_reason == "steps of another route: strong (the session runs on m)"
        assert (by_sid[foreign].valid, by_sid[foreign].invalid_reason) == (
            False,
            "steps of another route: strong (the session runs on m)",
        )
        assert [st.model for st in by_sid[foreign].steps or []] == ([] if view == "scores" else ["strong"])
        assert (by_sid[clean].valid, by_sid[clean].score) == (True, 2.0)
        assert (g.n_valid, g.mean_score) == (1, 2.0)
    finally:
        await store.close()
