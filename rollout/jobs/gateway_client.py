"""The launcher's own calls to the gateway while a job runs: closing a session and probing
readiness (aiohttp, not httpx: a close per session, and httpx cost 3x more launcher CPU per close)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from rollout.jobs.processes import auth_headers, gateway_root, readyz_error


class GatewayClient:
    """Closes sessions under ``session_url`` (the gateway's session base URL) and probes its
    ``/readyz``, on one aiohttp session."""

    def __init__(self, http: aiohttp.ClientSession, session_url: str) -> None:
        self._http = http
        self.session_url = session_url.rstrip("/")

    async def close(self, sid: str, status: str) -> dict[str, Any]:
        """Close the gateway session; returns the gateway's answer, or ``{"error": ...}`` when the
        gateway did not answer or answered with an error."""
        url = f"{self.session_url}/{sid}/close"
        try:
            async with self._http.post(url, json={"reason": status, "completion_mode": status}) as r:
                if r.status != 200:
                    return {
                        "error": f"closing the gateway session failed: HTTP {r.status}: {(await r.text())[:200]}"
                    }
                return dict(await r.json())
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            return {"error": f"closing the gateway session failed: {type(e).__name__}: {e}"}

    async def ready(self, models: Sequence[str]) -> str | None:
        """GET the gateway's ``/readyz`` for each route (it checks the route's upstream too); None
        when it answers ready, else why not."""
        url = gateway_root(self.session_url) + "/readyz"
        for model in models:
            try:
                async with self._http.get(
                    url, params={"route": model}, timeout=aiohttp.ClientTimeout(total=10)
                ) as r:
                    if r.status != 200:
                        return f"{url}?route={model}: HTTP {r.status}: {readyz_error(await r.text())}"
            except (aiohttp.ClientError, TimeoutError) as e:
                return f"{url}: {type(e).__name__}: {e}"
        return None


@asynccontextmanager
async def gateway_client(session_url: str, api_key: str | None) -> AsyncIterator[GatewayClient]:
    """A :class:`GatewayClient` sending ``api_key``; a close may wait for the session's last call."""
    timeout = aiohttp.ClientTimeout(total=None, connect=30, sock_connect=30, sock_read=120)
    async with aiohttp.ClientSession(
        timeout=timeout, headers=auth_headers(api_key), connector=aiohttp.TCPConnector(limit=0)
    ) as http:
        yield GatewayClient(http, session_url)
