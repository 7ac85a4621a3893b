"""Removing secrets from what is recorded (DB rows and the request log).

A key is a secret when its name, lower-cased, is ``authorization``/``proxy-authorization`` or
contains ``api_key``/``api-key``/``apikey``/``secret``/``password``/``access_token``/
``refresh_token``/``bearer``, or ends in ``_token``/``-token`` or equals ``token``. Token-count
fields (``max_tokens``, ``prompt_tokens``, ``*_tokens``) are not secrets and are kept.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[REDACTED]"
_SECRET = re.compile(
    r"^(authorization|proxy-authorization|token|cookie|set-cookie)$"
    r"|api[_-]?key|secret|password|passwd|access[_-]token|refresh[_-]token|bearer|[_-]token$",
    re.IGNORECASE,
)


def is_secret_key(name: str) -> bool:
    """True when a field or header name names a secret (see the module docstring)."""
    return bool(_SECRET.search(name))


def redact(obj: Any) -> Any:
    """A copy of a JSON value with the values of secret-named keys replaced by ``[REDACTED]``."""
    if isinstance(obj, dict):
        return {k: (REDACTED if isinstance(k, str) and is_secret_key(k) else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    return obj
