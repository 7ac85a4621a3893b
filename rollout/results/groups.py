"""Ready groups assembled from the store: which samples are valid, GRPO advantages, and token
sequences with their model-token masks (docs/feed.md). Pure functions plus one loader."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rollout.results.feed_schema import (
    AdvantageSpec,
    FeedGroupOut,
    FeedSample,
    FeedStep,
    Normalize,
    TokenSequence,
    View,
)
from store import COUNTED_EVAL_STATUSES
from store.feed import FeedQueries
from wire.assembly import read_answer

_TOKEN_STEP_STATUSES = frozenset({"ok", "truncated"})


@dataclass(frozen=True)
class GroupOptions:
    """How groups are built: ``min_valid`` valid samples for a group to be trainable, the
    advantage normalization, and what each sample carries (``full``: steps with messages and
    token sequences; ``tokens``: no messages; ``scores``: no steps). ``max_policy_lag``
    (versions; None: no bound) flags a group ``stale`` when its oldest stamped step is more than
    that many versions behind ``policy_version`` (the reader's current version), or when that
    lag is unknown (a step without a version, or no current version). ValueError for a
    ``min_valid`` below 1 (a group without a valid sample is never trainable) or a negative
    ``max_policy_lag``/``policy_version``."""

    min_valid: int = 2
    normalize: Normalize = "std"
    view: View = "full"
    eps: float = 1e-6
    max_policy_lag: int | None = None
    policy_version: int | None = None

    def __post_init__(self) -> None:
        check_min_valid(self.min_valid)
        check_version_bound("max_policy_lag", self.max_policy_lag)
        check_version_bound("policy_version", self.policy_version)


def check_min_valid(min_valid: int) -> int:
    """``min_valid`` when it is at least 1, else ValueError (a group needs a valid sample to be
    trainable, whatever the caller asks)."""
    if isinstance(min_valid, bool) or not isinstance(min_valid, int) or min_valid < 1:
        raise ValueError(
            f"min_valid must be an integer >= 1 (a trainable group needs a valid sample), not {min_valid!r}"
        )
    return min_valid


def check_version_bound(name: str, value: int | None) -> int | None:
    """``value`` when it is None or an integer >= 0 (a policy version, or a lag in versions),
    else ValueError naming ``name``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be an integer >= 0 or None, not {value!r}")
    return value


def invalid_reason(row: Mapping[str, Any]) -> str | None:
    """Why a session must not be trained on, or None when its reward counts: finished with a finite
    reward and ``eval_status`` ``scored``, or a grading failure the case's control showed the agent
    caused (its 0: ``store.COUNTED_EVAL_STATUSES``, docs/trust-model.md)."""
    if not row.get("finished"):
        return "unfinished"
    status, reward = row.get("eval_status"), row.get("reward")
    if status in COUNTED_EVAL_STATUSES and isinstance(reward, int | float) and math.isfinite(reward):
        return None
    if status is None:
        return "not evaluated"
    if status == "infra_error":
        return f"infrastructure failure ({row.get('outcome')})"
    reason = row.get("eval_reason")
    return f"evaluation {status}" + (f": {reason}" if reason else "")


def route_reason(row: Mapping[str, Any], routes: Sequence[str]) -> str | None:
    """Why a session must not be trained on because of its steps' routes (``routes``: the distinct
    ``llm_model`` of its steps), or None: every step was answered by the session's own route
    (its ``llm_model``). A step of another route holds tokens another model produced."""
    own = row.get("llm_model")
    others = sorted(set(routes) - {own})
    if not others:
        return None
    return f"steps of another route: {', '.join(others)} (the session runs on {own})"


def advantages(
    scores: Sequence[float | None], normalize: Normalize = "std", eps: float = 1e-6
) -> tuple[list[float | None], float | None, float | None]:
    """GRPO advantages (DeepSeekMath, Shao et al. 2024, sec. 4.1.2): for each valid score r_i
    (None = invalid, skipped), ``(r_i - mean) / (std + eps)`` with mean and population std over
    the valid scores, or ``r_i - mean`` when ``normalize == "none"``. Returns (advantages, mean,
    std); all None when no score is valid."""
    valid = [s for s in scores if s is not None]
    if not valid:
        return [None] * len(scores), None, None
    mean = sum(valid) / len(valid)
    std = math.sqrt(sum((s - mean) ** 2 for s in valid) / len(valid))
    div = (std + eps) if normalize == "std" else 1.0
    return [None if s is None else (s - mean) / div for s in scores], mean, std


def token_sequences(steps: Sequence[Mapping[str, Any]]) -> list[TokenSequence]:
    """Merge a sample's steps into training sequences (see :class:`TokenSequence`). Only trainable
    ``ok``/``truncated`` steps with known prompt and completion token ids take part; a step whose
    prompt does not start with the current sequence (history rewritten, reasoning dropped) or a
    step without token ids starts a new one. Logprobs whose length differs from the completion's
    are unknown (None)."""
    out: list[TokenSequence] = []
    cur: TokenSequence | None = None
    for st in steps:
        prompt, completion = st.get("prompt_token_ids"), st.get("completion_token_ids")
        if (
            not st.get("is_trainable", True)
            or st.get("status") not in _TOKEN_STEP_STATUSES
            or not isinstance(prompt, list)
            or not isinstance(completion, list)
        ):
            cur = None
            continue
        lp = st.get("completion_logprobs")
        gen_lp: list[float | None] = (
            list(lp) if isinstance(lp, list) and len(lp) == len(completion) else [None] * len(completion)
        )
        n = len(cur.token_ids) if cur is not None else 0
        if cur is not None and len(prompt) >= n and prompt[:n] == cur.token_ids:
            extra = prompt[n:]
        else:
            cur, extra = TokenSequence(steps=[], token_ids=[], mask=[], logprobs=[]), prompt
            out.append(cur)
        cur.steps.append(int(st["seq"]))
        cur.token_ids.extend(extra)
        cur.token_ids.extend(completion)
        cur.mask.extend([0] * len(extra))
        cur.mask.extend([1] * len(completion))
        cur.logprobs.extend([None] * len(extra))
        cur.logprobs.extend(gen_lp)
        pv = st.get("policy_version")
        if pv is not None and pv not in cur.policy_versions:
            cur.policy_versions.append(int(pv))
    return out


def policy_lag(min_version: int | None, unversioned: bool, opts: GroupOptions) -> tuple[int | None, bool]:
    """``(lag, stale)`` of a group whose oldest stamped step has ``min_version`` (None: no step
    stamped) and some of whose steps carry no version (``unversioned``). Without
    ``opts.max_policy_lag``: ``(None, False)``. With it, the lag is ``opts.policy_version -
    min_version``; it is unknown (None, stale) when a step has no version (made before any
    version was set: older than every version), when no step is stamped, or when the current
    version is unknown."""
    if opts.max_policy_lag is None:
        return None, False
    if unversioned or min_version is None or opts.policy_version is None:
        return None, True
    lag = opts.policy_version - min_version
    return lag, lag > opts.max_policy_lag


def feed_step(st: Mapping[str, Any], *, messages: bool) -> FeedStep:
    """One step row as the feed shows it (the answer read with the gateway's own readers)."""
    answer = read_answer(st.get("endpoint"), st.get("response"))
    msgs = st.get("messages")
    return FeedStep(
        seq=st["seq"],
        step_id=st["step_id"],
        model=st["llm_model"],
        endpoint=st["endpoint"],
        status=st["status"],
        is_trainable=bool(st.get("is_trainable", True)),
        finish_reason=st.get("finish_reason"),
        messages=(msgs if isinstance(msgs, list) else []) if messages else None,
        content=answer.content if messages else None,
        reasoning=answer.reasoning if messages else None,
        tool_calls=answer.tool_calls,
        prompt_tokens=st.get("prompt_tokens"),
        completion_tokens=st.get("completion_tokens"),
        prompt_token_ids=st.get("prompt_token_ids"),
        completion_token_ids=st.get("completion_token_ids"),
        completion_logprobs=st.get("completion_logprobs"),
        policy_version=st.get("policy_version"),
        extends_prefix=st.get("extends_prefix"),
        latency_ms=st.get("latency_ms"),
        ttft_ms=st.get("ttft_ms"),
    )


def _utc(t: datetime) -> datetime:
    """SQLite gives back naive datetimes: the store writes UTC."""
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def build_group(
    entry: Mapping[str, Any] | None,
    sessions: Sequence[Mapping[str, Any]],
    steps: Mapping[str, Sequence[Mapping[str, Any]]],
    opts: GroupOptions,
    versions: Mapping[str, list[int]] | None = None,
    routes: Mapping[str, list[str]] | None = None,
    unversioned: Set[str] | None = None,
) -> FeedGroupOut:
    """One group from its feed entry (None: not ready, as in an export), its session rows
    (``env_id`` = session id) and their steps (session id -> rows in ``seq`` order);
    ``versions`` (session id -> policy versions) and ``routes`` (session id -> the routes of its
    steps) and ``unversioned`` (the sessions with a step without a policy version) stand in for
    the steps' own when they were not read (``view="scores"``). A sample is invalid when
    :func:`invalid_reason` or :func:`route_reason` says why; the group is ``stale`` as
    :func:`policy_lag` says."""
    first = sessions[0]

    def step_routes(sid: str) -> list[str]:
        if routes is not None:
            return list(routes.get(sid, []))
        return sorted({str(s["llm_model"]) for s in steps.get(sid, [])})

    reasons = [invalid_reason(r) or route_reason(r, step_routes(r["env_id"])) for r in sessions]
    scores = [float(r["reward"]) if why is None else None for r, why in zip(sessions, reasons, strict=True)]
    adv, mean, std = advantages(scores, opts.normalize, opts.eps)
    samples: list[FeedSample] = []
    for row, why, score, a in zip(sessions, reasons, scores, adv, strict=True):
        rows = steps.get(row["env_id"], [])
        pvs = (
            versions.get(row["env_id"], [])
            if versions is not None
            else sorted({int(s["policy_version"]) for s in rows if s.get("policy_version") is not None})
        )
        samples.append(
            FeedSample(
                session_id=row["env_id"],
                sample_index=row["sample_index"],
                status=row["status"],
                outcome=row.get("outcome"),
                attempts=row.get("attempts") or 0,
                score=score,
                eval_status=row.get("eval_status"),
                eval_reason=row.get("eval_reason"),
                error=row.get("error_text"),
                valid=why is None,
                invalid_reason=why,
                advantage=a,
                policy_versions=pvs,
                mixed_policy=len(pvs) > 1,
                steps=None
                if opts.view == "scores"
                else [feed_step(s, messages=opts.view == "full") for s in rows],
                sequences=None if opts.view == "scores" else token_sequences(rows),
            )
        )
    n_valid = sum(1 for s in samples if s.valid)
    stamped = [v for s in samples for v in s.policy_versions]
    if unversioned is not None:
        no_version = any(r["env_id"] in unversioned for r in sessions)
    else:
        no_version = any(
            st.get("policy_version") is None for r in sessions for st in steps.get(r["env_id"], [])
        )
    lag, stale = policy_lag(min(stamped, default=None), no_version, opts)
    flags: list[str] = []
    if n_valid < opts.min_valid:  # min_valid >= 1 (GroupOptions): never trainable without a valid sample
        flags.append("too_few_valid")
    if any(not r.get("finished") for r in sessions):
        flags.append("incomplete")
    if stale:
        flags.append("stale")
    if n_valid >= 2 and std == 0:
        flags.append("no_signal")
    ready_at = entry.get("ready_at") if entry else None
    return FeedGroupOut(
        cursor=entry["ready_seq"] if entry else None,
        revision=entry["revision"] if entry else 0,
        ready_at=_utc(ready_at).isoformat() if isinstance(ready_at, datetime) else None,
        job_id=first["job_id"],
        group_id=first["group_id"],
        env=first["env_name"],
        case_id=first["case_id"],
        model=first["llm_model"],
        harness=first.get("harness"),
        n_samples=len(samples),
        n_valid=n_valid,
        min_valid=opts.min_valid,
        trainable=not {"too_few_valid", "incomplete", "stale"} & set(flags),
        flags=flags,
        min_policy_version=min(stamped, default=None),
        max_policy_version=max(stamped, default=None),
        policy_lag=lag,
        mean_score=mean,
        std_score=std,
        advantage=AdvantageSpec(normalize=opts.normalize, eps=opts.eps),
        samples=samples,
    )


async def load_groups(
    queries: FeedQueries,
    job_id: str,
    entries: Sequence[Mapping[str, Any] | None],
    group_ids: Sequence[str],
    opts: GroupOptions,
    *,
    with_request: bool = False,
    session_rows: dict[str, dict[str, Any]] | None = None,
) -> list[tuple[FeedGroupOut, dict[str, list[dict[str, Any]]]]]:
    """Build the groups ``group_ids`` (``entries[i]``: the feed entry of ``group_ids[i]``, or None)
    in that order, each with its raw step rows (session id -> rows; with the ``request`` column
    when ``with_request``, for exports). ``session_rows``, when given, is filled with each
    session's row (session id -> row). Two queries per 500 sessions, whatever the view."""
    sessions = await queries.sessions_of_groups(job_id, list(group_ids))
    if session_rows is not None:
        session_rows.update({r["env_id"]: r for r in sessions})
    by_group: dict[str, list[dict[str, Any]]] = {}
    for r in sessions:
        by_group.setdefault(r["group_id"], []).append(r)
    step_view = opts.view != "scores" or with_request
    sids = [r["env_id"] for r in sessions]
    steps = (
        await queries.steps_of_sessions(
            sids, with_request=with_request, with_messages=opts.view == "full" or with_request
        )
        if step_view
        else {}
    )
    versions = None if step_view else await queries.policy_versions(sids)
    routes = None if step_view else await queries.step_routes(sids)
    unversioned = (
        await queries.unversioned_sessions(sids)
        if not step_view and opts.max_policy_lag is not None
        else None
    )
    out = []
    for entry, gid in zip(entries, group_ids, strict=True):
        members = by_group.get(gid)
        if not members:
            continue
        mine = {r["env_id"]: steps.get(r["env_id"], []) for r in members}
        out.append((build_group(entry, members, mine, opts, versions, routes, unversioned), mine))
    return out
