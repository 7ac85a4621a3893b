"""Keeping the gateway's policy version in step with the trainer's weights: a call to set it
(``POST /admin/policy_version``, docs/tokens.md) and a ``transformers`` trainer callback that holds
the policy server's weights lock across each optimizer step and sets the version after it."""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

import httpx
from transformers import TrainerCallback

__all__ = ["PolicySync", "set_policy_version"]


def _origin(gateway_url: str) -> str:
    parts = urlsplit(gateway_url)
    if not parts.scheme or not parts.netloc:
        raise ValueError(f"not a gateway URL: {gateway_url!r}")
    return f"{parts.scheme}://{parts.netloc}"


def set_policy_version(
    gateway_url: str, version: int, *, api_key: str | None = None, timeout_s: float = 30.0
) -> dict[str, Any]:
    """Set the gateway's policy version (every step admitted after it carries ``version``).
    ``gateway_url``: its origin or any URL on it (e.g. the session base URL); ``api_key``: an
    admin key when the gateway asks for one. Returns the gateway's answer (``policy_version``,
    ``previous``, ...); raises ``httpx.HTTPStatusError`` on a refusal."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.post(
        _origin(gateway_url) + "/admin/policy_version",
        json={"version": version},
        headers=headers,
        timeout=timeout_s,
    )
    r.raise_for_status()
    answer: dict[str, Any] = r.json()
    return answer


class PolicySync(TrainerCallback):  # type: ignore[misc]
    """For a ``transformers``/TRL trainer whose model a :class:`~rollout.train.policy_server.PolicyServer`
    serves: takes ``lock`` (the server's) before each optimizer step and releases it after, so no
    generation sees half-updated weights, then sets the gateway's policy version to the number of
    optimizer steps done (``start_version`` at the start of training)."""

    def __init__(
        self, lock: threading.Lock, gateway_url: str, *, api_key: str | None = None, start_version: int = 0
    ) -> None:
        self.lock, self.gateway_url, self.api_key = lock, gateway_url, api_key
        self.version = start_version

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        set_policy_version(self.gateway_url, self.version, api_key=self.api_key)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.lock.acquire()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.lock.release()
        self.version += 1
        set_policy_version(self.gateway_url, self.version, api_key=self.api_key)
