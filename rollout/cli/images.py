"""``launcher.py images``: the cache of unpacked container images (docs/images.md): list it
(``images``, ``--json``), or remove what was not used for ``--days N`` (``images prune --days N``,
``images prune --all``), never an image a running launcher holds. Exit 0, 2 for bad flags."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime

from rollout.core.argtypes import finite_float
from rollout.sandbox.images import CacheEntry, cache_entries, cache_root, prune

DAY_S = 86400.0


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``images`` and ``images prune``."""
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="launcher.py images",
        description="List the cache of unpacked container images, or prune it "
        "($ROLLOUT_IMAGE_CACHE, else ~/.cache/rollout-factory/images).",
    )
    ap.add_argument("--json", action="store_true", help="one JSON object per image instead of the table")
    sub = ap.add_subparsers(dest="command")
    pr = sub.add_parser(
        "prune",
        allow_abbrev=False,
        help="remove images not used for --days N, or --all",
        description="Remove unpacked images; never one a running launcher uses.",
    )
    which = pr.add_mutually_exclusive_group(required=True)
    which.add_argument("--days", type=finite_float(positive=True), help="those not used for N days")
    which.add_argument("--all", action="store_true", help="all of them")
    pr.add_argument("--json", action="store_true", help="one JSON object per removed image")
    return ap


def _human(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value, units = size / 1024, ["KB", "MB", "GB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:.1f} {units[0]}"


def _table(entries: list[CacheEntry]) -> str:
    rows = [("IMAGE", "REF", "SIZE", "LAST USED", "IN USE")] + [
        (
            e.name,
            e.ref or "(unfinished)",
            _human(e.size),
            datetime.fromtimestamp(e.last_used, UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "yes" if e.in_use else "",
        )
        for e in entries
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def main(argv: list[str]) -> int:
    """``images [--json]`` or ``images prune (--days N | --all) [--json]``; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "prune":
        gone = prune(None if args.all else args.days * DAY_S, now=time.time())
        if args.json:
            for e in gone:
                print(json.dumps(e.model_dump()))
        else:
            freed = sum(e.size for e in gone)
            print(f"removed {len(gone)} image(s) from {cache_root()}, {_human(freed)} freed")
        return 0
    entries = cache_entries()
    if args.json:
        for e in entries:
            print(json.dumps(e.model_dump()))
    elif entries:
        print(_table(entries))
    else:
        print(f"no unpacked images in {cache_root()}", file=sys.stderr)
    return 0
