"""Optional API-key authentication of the gateway's own clients (``auth`` in the config).

With a key configured, every request needs one (``Authorization: Bearer <key>`` or ``x-api-key``),
except ``/healthz``, ``/readyz`` and ``/metrics``. A missing or wrong key is a 401 with
``WWW-Authenticate: Bearer``, in OpenAI's error shape (Anthropic's on its Messages paths), never
echoing the key. Keys are compared in constant time (SHA-256 digests, every key compared), and
the client's key never goes upstream. Details: docs/gateway-protocols.md.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable, Sequence

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import error_body, shaped
from gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""Paths served without a key (exact match)."""

_MISSING = ("Missing API key: this gateway requires one of its keys as `Authorization: Bearer <key>` "
            "or `x-api-key: <key>`.")
_WRONG = "Incorrect API key provided."


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


class ApiKeyMiddleware:
    """Pure ASGI middleware enforcing :class:`KeyChecker` on every HTTP request outside
    :data:`OPEN_PATHS` (see the module docstring). Streaming responses pass through untouched:
    the check happens before the app runs, on the request headers only."""

    def __init__(self, app: ASGIApp, *, keys: Sequence[str]) -> None:
        self.app = app
        self.checker = KeyChecker(keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        presented = presented_keys(scope["headers"])
        ok = False
        for key in presented:  # every credential is checked: no early exit
            ok |= self.checker.accepts(key)
        if ok:
            await self.app(scope, receive, send)
            return
        await self._refuse(scope, receive, send, given=bool(presented))

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, *, given: bool) -> None:
        body = error_body(401, _WRONG if given else _MISSING, code="invalid_api_key", type_="invalid_request_error")
        path: str = scope["path"]
        body = shaped(path, 401, body)
        challenge = 'Bearer error="invalid_token"' if given else "Bearer"
        app = scope.get("app")
        gw = getattr(getattr(app, "state", None), "gw", None)
        metrics = getattr(gw, "metrics", None)
        if metrics is not None:
            metrics.error_responses.labels("401", "invalid_api_key").inc()
        rejections = getattr(gw, "rejections", None)
        if rejections is not None:
            rejections.note(method=str(scope.get("method")), path=path, status=401, reason="invalid_api_key",
                            message=f"{'wrong' if given else 'no'} API key")
        response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": challenge})
        await response(scope, receive, send)


def with_auth(app: ASGIApp, settings: GatewaySettings) -> ASGIApp:
    """``app`` behind :class:`ApiKeyMiddleware` when ``settings.auth`` has keys; ``app`` itself
    otherwise (auth off, the default)."""
    keys = settings.auth.keys()
    if not keys:
        return app
    log.info("gateway auth on: %d key(s); open paths: %s", len(keys), ", ".join(sorted(OPEN_PATHS)))
    return ApiKeyMiddleware(app, keys=keys)
