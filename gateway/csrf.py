"""Refusing requests a web page could make (cross-site request forgery).

The gateway serves no web page, so a state-changing request (any method but ``GET``, ``HEAD``
and ``OPTIONS``) that a browser sends for a page is refused, 403 ``cross_site_request``: a
browser marks it with an ``Origin`` header (sent with every such request, Fetch standard) or a
``Sec-Fetch-Site`` other than ``none``. Bodies are checked too: a browser's simple request (no
CORS preflight) can only carry ``text/plain``, ``application/x-www-form-urlencoded`` or
``multipart/form-data``, so a body of a control endpoint (``/admin/...``, a session's
``close``) must be ``application/json`` (or ``application/*+json``), and any other body that
names a type must name JSON: 415 ``unsupported_media_type`` otherwise. Both checks run in
front of every endpoint, the model-call fast path included (behind the API-key check).
Details: docs/gateway-protocols.md.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth import is_admin_path
from gateway.errors import GatewayError, gateway_error_response
from wire.errors import error_body

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_BROWSER_SITES = frozenset({b"cross-site", b"same-site", b"same-origin"})


def is_json_type(content_type: bytes) -> bool:
    """True for ``application/json`` and ``application/<x>+json``, any parameters, any case."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


class CrossSiteGuard:
    """Pure ASGI middleware applying the module's rules; ``base_session_path`` (e.g.
    ``/v1/sessions``) tells a session's close path."""

    def __init__(self, app: ASGIApp, base_session_path: str) -> None:
        self.app = app
        self._sessions = base_session_path.rstrip("/") + "/"

    def is_control_path(self, path: str) -> bool:
        """``/admin/...``, ``{base}/{session_id}/close`` or ``.../score``."""
        if is_admin_path(path):
            return True
        if not path.startswith(self._sessions):
            return False
        sid, sep, rest = path[len(self._sessions) :].partition("/")
        return bool(sid) and rest in ("close", "score")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        why = self._refusal(scope)
        if why is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        await gateway_error_response(request, why)(scope, receive, send)

    def _refusal(self, scope: Scope) -> GatewayError | None:
        why = browser_refusal(scope, json_only=self.is_control_path(scope["path"]))
        return None if why is None else GatewayError(why[0], why[2], code=why[1])


def browser_refusal(scope: Scope, *, json_only: bool) -> tuple[int, str, str] | None:
    """``(status, code, message)`` refusing a state-changing request ``scope`` by the module's
    rules, None when it may go on; ``json_only``: a body must name a JSON type (a control endpoint)."""
    origin = site = content_type = None
    has_body = False
    for name, value in scope["headers"]:
        if name == b"origin":
            origin = value
        elif name == b"sec-fetch-site":
            site = value.strip().lower()
        elif name == b"content-type":
            content_type = value
        elif name == b"content-length":
            has_body = value.strip() not in (b"", b"0")
        elif name == b"transfer-encoding":
            has_body = True
    method, path = scope["method"], scope["path"]
    if origin is not None or site in _BROWSER_SITES:
        return (
            403,
            "cross_site_request",
            (
                f"{method} {path} came from a web page (it has an Origin or "
                "Sec-Fetch-Site header); this server serves no page and refuses such "
                "requests"
            ),
        )
    if content_type is not None and not is_json_type(content_type):
        return (
            415,
            "unsupported_media_type",
            (
                f"{method} {path} takes a JSON body (Content-Type: application/json), "
                f"not {content_type.decode('latin-1')[:100]!r}"
            ),
        )
    if json_only and has_body and content_type is None:
        return (
            415,
            "unsupported_media_type",
            (f"{method} {path} has a body without a Content-Type; send it as Content-Type: application/json"),
        )
    return None


class JsonOnlyGuard:
    """Pure ASGI middleware for a server serving no page whose every state-changing endpoint is a
    control endpoint (``launcher.py serve``): :func:`browser_refusal` with ``json_only``, answered
    in OpenAI's error shape."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        why = None
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            why = browser_refusal(scope, json_only=True)
        if why is None:
            await self.app(scope, receive, send)
            return
        status, code, message = why
        await JSONResponse(error_body(status, message, code=code), status_code=status)(scope, receive, send)


def with_csrf_guard(app: ASGIApp, base_session_path: str) -> ASGIApp:
    """``app`` behind :class:`CrossSiteGuard`."""
    return CrossSiteGuard(app, base_session_path)
