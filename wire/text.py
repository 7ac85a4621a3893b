"""Text that becomes bytes: the one rule for what no UTF-8 text can carry (docs/storage.md,
"Text that is not UTF-8").

A JSON string may hold ``"\\ud800"``, a lone UTF-16 surrogate: valid JSON that Python decodes to a
``str`` no UTF-8 encoder accepts; PostgreSQL also refuses NUL (``\\u0000``) in its text. JSON
output keeps such a character exactly, as its ``\\uXXXX`` escape (:func:`json_text`); a text column
stores it escaped (:func:`column_text`); HTML and other UTF-8-only output show U+FFFD instead
(:func:`display_text`).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["column_text", "display_text", "json_text", "utf8_ok"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_COLUMN_UNSAFE = re.compile("[\x00\ud800-\udfff]")


def utf8_ok(text: str) -> bool:
    """True when ``text`` encodes to UTF-8 as it is (it holds no lone surrogate)."""
    return text.isascii() or _SURROGATE.search(text) is None


def json_text(obj: Any, **kw: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False, **kw)``, except that when a string holds a lone
    surrogate the whole text is written with ``\\uXXXX`` escapes (``ensure_ascii``): either way
    the text encodes to UTF-8 and reads back to ``obj``."""
    text = json.dumps(obj, ensure_ascii=False, **kw)
    return text if utf8_ok(text) else json.dumps(obj, ensure_ascii=True, **kw)


def _escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def column_text(text: str) -> str:
    """``text`` as a text column stores it on every backend: each lone surrogate and NUL written
    as its escape (``\\ud800``, ``\\u0000``: six characters); other text unchanged."""
    if text.isascii() and "\x00" not in text:
        return text
    return _COLUMN_UNSAFE.sub(_escape, text)


def display_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD: for HTML pages and Parquet strings,
    which carry UTF-8 only."""
    return text if utf8_ok(text) else _SURROGATE.sub("\ufffd", text)
