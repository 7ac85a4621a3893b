"""Removing secrets from what is recorded (DB rows and the request log).

A key is secret when its name looks like a credential (``authorization``, ``*api_key*``,
``*secret*``, ``*password*``, ``*_token``, ...); token counts (``max_tokens``, ``*_tokens``) are
not. :func:`redact_request` leaves model-visible content (``messages``, ``tools``, ``input``,
...) as sent: it is what the model saw. Client and route credentials travel in headers and are
never recorded.
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

# Top-level request fields that carry model-visible content (OpenAI chat/responses, Anthropic
# messages): recorded untouched by redact_request.
CONTENT_FIELDS = frozenset(
    {
        "messages",
        "tools",
        "functions",
        "tool_choice",
        "function_call",
        "response_format",
        "prediction",
        "input",
        "instructions",
        "system",
        "prompt",
    }
)


def is_secret_key(name: str) -> bool:
    """True when a field or header name names a secret (see the module docstring)."""
    return bool(_SECRET.search(name))


def redact(obj: Any) -> Any:
    """A copy of a JSON value with the values of secret-named keys (at any depth) replaced by
    ``[REDACTED]``."""
    if isinstance(obj, dict):
        return {
            k: (REDACTED if isinstance(k, str) and is_secret_key(k) else redact(v)) for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    return obj


def redact_request(body: Any) -> Any:
    """A copy of a request body for recording: :func:`redact` applied to every top-level field
    except the content fields (:data:`CONTENT_FIELDS`), which are kept as sent. A non-dict body
    is redacted as a whole."""
    if not isinstance(body, dict):
        return redact(body)
    out: dict[str, Any] = {}
    for k, v in body.items():
        if isinstance(k, str) and is_secret_key(k):
            out[k] = REDACTED
        elif k in CONTENT_FIELDS:
            out[k] = v
        else:
            out[k] = redact(v)
    return out
