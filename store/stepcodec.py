"""Step storage that grows with the conversation, not its square: each step stored as a delta on
the session's last committed step (:class:`StepEncoder`, gateway side), compressed by the store's
writer (:func:`pack`), rebuilt exactly by every read (:func:`decode_rows`). Format: docs/storage.md.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from store.engine import json_dumps

__all__ = [
    "ENCODING_VERSION",
    "PACKED_COLUMNS",
    "Pending",
    "StepDecodeError",
    "StepEncoder",
    "TokenChain",
    "answer_items",
    "decode_rows",
    "message_digest",
    "message_digests",
    "pack",
    "token_chain",
]

ENCODING_VERSION = 3
"""The format :class:`StepEncoder` writes by default; :func:`decode_rows` reads it and versions 1, 2."""
PACKED_COLUMNS = (
    "messages",
    "request",
    "response",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
)
"""The columns a format-3 row may hold compressed in ``packed`` (in this order)."""
PACK_LEVEL = 6
"""zlib level of :func:`pack` (~20 us per 1.5 KB row; level 1: ~15% faster, 2% larger)."""
PACK_MIN_SAVING = 8
_CONVERSATION_KEYS = ("messages", "input")


def message_digest(message: Any) -> bytes:
    """A digest equal for two JSON values exactly when they are stored as the same JSON text
    (``marshal`` format 2 keeps types, key order and characters, at a third of ``json.dumps``'s cost)."""
    return hashlib.blake2b(marshal.dumps(message, 2), digest_size=16).digest()


def message_digests(messages: Any) -> tuple[bytes, ...] | None:
    """The :func:`message_digest` of each of a step's ``messages`` (None when not a list)."""
    return tuple(message_digest(m) for m in messages) if isinstance(messages, list) else None


TOKEN_BLOCK = 64


class TokenChain:
    """A step's token ids (prompt + completion, or the prompt alone) as a chained digest per whole
    block of :data:`TOKEN_BLOCK` ids plus the ids after the last block; never the ids themselves."""

    __slots__ = ("blocks", "complete", "prompt_len", "tail", "total_len")

    def __init__(self, prompt: Sequence[int], completion: Sequence[int] | None) -> None:
        ids = array("q", prompt)
        if completion is not None:
            ids.extend(completion)
        self.complete = completion is not None  # the completion's ids are part of the chain
        self.prompt_len = len(prompt)
        self.total_len = len(ids)
        whole = self.total_len - self.total_len % TOKEN_BLOCK
        raw = memoryview(ids).cast("B")
        h = hashlib.blake2b(digest_size=16)
        step = TOKEN_BLOCK * ids.itemsize
        blocks = []
        for end in range(step, whole * ids.itemsize + 1, step):
            h.update(raw[end - step : end])
            blocks.append(h.digest())
        self.blocks = tuple(blocks)
        self.tail = ids[whole:].tolist()

    def prompt_starts_with(self, prompt: Sequence[int], earlier: TokenChain) -> bool:
        """True when ``prompt`` (this chain's) starts with all of ``earlier``'s ids."""
        n = earlier.total_len
        if n > self.prompt_len:
            return False
        nb = n // TOKEN_BLOCK
        if self.blocks[:nb] != earlier.blocks[:nb]:
            return False
        return list(prompt[nb * TOKEN_BLOCK : n]) == earlier.tail

    def common_prompt_blocks(self, earlier: TokenChain) -> int:
        """How many leading ids of this step's prompt, in whole blocks, equal ``earlier``'s."""
        n = 0
        for mine, theirs in zip(self.blocks[: self.prompt_len // TOKEN_BLOCK], earlier.blocks, strict=False):
            if mine != theirs:
                break
            n += TOKEN_BLOCK
        return n


def token_chain(prompt: Sequence[int] | None, completion: Sequence[int] | None) -> TokenChain | None:
    return None if prompt is None else TokenChain(prompt, completion)


def _answer_message(response: Any) -> Any:
    choices = response.get("choices") if isinstance(response, dict) else None
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    message = first.get("message") if first is not None else None
    return message if isinstance(message, dict) else None


def answer_items(response: Any) -> list[Any]:
    """The messages an agent sends back of a step's answer (chat: ``choices[0].message``;
    Anthropic: ``{"role", "content"}``; Responses: ``output``); empty for anything else."""
    if not isinstance(response, dict):
        return []
    message = _answer_message(response)
    if message is not None:
        return [message]
    if response.get("type") == "message" and "role" in response and isinstance(response.get("content"), list):
        return [{"role": response["role"], "content": response["content"]}]
    output = response.get("output")
    return list(output) if isinstance(output, list) else []


@dataclass(frozen=True, slots=True)
class _Stored:
    """What the encoder keeps of a committed step: digests, never the conversation."""

    seq: int
    message_digests: tuple[bytes, ...] | None
    answer_digests: tuple[bytes, ...]
    rest_digest: bytes
    tokens: TokenChain | None


@dataclass(frozen=True, slots=True)
class Pending:
    """A step row encoded and queued: hand it to :meth:`StepEncoder.committed` once committed."""

    session_id: str
    stored: _Stored


class StepEncoder:
    """Encodes each session's step rows against its last committed step: :meth:`encode` before a
    row is queued, :meth:`committed` once committed (only those become bases), :meth:`drop` at close."""

    def __init__(self, version: int = ENCODING_VERSION) -> None:
        if version not in (2, 3):
            raise ValueError(f"StepEncoder writes format 2 or 3, not {version!r}")
        self.version = version  # 3: the store's writer may compress the row (:func:`pack`); 2: never
        self._last: dict[str, _Stored] = {}

    def __len__(self) -> int:
        return len(self._last)

    def drop(self, session_id: str) -> None:
        self._last.pop(session_id, None)

    def committed(self, pending: Pending) -> None:
        """``pending``'s row becomes its session's base (unless a later step already is)."""
        have = self._last.get(pending.session_id)
        if have is None or have.seq < pending.stored.seq or pending.stored.seq <= 1:
            self._last[pending.session_id] = pending.stored

    def encode(
        self, row: dict[str, Any], tokens: TokenChain | None = None, digests: tuple[bytes, ...] | None = None
    ) -> Pending:
        """Rewrite ``row`` (every ``session_steps`` column) in place into its stored form; ``tokens``
        and ``digests``: the row's, when the caller already has them."""
        sid, seq = row["session_id"], row["seq"]
        base = None if seq <= 1 else self._last.get(sid)
        if base is not None and base.seq == seq:
            base = None  # the same step again: never its own base
        messages, request = row["messages"], row["request"]
        prompt, completion = row["prompt_token_ids"], row["completion_token_ids"]
        if digests is None:
            digests = message_digests(messages)
        m_keep = a = q = f = p_keep = 0
        if base is not None and digests is not None and base.message_digests is not None:
            for mine, theirs in zip(digests, base.message_digests, strict=False):
                if mine != theirs:
                    break
                m_keep += 1
            for mine, theirs in zip(digests[m_keep:], base.answer_digests, strict=False):
                if mine != theirs:
                    break
                a += 1  # the agent sent the previous answer back as it got it
        rest = request
        if isinstance(messages, list) and isinstance(request, dict):
            for i, key in enumerate(_CONVERSATION_KEYS):
                value = request.get(key)
                if isinstance(value, list) and len(value) <= len(messages):
                    start = len(messages) - len(value)
                    if value is messages or value == messages[start:]:
                        q, f = 1 | (4 if i else 0), start
                        rest = {**request, key: None}
                        break
        rest_digest = message_digest(rest)
        if base is not None and rest_digest == base.rest_digest:
            q |= 2  # the same request apart from the conversation (model, sampling, tools)
        if tokens is None and prompt is not None:
            tokens = TokenChain(prompt, completion)
        if base is not None and prompt is not None and tokens is not None and base.tokens is not None:
            if base.tokens.total_len and tokens.prompt_starts_with(prompt, base.tokens):
                p_keep = base.tokens.total_len  # the usual case: the base's prompt + completion, then more
            else:
                p_keep = tokens.common_prompt_blocks(base.tokens)
        answer = tuple(message_digest(m) for m in answer_items(row["response"]))
        pending = Pending(sid, _Stored(seq, digests, answer, rest_digest, tokens))
        meta = row["meta_json"]
        if (
            self.version == 3
            and isinstance(meta, dict)
            and next(iter(meta), None) == "route"
            and meta["route"] == row["llm_model"]
        ):
            q |= 8  # the route is the llm_model column: not stored twice
            row["meta_json"] = {k: v for k, v in meta.items() if k != "route"}
        if not (m_keep or a or q or p_keep):
            row["encoding"] = [3] if self.version == 3 else None
            return pending
        if m_keep or a:
            row["messages"] = messages[m_keep + a :]
        if q & 2:
            row["request"] = None
        elif q & 1:
            row["request"] = rest
        if p_keep:
            row["prompt_token_ids"] = prompt[p_keep:]
        back = seq - base.seq if base is not None and (m_keep or a or q & 2 or p_keep) else 0
        encoding = [self.version, back, m_keep, a, q, f, p_keep]
        while encoding[-1] == 0:
            encoding.pop()  # trailing zeros are implied
        row["encoding"] = encoding
        return pending


def pack(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """``row`` with :data:`PACKED_COLUMNS` compressed into ``packed`` (a new dict) when it is a
    format-3 row and that saves at least :data:`PACK_MIN_SAVING` bytes; else ``row`` itself."""
    enc = row.get("encoding")
    if not isinstance(enc, list) or not enc or enc[0] != 3 or row.get("packed") is not None:
        return row
    values = [row[c] for c in PACKED_COLUMNS]
    text = json_dumps(values).encode("utf-8")
    # as columns: the same JSON texts without the list's brackets and separators, None as SQL NULL
    raw = len(text) - 2 - 2 * (len(values) - 1) - 4 * sum(v is None for v in values)
    packed = zlib.compress(text, PACK_LEVEL)
    if len(packed) + PACK_MIN_SAVING > raw:
        return row
    out = dict(row)
    for c in PACKED_COLUMNS:
        out[c] = None
    out["packed"] = packed
    return out


class StepDecodeError(ValueError):
    """A stored step cannot be rebuilt: its base is not in the store, its format is unknown, or
    its packed values are damaged."""


def _get(row: Any, name: str) -> Any:
    return row[name] if isinstance(row, Mapping) else getattr(row, name)


def _set(row: Any, name: str, value: Any) -> None:
    if isinstance(row, dict):
        row[name] = value
    else:
        setattr(row, name, value)


_Full = tuple[Any, Any, list[Any], Any]  # messages, token ids, answer items, request without the conversation


def _base_seq(seq: int, enc: Any) -> int | None:
    if not isinstance(enc, list) or len(enc) < 2:
        return None
    if enc[0] == 1:
        return enc[1] if isinstance(enc[1], int) else None
    return seq - enc[1] if enc[0] in (2, 3) and isinstance(enc[1], int) and enc[1] != 0 else None


def decode_rows(rows: Sequence[Any]) -> None:
    """Rebuild in place the full values of every encoded row of ``rows`` (dicts with JSON columns
    parsed, or :class:`store.models.SessionStep`) and set ``encoding`` to None; a row's base must be
    among ``rows``. Raises :class:`StepDecodeError`."""
    by_key = {(_get(r, "session_id"), _get(r, "seq")): r for r in rows}
    full: dict[tuple[str, int], _Full] = {}
    for r in rows:
        key = (_get(r, "session_id"), _get(r, "seq"))
        chain: list[Any] = []
        cur: tuple[str, int] | None = key
        while cur is not None and cur not in full:
            row = by_key.get(cur)
            if row is None:
                raise StepDecodeError(
                    f"step {key[1]} of session {key[0]} is stored as a delta on its step {cur[1]}, "
                    "which is not in the store"
                )
            chain.append(row)
            base_seq = _base_seq(cur[1], _get(row, "encoding"))
            cur = (cur[0], base_seq) if base_seq is not None else None
        for row in reversed(chain):
            _decode_one(row, full)


def _fields(sid: str, seq: int, enc: Any) -> tuple[int | None, int, int, int, str | None, int, int]:
    """``(base_seq, messages kept, answer items, request mode bits 1|2, conversation key, from,
    prompt ids kept)`` of an encoding of version 1, 2 or 3."""
    if isinstance(enc, str):
        raise StepDecodeError(
            f"step {seq} of session {sid}: its encoding is JSON text ({enc[:40]!r}): decode_rows "
            "takes the JSON columns parsed (json.loads of encoding, meta_json, messages, request, "
            "response and the token columns), as the store reads them"
        )
    bad = StepDecodeError(f"step {seq} of session {sid} has an encoding this version cannot read: {enc!r}")
    if not isinstance(enc, list) or not enc or not all(isinstance(v, int) or v is None for v in enc):
        raise bad
    if enc[0] == 1 and len(enc) == 8:
        _, base_seq, m_keep, a, q, k, f, p_keep = enc
        return base_seq, m_keep, a, q, _CONVERSATION_KEYS[k] if q & 1 else None, f, p_keep
    if (enc[0] == 2 and 2 <= len(enc) <= 7 or enc[0] == 3 and len(enc) <= 7) and None not in enc:
        _, _, m_keep, a, q, f, p_keep = enc + [0] * (7 - len(enc))
        key = _CONVERSATION_KEYS[1 if q & 4 else 0] if q & 1 else None
        return _base_seq(seq, enc), m_keep, a, q & 3, key, f, p_keep
    raise bad


def _decode_one(row: Any, full: dict[tuple[str, int], _Full]) -> None:
    sid, seq = _get(row, "session_id"), _get(row, "seq")
    enc = _get(row, "encoding")
    messages, prompt, request = _get(row, "messages"), _get(row, "prompt_token_ids"), _get(row, "request")
    key = None
    if enc is not None:
        base_seq, m_keep, a, q, key, f, p_keep = _fields(sid, seq, enc)
        if enc[0] == 3 and _unpack(row, sid, seq):
            messages, prompt, request = (
                _get(row, "messages"),
                _get(row, "prompt_token_ids"),
                _get(row, "request"),
            )
        none: _Full = (None, None, [], None)
        b_messages, b_ids, b_answer, b_rest = full[(sid, base_seq)] if base_seq is not None else none
        if m_keep or a:
            kept = [_copy(m) for m in b_messages[:m_keep]] + [_copy(m) for m in b_answer[:a]]
            messages = kept + list(messages or [])
            _set(row, "messages", messages)
        if p_keep:
            prompt = list(b_ids[:p_keep]) + list(prompt or [])
            _set(row, "prompt_token_ids", prompt)
        if q & 2:
            request = _copy(b_rest)
        if key is not None:
            rest = request
            request = {**rest, key: [_copy(m) for m in messages[f:]]}
        if q & 3:
            _set(row, "request", request)
        if (
            enc[0] == 3
            and len(enc) > 4
            and enc[4] & 8
            and not (isinstance(row, Mapping) and "meta_json" not in row)
        ):
            _set(row, "meta_json", {"route": _get(row, "llm_model"), **(_get(row, "meta_json") or {})})
        _set(row, "encoding", None)
    rest = {**request, key: None} if key is not None else request
    completion = _get(row, "completion_token_ids")
    ids = None if prompt is None else prompt if completion is None else prompt + completion
    full[(sid, seq)] = (messages, ids, answer_items(_get(row, "response")), rest)


def _unpack(row: Any, sid: str, seq: int) -> bool:
    """Unpack ``packed`` into :data:`PACKED_COLUMNS`; False when the row was stored raw. Raises
    StepDecodeError for damaged bytes or a dict row read without ``packed``."""
    if isinstance(row, Mapping) and "packed" not in row:
        raise StepDecodeError(
            f"step {seq} of session {sid} is stored compressed and was read without its packed column"
        )
    blob = _get(row, "packed")
    if blob is None:
        return False
    try:
        values = json.loads(zlib.decompress(blob))
    except (zlib.error, ValueError) as e:
        raise StepDecodeError(
            f"step {seq} of session {sid}: its packed values are damaged ({type(e).__name__}: {e})"
        ) from e
    if not isinstance(values, list) or len(values) != len(PACKED_COLUMNS):
        raise StepDecodeError(
            f"step {seq} of session {sid}: its packed values are damaged (not a list of "
            f"{len(PACKED_COLUMNS)} values)"
        )
    for name, value in zip(PACKED_COLUMNS, values, strict=True):
        _set(row, name, value)
    _set(row, "packed", None)
    return True


def _copy(value: Any) -> Any:
    """A deep copy of a JSON value (each rebuilt row owns its objects)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
