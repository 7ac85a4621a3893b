"""argparse ``type=`` converters shared by the launcher's commands and the examples: each refuses
a bad value with one line (argparse prints ``error: argument --flag: <message>``, exit 2)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MAX_PORT = 65535


def port_number(text: str) -> int:
    """A TCP port: an integer 0..65535 (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0..{MAX_PORT})") from None
    if not 0 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0..{MAX_PORT}; 0: any free port)")
    return value


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer >= ``low``."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low} (it must be at least {low})")
        return value

    convert.__name__ = f"integer >= {low}"  # argparse names the type in its "invalid ... value" message
    return convert


def finite_float(*, low: float | None = None, positive: bool = False) -> Callable[[str], float]:
    """A finite float (no nan, inf), at least ``low`` when given, above 0 when ``positive``."""

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if low is not None and value < low:
            raise argparse.ArgumentTypeError(f"{text} is below {low:g}")
        if positive and value <= 0:
            raise argparse.ArgumentTypeError(f"{text} must be above 0")
        return value

    convert.__name__ = "number"
    return convert
