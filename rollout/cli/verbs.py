"""What the server commands (view, report, feed, export, serve) share on the command line: their
verbs' flags parsed, the HTTP edge flags and running a server until Ctrl-C or SIGTERM with its exit
code."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.http_edge import DEFAULT_KEEP_ALIVE_TIMEOUT_S, DEFAULT_REQUEST_HEAD_TIMEOUT_S, HostAllowList
from rollout.core.argtypes import finite_float, int_at_least
from rollout.servers.listener import HttpEdge


def parse_verb(ap: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``ap.parse_args(argv)`` for a parser of verbs (sub-commands), an unknown flag refused with
    the verb's own usage line rather than the parser's."""
    args, extra = ap.parse_known_args(argv)
    if extra:
        verbs = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
        verbs.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def run_command(
    start: Callable[[], Coroutine[Any, Any, object]],
    host: str,
    port: int,
    setup_errors: tuple[type[Exception], ...],
) -> int:
    """Run a server command (``start()`` builds its coroutine, inside the error handling) until it
    stops; the exit code: 0 when stopped (Ctrl-C, SIGTERM), 1 with ``error: ...`` on stderr for
    one of ``setup_errors`` or a port it cannot listen on (OSError)."""
    try:
        asyncio.run(start())
    except setup_errors as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: cannot listen on {host}:{port}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def add_edge_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`HttpEdge` on a server command's parser."""
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        dest="allowed_hosts",
        type=_host_entry,
        metavar="NAME[:PORT]",
        help="a Host name to answer besides loopback and --host "
        "(repeatable; '*': any, which lets web pages read it by DNS rebinding)",
    )
    parser.add_argument(
        "--request-head-timeout-s",
        type=finite_float(positive=True),
        default=DEFAULT_REQUEST_HEAD_TIMEOUT_S,
        help="close a connection that has not sent a "
        f"complete request head within this time (default {DEFAULT_REQUEST_HEAD_TIMEOUT_S:g} s)",
    )
    parser.add_argument(
        "--keep-alive-timeout-s",
        type=int_at_least(1),
        default=DEFAULT_KEEP_ALIVE_TIMEOUT_S,
        help=f"close a connection idle this long after an answer (default {DEFAULT_KEEP_ALIVE_TIMEOUT_S} s)",
    )


def _host_entry(value: str) -> str:
    try:
        HostAllowList([value])
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def edge_of(args: argparse.Namespace) -> HttpEdge:
    """The :class:`HttpEdge` of parsed :func:`add_edge_flags` flags."""
    return HttpEdge(tuple(args.allowed_hosts), args.request_head_timeout_s, args.keep_alive_timeout_s)
