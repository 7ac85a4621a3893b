"""``launcher.py export``: a job's groups (or sessions without a job: :func:`export_sessions`) as
JSONL, Parquet or the OpenAI fine-tuning chat format, one row per session or per step, with the
feed's fields (docs/feed.md, "Export").

Parquet (pyarrow, the ``export`` extra) has a fixed schema: ``messages`` and ``tool_calls`` are
JSON text (their shapes vary between protocols and turns); token ids, masks and logprobs are
lists. Groups are read and written in batches, so memory stays flat whatever the job's size.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rollout.errors import RolloutError
from rollout.results.feed_schema import FeedGroupOut, FeedSample, FeedStep, TokenSequence
from rollout.results.groups import GroupOptions, feed_step, load_groups, token_sequences
from rollout.results.session_fields import session_fields
from store.feed import FeedQueries
from wire.text import display_text, json_text

Format = Literal["jsonl", "parquet", "openai"]
Per = Literal["session", "step"]
BATCH_GROUPS = 64
STEP_RENAMES = {"model": "step_model", "status": "step_status"}
"""Step fields renamed in per-step rows, where the session has a field of the same name."""


class ExportError(RolloutError, RuntimeError):
    """The export cannot be written (unknown job, pyarrow missing); the message says what to do."""


@dataclass
class ExportResult:
    """Rows written, samples left out by reason, the output file, and the groups written before
    all their sessions ended (flagged ``incomplete``: a job still running)."""

    path: Path
    rows: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    incomplete: int = 0


def _group_fields(g: FeedGroupOut) -> dict[str, Any]:
    return {
        "job_id": g.job_id,
        "group_id": g.group_id,
        "cursor": g.cursor,
        "env": g.env,
        "case_id": g.case_id,
        "model": g.model,
        "harness": g.harness,
        "group_trainable": g.trainable,
        "group_flags": g.flags,
        "group_n_samples": g.n_samples,
        "group_n_valid": g.n_valid,
        "group_mean_score": g.mean_score,
        "group_std_score": g.std_score,
        "advantage_normalize": g.advantage.normalize,
    }


def _sample_fields(s: FeedSample) -> dict[str, Any]:
    """The feed's own fields of a sample (the session's shared ones come from :func:`session_fields`)."""
    return {
        "attempts": s.attempts,
        "valid": s.valid,
        "invalid_reason": s.invalid_reason,
        "advantage": s.advantage,
        "policy_versions": s.policy_versions,
        "mixed_policy": s.mixed_policy,
    }


def _shared(row: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    return session_fields(row, steps).model_dump(mode="json")


def _step_fields(st: FeedStep) -> dict[str, Any]:
    return st.model_dump()


def _openai_example(st: FeedStep, request: Any) -> dict[str, Any] | str:
    """One OpenAI fine-tuning chat example: the step's conversation and its answer (with the
    request's ``tools``); a reason string when the step cannot be one."""
    if st.endpoint != "chat.completions":
        return f"endpoint {st.endpoint}: the OpenAI chat format needs chat completions steps"
    answer: dict[str, Any] = {"role": "assistant", "content": st.content}
    if st.tool_calls:
        answer["tool_calls"] = st.tool_calls
    example: dict[str, Any] = {"messages": [*(st.messages or []), answer]}
    if isinstance(request, dict) and isinstance(request.get("tools"), list):
        example["tools"] = request["tools"]
    return example


class _Writer:
    """Rows to a temporary file beside ``path``, moved over it by ``close(keep=True)``; a failed
    export leaves ``path`` as it was."""

    def __init__(self, path: Path, fmt: Format, per: Per) -> None:
        self.path, self.fmt, self.per = path, fmt, per
        self._rows: list[dict[str, Any]] = []
        self._pq: Any = None
        self._schema: Any = None
        if fmt == "parquet":
            try:
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ModuleNotFoundError as e:
                raise ExportError(
                    "--format parquet needs pyarrow: pip install 'rollout-factory[export]' "
                    "(or pip install pyarrow)"
                ) from e
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        self._tmp = Path(tmp)
        if fmt == "parquet":
            self._schema = parquet_schema(pa, per)
            self._pq = pq.ParquetWriter(tmp, self._schema)
            self._pa = pa
            self._file = None
        else:
            self._file = self._tmp.open("w", encoding="utf-8")

    def add(self, row: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json_text(row) + "\n")
            return
        self._rows.append(_utf8_strings(_flatten_for_parquet(row)))
        if len(self._rows) >= 512:
            self.flush()

    def flush(self) -> None:
        if self._pq is not None and self._rows:
            self._pq.write_table(self._pa.Table.from_pylist(self._rows, schema=self._schema))
            self._rows = []

    def close(self, keep: bool) -> None:
        try:
            if self._file is not None:
                self._file.close()
            else:
                if keep:
                    self.flush()
                self._pq.close()
            if keep:
                os.chmod(self._tmp, 0o644)
                os.replace(self._tmp, self.path)
        finally:
            self._tmp.unlink(missing_ok=True)


def _json_text(v: Any) -> str | None:
    return None if v is None else json_text(v)


def _utf8_strings(v: Any) -> Any:
    """``v`` with each string made UTF-8 (a lone surrogate replaced by U+FFFD): a Parquet string
    is UTF-8 only (JSON-valued columns keep theirs as escapes, by :func:`_json_text`)."""
    if isinstance(v, str):
        return display_text(v)
    if isinstance(v, dict):
        return {k: _utf8_strings(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_utf8_strings(x) for x in v]
    return v


def _flatten_step(st: dict[str, Any]) -> dict[str, Any]:
    return {**st, "messages": _json_text(st.get("messages")), "tool_calls": _json_text(st.get("tool_calls"))}


def _flatten_for_parquet(row: dict[str, Any]) -> dict[str, Any]:
    if "steps" in row:
        return {**row, "steps": [_flatten_step(s) for s in row["steps"] or []]}
    return _flatten_step(row)


def parquet_schema(pa: Any, per: Per) -> Any:
    """The Parquet schema of an export (``pa`` is the pyarrow module)."""
    ints, floats = pa.list_(pa.int64()), pa.list_(pa.float64())
    group = [
        ("job_id", pa.string()),
        ("group_id", pa.string()),
        ("cursor", pa.int64()),
        ("env", pa.string()),
        ("case_id", pa.string()),
        ("model", pa.string()),
        ("harness", pa.string()),
        ("group_trainable", pa.bool_()),
        ("group_flags", pa.list_(pa.string())),
        ("group_n_samples", pa.int64()),
        ("group_n_valid", pa.int64()),
        ("group_mean_score", pa.float64()),
        ("group_std_score", pa.float64()),
        ("advantage_normalize", pa.string()),
    ]
    usage = pa.struct(
        [("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()), ("total_tokens", pa.int64())]
    )
    timing = pa.struct([("seq", pa.int64()), ("latency_ms", pa.float64()), ("ttft_ms", pa.float64())])
    shared = [
        ("schema_version", pa.int64()),
        ("session_id", pa.string()),
        ("env_name", pa.string()),
        ("sample_index", pa.int64()),
        ("status", pa.string()),
        ("outcome", pa.string()),
        ("score", pa.float64()),
        ("reward", pa.float64()),
        ("eval_status", pa.string()),
        ("eval_reason", pa.string()),
        ("error", pa.string()),
        ("duration_s", pa.float64()),
        ("started_at", pa.string()),
        ("finished_at", pa.string()),
        ("usage", usage),
        ("step_count", pa.int64()),
    ]
    sample = [
        *shared,
        ("attempts", pa.int64()),
        ("valid", pa.bool_()),
        ("invalid_reason", pa.string()),
        ("advantage", pa.float64()),
        ("policy_versions", ints),
        ("mixed_policy", pa.bool_()),
        ("client_score", pa.float64()),
        ("client_score_reason", pa.string()),
    ]
    step = [
        ("seq", pa.int64()),
        ("step_id", pa.int64()),
        ("model", pa.string()),
        ("endpoint", pa.string()),
        ("status", pa.string()),
        ("is_trainable", pa.bool_()),
        ("finish_reason", pa.string()),
        ("messages", pa.string()),
        ("content", pa.string()),
        ("reasoning", pa.string()),
        ("tool_calls", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("prompt_token_ids", ints),
        ("completion_token_ids", ints),
        ("completion_logprobs", floats),
        ("policy_version", pa.int64()),
        ("extends_prefix", pa.bool_()),
        ("latency_ms", pa.float64()),
        ("ttft_ms", pa.float64()),
    ]
    if per == "step":
        return pa.schema([*group, *sample, *[(STEP_RENAMES.get(n, n), t) for n, t in step]])
    sequence = pa.struct(
        [
            ("steps", ints),
            ("token_ids", ints),
            ("mask", pa.list_(pa.int8())),
            ("logprobs", floats),
            ("policy_versions", ints),
        ]
    )
    return pa.schema(
        [
            *group,
            *sample,
            ("step_timings", pa.list_(timing)),
            ("steps", pa.list_(pa.struct(step))),
            ("sequences", pa.list_(sequence)),
        ]
    )


def _rows(
    g: FeedGroupOut,
    raw: dict[str, list[dict[str, Any]]],
    sessions: dict[str, dict[str, Any]],
    fmt: Format,
    per: Per,
    only_trainable: bool,
    min_score: float | None,
    skipped: Counter[str],
) -> Iterator[dict[str, Any]]:
    for s in g.samples:
        if only_trainable and not g.trainable:
            skipped["group not trainable (" + ", ".join(g.flags) + ")"] += 1
            continue
        if only_trainable and not s.valid:
            skipped[f"invalid sample: {s.invalid_reason}"] += 1
            continue
        if min_score is not None and (s.score is None or s.score < min_score):
            skipped[f"score below {min_score:g} or none"] += 1
            continue
        steps = raw.get(s.session_id, [])
        head = {**_group_fields(g), **_shared(sessions[s.session_id], steps), **_sample_fields(s)}
        yield from _sample_rows(head, s.steps or [], s.sequences or [], steps, fmt, per, skipped)


def _sample_rows(
    head: dict[str, Any],
    steps: list[FeedStep],
    sequences: list[TokenSequence],
    raw: list[dict[str, Any]],
    fmt: Format,
    per: Per,
    skipped: Counter[str],
) -> Iterator[dict[str, Any]]:
    """The rows of one sample that passed the filters (``head``: its group's and its own fields;
    ``raw``: its step rows, for the requests' tools)."""
    if fmt == "openai":
        requests = {r["seq"]: r.get("request") for r in raw}
        chosen = [st for st in steps if st.is_trainable and st.status == "ok"]
        if per == "session":
            chosen = chosen[-1:]
        if not chosen:
            skipped["no successful model call"] += 1
        for st in chosen:
            ex = _openai_example(st, requests.get(st.seq))
            if isinstance(ex, str):
                skipped[ex] += 1
            else:
                yield ex
        return
    if per == "session":
        yield {
            **head,
            "steps": [_step_fields(st) for st in steps],
            "sequences": [q.model_dump() for q in sequences],
        }
    else:
        head = {k: v for k, v in head.items() if k != "step_timings"}  # each row has its step's timings
        for st in steps:
            yield {**head, **{STEP_RENAMES.get(k, k): v for k, v in _step_fields(st).items()}}


async def export_job(
    queries: FeedQueries,
    job_id: str,
    fmt: Format,
    out: Path,
    *,
    per: Per = "session",
    only_trainable: bool = False,
    min_score: float | None = None,
    opts: GroupOptions | None = None,
) -> ExportResult:
    """Write every group of ``job_id`` to ``out``; raises ExportError for an unknown job or a
    missing pyarrow. Groups not ready yet are exported too, flagged ``incomplete``."""
    opts = opts or GroupOptions()
    gids = await queries.group_ids(job_id)
    if not gids:
        raise ExportError(f"no job {job_id!r} in this store")
    entries = await queries.ready_entries(job_id)
    result = ExportResult(path=out)

    async def rows() -> AsyncIterator[dict[str, Any]]:
        for i in range(0, len(gids), BATCH_GROUPS):
            batch = gids[i : i + BATCH_GROUPS]
            sessions: dict[str, dict[str, Any]] = {}
            built = await load_groups(
                queries,
                job_id,
                [entries.get(g) for g in batch],
                batch,
                opts,
                with_request=fmt == "openai",
                session_rows=sessions,
            )
            for g, raw in built:
                result.incomplete += "incomplete" in g.flags
                for row in _rows(g, raw, sessions, fmt, per, only_trainable, min_score, result.skipped):
                    yield row

    return await _write(result, fmt, per, rows())


NO_JOB = "no job: a session a client named on the gateway has no reward until launcher.py grade grades it"
"""The ``invalid_reason`` of every session exported without a job: its ``score`` is null, never 0."""


def jobless_head(
    gw: dict[str, Any], steps: list[dict[str, Any]], client: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The group and sample fields of a session without a job (``gw``: its ``gateway_sessions``
    row): no job, group, case, sample or score (null, never 0), ``invalid_reason`` :data:`NO_JOB`;
    ``model`` is the route the gateway bound it to, ``status`` the gateway's; flagged ``no_job``,
    never trainable. ``client`` (its ``session_client_scores`` row) gives ``client_score`` and
    ``client_score_reason``: the client's own word, never ``score``/``reward``."""
    pvs = sorted({int(st["policy_version"]) for st in steps if st.get("policy_version") is not None})
    shared = _shared(
        {
            "env_id": gw["session_id"],
            "env_name": gw.get("env_name"),
            "llm_model": gw.get("route"),
            "status": gw["status"],
            "started_at": gw.get("created_at"),
        },
        steps,
    )
    return {
        "job_id": None,
        "group_id": None,
        "cursor": None,
        "env": gw.get("env_name"),
        "case_id": None,
        "model": gw.get("route"),
        "harness": None,
        "group_trainable": False,
        "group_flags": ["no_job"],
        "group_n_samples": 1,
        "group_n_valid": 0,
        "group_mean_score": None,
        "group_std_score": None,
        "advantage_normalize": None,
        **shared,
        "attempts": None,
        "valid": False,
        "invalid_reason": NO_JOB,
        "advantage": None,
        "policy_versions": pvs,
        "mixed_policy": len(pvs) > 1,
        "client_score": client["score"] if client else None,
        "client_score_reason": client["reason"] if client else None,
    }


async def export_sessions(
    queries: FeedQueries,
    session_ids: list[str] | None,
    fmt: Format,
    out: Path,
    *,
    per: Per = "session",
    only_trainable: bool = False,
    min_score: float | None = None,
) -> ExportResult:
    """Write sessions without a job (``session_ids``, or all of them when None) to ``out``, in the
    same formats and columns as :func:`export_job`; their ``score`` is null and ``invalid_reason``
    :data:`NO_JOB`. Raises ExportError for an unknown session, one that belongs to a job, or none
    to export."""
    if session_ids is not None:
        session_ids = list(dict.fromkeys(session_ids))
        owned = await queries.jobs_of_sessions(session_ids)
        if owned:
            sid, job = next(iter(sorted(owned.items())))
            raise ExportError(f"session {sid!r} belongs to job {job!r}: export it with --job-id {job}")
    gws = await queries.jobless_sessions(session_ids)
    if session_ids is not None and len(gws) < len(session_ids):
        missing = sorted(set(session_ids) - {g["session_id"] for g in gws})
        raise ExportError(f"no session {missing[0]!r} in this store")
    if not gws:
        raise ExportError("this store holds no session without a job")
    result = ExportResult(path=out)

    async def rows() -> AsyncIterator[dict[str, Any]]:
        for i in range(0, len(gws), BATCH_GROUPS):
            batch = gws[i : i + BATCH_GROUPS]
            raw = await queries.steps_of_sessions(
                [g["session_id"] for g in batch], with_request=fmt == "openai"
            )
            clients = await queries.client_scores([g["session_id"] for g in batch])
            for gw in batch:
                if only_trainable:
                    result.skipped[f"invalid sample: {NO_JOB}"] += 1
                    continue
                if min_score is not None:
                    result.skipped[f"score below {min_score:g} or none"] += 1
                    continue
                steps_rows = raw.get(gw["session_id"], [])
                steps = [feed_step(st, messages=True) for st in steps_rows]
                for row in _sample_rows(
                    jobless_head(gw, steps_rows, clients.get(gw["session_id"])),
                    steps,
                    token_sequences(steps_rows),
                    steps_rows,
                    fmt,
                    per,
                    result.skipped,
                ):
                    yield row

    return await _write(result, fmt, per, rows())


async def _write(
    result: ExportResult, fmt: Format, per: Per, rows: AsyncIterator[dict[str, Any]]
) -> ExportResult:
    """Write ``rows`` to ``result.path`` in ``fmt``, counting them in ``result``; the file is kept
    only when every row was written."""
    writer = _Writer(result.path, fmt, per)
    done = False
    try:
        async for row in rows:
            writer.add(row)
            result.rows += 1
        done = True
    finally:
        writer.close(keep=done)
    return result
