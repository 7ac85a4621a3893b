"""The feed's groups in the batch shapes of GPU trainers: TRL's ``rollout_func`` output, verl's
agent-loop output, SkyRL's generator output, slime's samples and verifiers' per-turn tokens
(docs/training.md, "Adapters").

Pure functions, no trainer imported (verl's class only in :func:`verl_agent_loop_output`, when it
is installed). Each valid sample becomes one sequence: the first step's prompt ids, then every
later token (the model's completions, mask 1; tool and environment tokens between them, mask 0).
A sample that cannot be one exact sequence is dropped with its reason, never padded with zeros:
an invalid sample (infrastructure failure, evaluator error, unscored), one without token ids,
one whose steps do not extend each other's prefix, one without a model token.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout.results.feed_schema import FeedGroupOut, FeedSample, FeedStep

ENV_TOKEN_LOGPROB = 0.0
"""The logprob written at tool/environment tokens (mask 0), as TRL's own tool loop and verl's tool
agent loop write it; those tokens are masked out of the loss."""

_TOKEN_STATUSES = frozenset({"ok", "truncated"})


@dataclass(frozen=True)
class Dropped:
    """A sample (or, with ``session_id`` None, a whole group) left out of a batch, and why."""

    group_id: str
    session_id: str | None
    reason: str


@dataclass(frozen=True)
class TrainSample:
    """One valid feed sample as one training sequence. ``completion_ids`` is everything after
    the first step's prompt; ``completion_mask[i]`` is 1 on model tokens, 0 on tool/environment
    tokens; ``completion_logprobs[i]`` is the sampling logprob of a model token (None where the
    route did not return it) and :data:`ENV_TOKEN_LOGPROB` on the others. ``reward``: the
    evaluator's score; ``advantage``: the feed's GRPO advantage. ``truncated``: the last model
    call stopped on its length limit. ``steps``: the ``seq`` of the merged steps."""

    group_id: str
    case_id: str
    session_id: str
    sample_index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    completion_logprobs: list[float | None]
    reward: float
    advantage: float | None
    policy_versions: list[int]
    steps: list[int]
    finish_reason: str | None
    truncated: bool

    @property
    def model_turns(self) -> int:
        """The number of model calls merged into the sequence."""
        return len(self.steps)

    def known_logprobs(self) -> list[float] | None:
        """``completion_logprobs`` when every model token has its logprob, else None (verl, SkyRL
        and slime take a sample's logprobs all or none)."""
        out = [lp for lp in self.completion_logprobs if lp is not None]
        return out if len(out) == len(self.completion_logprobs) else None


@dataclass
class Conversion:
    """The samples converted and those dropped (with reasons), in feed order."""

    samples: list[TrainSample] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)


def train_sample(group: FeedGroupOut, sample: FeedSample) -> TrainSample | Dropped:
    """One sample as one sequence, or why it cannot be one. ValueError for a group read without
    steps (``view=scores``): read the feed with ``view=tokens``."""

    def drop(reason: str) -> Dropped:
        return Dropped(group.group_id, sample.session_id, reason)

    if not sample.valid or sample.score is None or not math.isfinite(sample.score):
        return drop(f"invalid: {sample.invalid_reason or 'no score'}")
    if sample.steps is None or sample.sequences is None:
        raise ValueError(
            f"group {group.group_id} was read without steps (view=scores): read it with view=tokens"
        )
    model_steps = [st for st in sample.steps if st.is_trainable and st.status in _TOKEN_STATUSES]
    if not model_steps:
        return drop("no model call")
    missing = [st.seq for st in model_steps if st.prompt_token_ids is None or st.completion_token_ids is None]
    if missing:
        return drop(f"no token ids on step {', '.join(map(str, missing))} (a route without token capture)")
    if len(sample.sequences) != 1:
        starts = [s.steps[0] for s in sample.sequences[1:]]
        return drop(
            f"not one sequence: step {', '.join(map(str, starts))} does not extend the previous "
            f"prompt + completion ({len(sample.sequences)} sequences)"
        )
    (seq,) = sample.sequences
    by_seq = {st.seq: st for st in model_steps}
    first: FeedStep = by_seq[seq.steps[0]]
    n_prompt = len(first.prompt_token_ids or [])
    mask = seq.mask[n_prompt:]
    if not any(mask):
        return drop("no model token (every completion is empty)")
    last = by_seq[seq.steps[-1]]
    return TrainSample(
        group_id=group.group_id,
        case_id=group.case_id,
        session_id=sample.session_id,
        sample_index=sample.sample_index,
        prompt_ids=seq.token_ids[:n_prompt],
        completion_ids=seq.token_ids[n_prompt:],
        completion_mask=mask,
        completion_logprobs=[
            lp if m else ENV_TOKEN_LOGPROB for lp, m in zip(seq.logprobs[n_prompt:], mask, strict=True)
        ],
        reward=float(sample.score),
        advantage=sample.advantage,
        policy_versions=list(sample.policy_versions),
        steps=list(seq.steps),
        finish_reason=last.finish_reason,
        truncated=last.status == "truncated" or last.finish_reason == "length",
    )


def untrainable(group: FeedGroupOut) -> Dropped | None:
    """A group the feed flagged untrainable (too few valid samples, unfinished, stale), dropped
    whole; None for a trainable one."""
    if group.trainable:
        return None
    why = [f for f in group.flags if f != "no_signal"]
    return Dropped(group.group_id, None, f"group not trainable: {', '.join(why) or 'flagged by the feed'}")


def convert(groups: Iterable[FeedGroupOut]) -> Conversion:
    """Every sample of these trainable groups that can be one sequence; the others in
    ``dropped`` (an untrainable group as one entry)."""
    out = Conversion()
    for g in groups:
        if (whole := untrainable(g)) is not None:
            out.dropped.append(whole)
            continue
        for s in g.samples:
            r = train_sample(g, s)
            if isinstance(r, Dropped):
                out.dropped.append(r)
            else:
                out.samples.append(r)
    return out


# --- TRL -----------------------------------------------------------------------------------------


@dataclass
class TrlBatch:
    """TRL ``rollout_func`` output for whole groups of ``num_generations`` samples each.
    ``output``: the dict to return (``prompt_ids``, ``completion_ids``, ``logprobs``,
    ``env_mask``, and ``env_reward`` and ``session_id`` for the reward functions), one row per
    generation, the rows of a group consecutive; ``group_ids``: the groups in it, in order (their
    prompts are the ones the rows answer); ``dropped``: the samples and groups left out."""

    output: dict[str, list[Any]]
    group_ids: list[str]
    dropped: list[Dropped]


def trl_rows(samples: Sequence[TrainSample]) -> dict[str, list[Any]]:
    """TRL's ``rollout_func`` dict for these samples, one row each (GRPOTrainer, TRL 1.x):
    ``prompt_ids``, ``completion_ids``, ``logprobs`` (a model token's unknown logprob stays None:
    TRL reads it as NaN and gives that token no importance-sampling correction), ``env_mask``
    (1 model token, 0 tool/environment token: TRL's loss mask of the completion), and the extra
    keys ``env_reward`` (the evaluator's score) and ``session_id``, which reach the reward
    functions."""
    return {
        "prompt_ids": [list(s.prompt_ids) for s in samples],
        "completion_ids": [list(s.completion_ids) for s in samples],
        "logprobs": [list(s.completion_logprobs) for s in samples],
        "env_mask": [list(s.completion_mask) for s in samples],
        "env_reward": [s.reward for s in samples],
        "session_id": [s.session_id for s in samples],
    }


def to_trl(groups: Iterable[FeedGroupOut], num_generations: int) -> TrlBatch:
    """Whole groups for TRL's GRPOTrainer, which needs exactly ``num_generations`` consecutive
    completions per prompt: each group gives its first ``num_generations`` convertible samples
    (by sample index); a group with fewer, or one the feed flagged untrainable (``stale``
    included), is dropped whole (one entry with ``session_id`` None, plus its unconvertible
    samples), never filled. Samples beyond ``num_generations`` are dropped
    with that reason. ValueError for ``num_generations`` below 1."""
    if isinstance(num_generations, bool) or not isinstance(num_generations, int) or num_generations < 1:
        raise ValueError(f"num_generations must be an integer >= 1, not {num_generations!r}")
    kept: list[TrainSample] = []
    group_ids: list[str] = []
    dropped: list[Dropped] = []
    for g in groups:
        conv = convert([g])
        dropped.extend(conv.dropped)
        if not g.trainable:
            continue
        ok = sorted(conv.samples, key=lambda s: s.sample_index)
        if len(ok) < num_generations:
            dropped.append(
                Dropped(
                    g.group_id,
                    None,
                    f"{len(ok)} of {len(g.samples)} samples convertible, fewer "
                    f"than num_generations={num_generations}",
                )
            )
            continue
        kept.extend(ok[:num_generations])
        dropped.extend(
            Dropped(g.group_id, s.session_id, f"beyond num_generations={num_generations}")
            for s in ok[num_generations:]
        )
        group_ids.append(g.group_id)
    return TrlBatch(output=trl_rows(kept), group_ids=group_ids, dropped=dropped)


def env_reward(
    prompts: list[Any], completions: list[Any], env_reward: list[float], **_: Any
) -> list[float | None]:
    """A TRL reward function that hands back the graded reward the rollout carried
    (``env_reward`` of :func:`trl_rows`; TRL's reward functions return ``list[float | None]``)."""
    return [float(r) for r in env_reward]


# --- verl ----------------------------------------------------------------------------------------


def to_verl(sample: TrainSample) -> dict[str, Any]:
    """verl's ``AgentLoopOutput`` fields for one sample: ``prompt_ids``, ``response_ids`` (every
    token after the prompt), ``response_mask`` (1 model, 0 tool/environment), ``response_logprobs``
    (0.0 on tool tokens as verl's tool agent loop writes them; None for the whole sample when a
    model token's logprob is unknown: verl takes all or none), ``reward_score`` (the evaluator's
    score, so verl's reward manager keeps it instead of computing one), ``num_turns`` (the
    first prompt, each model call and each environment turn between two calls), ``metrics``
    (verl's timing metrics: not known here, left to their defaults) and ``extra_fields``, with
    verl's staleness fields ``min_global_steps`` / ``max_global_steps``: the oldest and newest
    policy version stamped on the sample's steps (None when none is)."""
    return {
        "prompt_ids": list(sample.prompt_ids),
        "response_ids": list(sample.completion_ids),
        "response_mask": list(sample.completion_mask),
        "response_logprobs": sample.known_logprobs(),
        "reward_score": sample.reward,
        "num_turns": 2 * sample.model_turns,
        "metrics": {},
        "extra_fields": {
            "session_id": sample.session_id,
            "group_id": sample.group_id,
            "case_id": sample.case_id,
            "policy_versions": list(sample.policy_versions),
            "advantage": sample.advantage,
            "min_global_steps": min(sample.policy_versions, default=None),
            "max_global_steps": max(sample.policy_versions, default=None),
        },
    }


def verl_agent_loop_output(sample: TrainSample) -> Any:
    """:func:`to_verl` as verl's own ``AgentLoopOutput`` (ImportError when verl is not installed)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput  # type: ignore[import-not-found]

    return AgentLoopOutput(**to_verl(sample))


# --- SkyRL ---------------------------------------------------------------------------------------


def to_skyrl(samples: Sequence[TrainSample]) -> dict[str, Any]:
    """SkyRL's ``GeneratorOutput`` for these samples: ``prompt_token_ids``, ``response_ids``,
    ``rewards`` (one per sample), ``loss_masks``, ``stop_reasons`` (the last call's finish reason),
    ``rollout_logprobs`` (None unless every model token of every sample has its logprob),
    ``trajectory_ids`` (``{"instance_id": group id, "repetition_id": sample index}``, the fields
    of SkyRL's ``TrajectoryID``), ``rollout_metrics``, ``is_last_step`` and ``sampling_masks``
    None (whole trajectories, not step-wise)."""
    logprobs = [s.known_logprobs() for s in samples]
    return {
        "prompt_token_ids": [list(s.prompt_ids) for s in samples],
        "response_ids": [list(s.completion_ids) for s in samples],
        "rewards": [s.reward for s in samples],
        "loss_masks": [list(s.completion_mask) for s in samples],
        "stop_reasons": [s.finish_reason or "" for s in samples],
        "rollout_metrics": None,
        "rollout_logprobs": None if any(lp is None for lp in logprobs) else logprobs,
        "trajectory_ids": [{"instance_id": s.group_id, "repetition_id": s.sample_index} for s in samples],
        "is_last_step": None,
        "sampling_masks": None,
    }


# --- slime ---------------------------------------------------------------------------------------


def to_slime(sample: TrainSample, group_index: int) -> dict[str, Any]:
    """slime's ``Sample`` fields for one sample (``Sample.from_dict`` reads them): ``tokens``
    (prompt + response), ``response_length``, ``loss_mask`` and ``rollout_log_probs`` over the
    response (logprobs None unless every model token has one), ``reward``, ``status``
    (``completed`` or ``truncated``), ``group_index`` (the caller's number for the group),
    ``index`` (the sample index), ``weight_versions`` (the policy versions, as text),
    ``session_id`` and ``metadata``."""
    return {
        "group_index": group_index,
        "index": sample.sample_index,
        "tokens": list(sample.prompt_ids) + list(sample.completion_ids),
        "response_length": len(sample.completion_ids),
        "reward": sample.reward,
        "loss_mask": list(sample.completion_mask),
        "rollout_log_probs": sample.known_logprobs(),
        "status": "truncated" if sample.truncated else "completed",
        "weight_versions": [str(v) for v in sample.policy_versions],
        "session_id": sample.session_id,
        "metadata": {"group_id": sample.group_id, "case_id": sample.case_id, "advantage": sample.advantage},
    }


# --- verifiers -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifiersRollout:
    """One sample as verifiers' per-turn token records: ``turns`` are its model calls in order,
    each a dict of the fields of verifiers' ``TrajectoryStepTokens`` (``prompt_ids``,
    ``prompt_mask`` 0s, ``completion_ids``, ``completion_mask`` 1s, ``completion_logprobs``,
    ``overlong_prompt``, ``is_truncated``, ``routed_experts``); ``turn_versions`` and ``turn_seqs``
    the policy version and step ``seq`` of each turn. ``trajectory_id`` is the session id."""

    group_id: str
    case_id: str
    trajectory_id: str
    sample_index: int
    reward: float
    advantage: float | None
    is_truncated: bool
    turns: list[dict[str, Any]]
    turn_versions: list[int | None]
    turn_seqs: list[int]


def to_verifiers(group: FeedGroupOut, sample: FeedSample) -> VerifiersRollout | Dropped:
    """One sample's model calls as verifiers' per-turn tokens (legacy ``vf.Environment``'s
    ``state["trajectory"][i]["tokens"]``): each call its own prompt and completion, so the calls
    need not extend each other's prefix. Dropped (with the reason) when invalid, without a model
    call, without token ids, or with a model token whose logprob is unknown (verifiers'
    ``completion_logprobs`` is ``list[float]``). ValueError for a group read with ``view=scores``."""

    def drop(reason: str) -> Dropped:
        return Dropped(group.group_id, sample.session_id, reason)

    if not sample.valid or sample.score is None or not math.isfinite(sample.score):
        return drop(f"invalid: {sample.invalid_reason or 'no score'}")
    if sample.steps is None:
        raise ValueError(
            f"group {group.group_id} was read without steps (view=scores): read it with view=tokens"
        )
    calls = [st for st in sample.steps if st.is_trainable and st.status in _TOKEN_STATUSES]
    if not calls:
        return drop("no model call")
    missing = [st.seq for st in calls if st.prompt_token_ids is None or st.completion_token_ids is None]
    if missing:
        return drop(f"no token ids on step {', '.join(map(str, missing))} (a route without token capture)")
    unknown = [
        st.seq
        for st in calls
        if st.completion_logprobs is None
        or len(st.completion_logprobs) != len(st.completion_token_ids or [])
        or any(lp is None for lp in st.completion_logprobs)
    ]
    if unknown:
        return drop(f"no logprobs on step {', '.join(map(str, unknown))}")
    turns: list[dict[str, Any]] = []
    for st in calls:
        prompt, completion = list(st.prompt_token_ids or []), list(st.completion_token_ids or [])
        turns.append(
            {
                "prompt_ids": prompt,
                "prompt_mask": [0] * len(prompt),
                "completion_ids": completion,
                "completion_mask": [1] * len(completion),
                "completion_logprobs": [float(lp) for lp in st.completion_logprobs or [] if lp is not None],
                "overlong_prompt": False,
                "is_truncated": st.status == "truncated" or st.finish_reason == "length",
                "routed_experts": None,
            }
        )
    return VerifiersRollout(
        group_id=group.group_id,
        case_id=group.case_id,
        trajectory_id=sample.session_id,
        sample_index=sample.sample_index,
        reward=float(sample.score),
        advantage=sample.advantage,
        is_truncated=bool(turns[-1]["is_truncated"]),
        turns=turns,
        turn_versions=[st.policy_version for st in calls],
        turn_seqs=[st.seq for st in calls],
    )
