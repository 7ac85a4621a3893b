"""The trainer's weight-sync hook (``/admin/policy_version``, ``/admin/pause``, ``/admin/resume``):
:class:`PolicyControl` holds the policy version stamped on each step and admits model calls
(docs/tokens.md). Admin keys only (:mod:`gateway.auth`)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from gateway.bodies import read_control_body
from gateway.errors import parse_body
from store import MAX_INT

__all__ = ["PolicyControl", "build_admin_router"]

DEFAULT_PAUSE_TIMEOUT_S = 600.0
MAX_PAUSE_TIMEOUT_S = 86400.0


class PolicyControl:
    """The policy version (in memory; None until set) and the admission of model calls: while paused a
    new call waits before it reserves; a pause answers once the calls admitted before it ended."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.paused = False
        self.in_flight = 0
        self.waiting = 0
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._idle = asyncio.Event()
        self._idle.set()

    def admit_now(self) -> int | None:
        """Admit a call at once (the caller checked ``paused`` is False); returns the policy
        version its step is stamped with. Every admitted call must be ended with :meth:`done`."""
        self.in_flight += 1
        self._idle.clear()
        return self.version

    async def admit(self) -> int | None:
        """Wait while paused, then admit the call (:meth:`admit_now`). A cancelled wait admits
        nothing."""
        while self.paused:
            self.waiting += 1
            try:
                await self._resumed.wait()
            finally:
                self.waiting -= 1
        return self.admit_now()

    def done(self) -> None:
        """An admitted call ended (its step was queued, or it ended without one)."""
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self._idle.set()

    def set_version(self, version: int) -> int | None:
        """Stamp ``version`` on every step admitted from now on; returns the previous version."""
        previous, self.version = self.version, version
        return previous

    async def pause(self, timeout_s: float) -> bool:
        """Hold new calls, then wait until no admitted call is left, at most ``timeout_s``
        seconds. Returns True when none is left (the upstream is idle)."""
        self.paused = True
        self._resumed.clear()
        if self.in_flight == 0:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def resume(self) -> int:
        """Let held and new calls go; returns how many were waiting."""
        released = self.waiting
        self.paused = False
        self._resumed.set()
        return released

    def state(self) -> dict[str, Any]:
        """``{"policy_version", "paused", "in_flight", "waiting"}``."""
        return {
            "policy_version": self.version,
            "paused": self.paused,
            "in_flight": self.in_flight,
            "waiting": self.waiting,
        }


class PolicyVersionRequest(BaseModel):
    """``POST /admin/policy_version`` body: ``{"version": <integer >= 0>}``."""

    model_config = ConfigDict(extra="forbid")

    version: StrictInt = Field(ge=0, le=MAX_INT)


class PauseRequest(BaseModel):
    """``POST /admin/pause`` body (optional): ``timeout_s``, how long to wait for the calls in
    flight (a JSON number of seconds, 0 to 86400, default 600; 0 answers at once)."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(
        default=DEFAULT_PAUSE_TIMEOUT_S, ge=0, le=MAX_PAUSE_TIMEOUT_S, strict=True, allow_inf_nan=False
    )


class ResumeRequest(BaseModel):
    """``POST /admin/resume`` body (optional): no field; an empty body or ``{}``."""

    model_config = ConfigDict(extra="forbid")


def _control(request: Request) -> PolicyControl:
    control: PolicyControl = request.app.state.gw.policy
    return control


async def _body(request: Request, model: type[BaseModel], *, optional: bool) -> Any:
    return parse_body(
        await read_control_body(request), model, f"invalid {request.url.path} body", optional=optional
    )


async def get_policy_version(request: Request) -> dict[str, Any]:
    """The current version, whether calls are held, and the counts of calls in flight and held."""
    return _control(request).state()


async def set_policy_version(request: Request) -> dict[str, Any]:
    """Set the version stamped on every step admitted after this answer."""
    req: PolicyVersionRequest = await _body(request, PolicyVersionRequest, optional=False)
    control = _control(request)
    previous = control.set_version(req.version)
    return {**control.state(), "previous": previous}


async def pause(request: Request) -> dict[str, Any]:
    """Hold new model calls; answer once the calls in flight have ended (``drained``) or at
    ``timeout_s`` (``drained: false``)."""
    req: PauseRequest = await _body(request, PauseRequest, optional=True)
    control = _control(request)
    drained = await control.pause(req.timeout_s)
    return {**control.state(), "drained": drained}


async def resume(request: Request) -> dict[str, Any]:
    """Let the held calls and new ones go: ``{"policy_version", "paused": false, "released": n}``
    (``n``: calls that were held). A body other than empty or ``{}`` is a 400."""
    await _body(request, ResumeRequest, optional=True)
    control = _control(request)
    released = control.resume()
    return {"policy_version": control.version, "paused": False, "released": released}


def build_admin_router() -> APIRouter:
    """The ``/admin/...`` routes of this module."""
    r = APIRouter()
    r.add_api_route("/admin/policy_version", get_policy_version, methods=["GET"])
    r.add_api_route("/admin/policy_version", set_policy_version, methods=["POST"])
    r.add_api_route("/admin/pause", pause, methods=["POST"])
    r.add_api_route("/admin/resume", resume, methods=["POST"])
    return r
