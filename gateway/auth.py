"""Optional API-key authentication of the gateway's own clients and of its admins (``auth`` in
the config).

With a client key configured, every request needs one (``Authorization: Bearer <key>`` or
``x-api-key``), except ``/healthz``, ``/readyz`` and ``/metrics``. The ``/admin/...`` endpoints (and a
session's ``.../score``)
take only an admin key (``auth.admin_api_keys``): a client key there is a 403
``admin_key_required``; with client keys and no admin key they are refused to everyone (403
``admin_disabled``: fail closed). A missing or wrong key is a 401 with ``WWW-Authenticate:
Bearer``, in OpenAI's error shape (Anthropic's on its Messages paths), never echoing the key.
Keys are compared in constant time (SHA-256 digests, every key compared), and the client's key
never goes upstream. Details: docs/gateway-protocols.md.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable, Sequence

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.settings import GatewaySettings
from wire.errors import error_body, shaped

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""Paths served without a key (exact match)."""

_MISSING = (
    "Missing API key: this gateway requires one of its keys as `Authorization: Bearer <key>` "
    "or `x-api-key: <key>`."
)
_WRONG = "Incorrect API key provided."
_MISSING_ADMIN = (
    "Missing admin key: the admin endpoints require one of this gateway's admin keys as "
    "`Authorization: Bearer <key>` or `x-api-key: <key>`."
)


def presented_keys(headers: Iterable[tuple[bytes, bytes]]) -> list[bytes]:
    """The credentials a request presents, from its raw ASGI headers (lowercased names): the
    token of each ``Authorization: Bearer <token>`` header and the value of each ``x-api-key``
    header, stripped of surrounding spaces and tabs; empty values are left out."""
    out: list[bytes] = []
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.strip(b" \t").partition(b" ")
            if scheme.lower() == b"bearer":
                token = token.strip(b" \t")
                if token:
                    out.append(token)
        elif name == b"x-api-key":
            token = value.strip(b" \t")
            if token:
                out.append(token)
    return out


class KeyChecker:
    """Constant-time membership test of a presented key in a fixed set of keys (see the module
    docstring). ``keys`` must not be empty."""

    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise ValueError("KeyChecker needs at least one key")
        self._digests = [hashlib.sha256(k.encode("utf-8")).digest() for k in keys]

    def accepts(self, presented: bytes) -> bool:
        """True when ``presented`` (raw header bytes) equals one of the keys. Always compares
        against every key."""
        digest = hashlib.sha256(presented).digest()
        ok = False
        for ref in self._digests:
            ok |= hmac.compare_digest(digest, ref)
        return ok


def is_admin_path(path: str) -> bool:
    """True for ``/admin`` and every path under it."""
    return path == "/admin" or path.startswith("/admin/")


def is_score_path(path: str, session_path: str) -> bool:
    """True for ``{session_path}/{sid}/score`` (a client's score of a session: an admin key)."""
    base = session_path.rstrip("/") + "/"
    if not path.startswith(base):
        return False
    sid, _, rest = path[len(base) :].partition("/")
    return bool(sid) and rest == "score"


class ApiKeyMiddleware:
    """Pure ASGI middleware enforcing the client keys (``keys``) on every HTTP request outside
    :data:`OPEN_PATHS` and :func:`is_admin_path`, and the admin keys (``admin_keys``) on the admin
    paths (see the module docstring). Either may be empty (not both): no client key leaves the
    other paths open; no admin key closes the admin paths. Streaming responses pass through
    untouched: the check happens before the app runs, on the request headers only."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: Sequence[str],
        admin_keys: Sequence[str] = (),
        session_path: str = "/v1/sessions",
    ) -> None:
        if not keys and not admin_keys:
            raise ValueError("ApiKeyMiddleware needs a client key or an admin key")
        self.app = app
        self.session_path = session_path
        self.checker = KeyChecker(keys) if keys else None
        self.admin_checker = KeyChecker(admin_keys) if admin_keys else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        presented = presented_keys(scope["headers"])
        if is_admin_path(scope["path"]) or is_score_path(scope["path"], self.session_path):
            await self._admin(scope, receive, send, presented)
            return
        if self.checker is None or _accepted(self.checker, presented):
            await self.app(scope, receive, send)
            return
        await self._refuse(scope, receive, send, given=bool(presented))

    async def _admin(self, scope: Scope, receive: Receive, send: Send, presented: list[bytes]) -> None:
        if self.admin_checker is None:
            await self._refuse(
                scope,
                receive,
                send,
                given=bool(presented),
                status=403,
                code="admin_disabled",
                message="The admin endpoints are off: this gateway has client keys and no admin key "
                "(set auth.admin_api_keys or auth.admin_api_keys_env).",
            )
        elif _accepted(self.admin_checker, presented):
            await self.app(scope, receive, send)
        elif self.checker is not None and _accepted(self.checker, presented):
            await self._refuse(
                scope,
                receive,
                send,
                given=True,
                status=403,
                code="admin_key_required",
                message="This is a client key: the admin endpoints take an admin key (auth.admin_api_keys).",
            )
        else:
            await self._refuse(
                scope, receive, send, given=bool(presented), message=None if presented else _MISSING_ADMIN
            )

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        given: bool,
        status: int = 401,
        code: str = "invalid_api_key",
        message: str | None = None,
    ) -> None:
        text = message or (_WRONG if given else _MISSING)
        body = error_body(status, text, code=code, type_="invalid_request_error" if status == 401 else None)
        path: str = scope["path"]
        body = shaped(path, status, body)
        app = scope.get("app")
        gw = getattr(getattr(app, "state", None), "gw", None)
        metrics = getattr(gw, "metrics", None)
        if metrics is not None:
            metrics.error_responses.labels(str(status), code).inc()
        rejections = getattr(gw, "rejections", None)
        if rejections is not None:
            rejections.note(
                method=str(scope.get("method")),
                path=path,
                status=status,
                reason=code,
                message=f"{'wrong' if given else 'no'} API key" if status == 401 else code,
            )
        headers = (
            {"WWW-Authenticate": 'Bearer error="invalid_token"' if given else "Bearer"}
            if status == 401
            else None
        )
        response = JSONResponse(body, status_code=status, headers=headers)
        await response(scope, receive, send)


def _accepted(checker: KeyChecker, presented: list[bytes]) -> bool:
    ok = False
    for key in presented:  # every credential is checked: no early exit
        ok |= checker.accepts(key)
    return ok


def with_auth(app: ASGIApp, settings: GatewaySettings) -> ASGIApp:
    """``app`` behind :class:`ApiKeyMiddleware` when ``settings.auth`` has client or admin keys;
    ``app`` itself otherwise (auth off, the default)."""
    keys, admin_keys = settings.auth.keys(), settings.auth.admin_keys()
    if not keys and not admin_keys:
        return app
    log.info(
        "gateway auth on: %d client key(s), %d admin key(s)%s; open paths: %s",
        len(keys),
        len(admin_keys),
        "" if admin_keys else " (the admin endpoints are refused)",
        ", ".join(sorted(OPEN_PATHS)),
    )
    return ApiKeyMiddleware(app, keys=keys, admin_keys=admin_keys, session_path=settings.base_session_path)
