"""``python launcher.py feed`` (serve the feed of ready groups), ``python launcher.py export``
(write a job's groups, or sessions without a job, to a file) and ``python launcher.py serve`` (the long-running mode:
``rollout.servers.batches``). Exit codes: 0 done, 1 the store, the job or the output cannot
be used (the message says why), 2 bad flags."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import DatabaseError

from rollout.cli.next_steps import latest_job_line
from rollout.cli.verbs import add_edge_flags, edge_of, parse_verb, run_command
from rollout.core.argtypes import finite_float, int_at_least, port_number
from rollout.core.logs import setup_logging
from rollout.jobs.options import flag_help
from rollout.results.groups import GroupOptions
from rollout.servers.feed.app import FeedSettings, create_feed_app
from rollout.servers.feed.export import ExportError, export_job, export_sessions
from rollout.servers.listener import listen, run_server, url_of
from store import JOB_ID_PATTERN, DbUrlError, Store, StoreUnavailable
from store.engine import sqlite_read_only
from store.feed import FeedQueries
from store.stepcodec import StepDecodeError

DEFAULT_PORT = 8766
COMMANDS = ("feed", "export", "serve")
SERVE_PORT = 8767
_SUFFIX = {"jsonl": ".jsonl", "parquet": ".parquet", "openai": ".openai.jsonl"}


def _job_id(value: str) -> str:
    if not re.fullmatch(JOB_ID_PATTERN, value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a job id (letters, digits, '.', '_', '-')")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``feed`` and ``export`` sub-commands."""
    ap = argparse.ArgumentParser(
        allow_abbrev=False, prog="launcher.py", description="Serve or export finished groups for training."
    )
    sub = ap.add_subparsers(dest="command", required=True)
    feed = sub.add_parser(
        "feed", allow_abbrev=False, help="serve the feed of ready groups (GET /v1/jobs/{job_id}/groups)"
    )
    feed.add_argument(
        "--db-path", default="sqlite://env_trajs.db", help="trajectory store (default sqlite://env_trajs.db)"
    )
    feed.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)"
    )
    feed.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT}; 0: any free port)",
    )
    feed.add_argument(
        "--min-valid-samples",
        type=int_at_least(1),
        default=2,
        help="valid samples a group needs to be trainable (default 2; a request may set min_valid)",
    )
    feed.add_argument(
        "--poll-interval-s",
        type=finite_float(positive=True),
        default=0.2,
        help="how often the store is polled while a client waits (default 0.2 s)",
    )
    feed.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    add_edge_flags(feed)
    exp = sub.add_parser(
        "export",
        allow_abbrev=False,
        help="write a job's groups (or sessions without a job) as jsonl, parquet or the OpenAI chat format",
    )
    which = exp.add_mutually_exclusive_group()
    which.add_argument("--job-id", type=_job_id, help="the job (default: the latest job of the store)")
    which.add_argument(
        "--session",
        action="append",
        metavar="ID",
        help="a session without a job (a client named it on the gateway); repeat for more",
    )
    which.add_argument(
        "--without-job", action="store_true", help="every session without a job (no score: never graded)"
    )
    exp.add_argument(
        "--format",
        choices=["jsonl", "parquet", "openai"],
        default="jsonl",
        help="jsonl (default), parquet (needs pyarrow: the export extra) or openai (fine-tuning chat)",
    )
    exp.add_argument(
        "--per", choices=["session", "step"], default="session", help="one row per session (default) or step"
    )
    exp.add_argument(
        "--only-trainable",
        action="store_true",
        help="only valid samples of trainable groups (no infrastructure failure, broken grader, unscored or flagged sample; a grading failure the agent caused is a valid 0)",
    )
    exp.add_argument(
        "--min-score",
        type=finite_float(),
        help="only samples scored at least this (e.g. 10 for SFT on passes)",
    )
    exp.add_argument(
        "--min-valid-samples",
        type=int_at_least(1),
        default=2,
        help="valid samples a trainable group needs (default 2)",
    )
    exp.add_argument(
        "--normalize",
        choices=["std", "none"],
        default="std",
        help="advantage: (score - mean) / std (default) or score - mean",
    )
    exp.add_argument(
        "--db-path", default="sqlite://env_trajs.db", help="trajectory store (default sqlite://env_trajs.db)"
    )
    exp.add_argument(
        "--out",
        type=Path,
        help="output file (default runs/export-<job id>.<format>, "
        "runs/export-without-job.<format> for sessions without a job)",
    )
    srv = sub.add_parser(
        "serve",
        allow_abbrev=False,
        help="long-running: start the gateway once, run batches a trainer submits "
        "(POST /v1/batches) and serve their groups",
    )
    srv.add_argument("--agent-root", type=Path, help=flag_help("agent_root"))
    srv.add_argument("--gateway-config", type=Path, help=flag_help("gateway_config"))
    srv.add_argument("--gateway-base-url", help=flag_help("gateway_base_url"))
    srv.add_argument("--llm-model", help="default route of batches (default: the gateway config's)")
    srv.add_argument("--db-path", help=flag_help("db_path"))
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    srv.add_argument(
        "--port", type=port_number, default=SERVE_PORT, help=f"port (default {SERVE_PORT}; 0: any free port)"
    )
    srv.add_argument("--pool-size", type=int_at_least(1), help=flag_help("pool_size"))
    srv.add_argument(
        "--no-evaluation", action="store_true", help="do not grade (default: grade every session)"
    )
    srv.add_argument("--eval-timeout", type=finite_float(positive=True), help=flag_help("eval_timeout"))
    srv.add_argument("--sandbox", choices=["bwrap", "none"], help=flag_help("sandbox"))
    srv.add_argument("--max-retries", type=int_at_least(0), help=flag_help("max_retries"))
    srv.add_argument("--retry-backoff-s", type=finite_float(low=0), help=flag_help("retry_backoff_s"))
    srv.add_argument(
        "--min-valid-samples",
        type=int_at_least(1),
        default=2,
        help="valid samples a trainable group needs (default 2)",
    )
    srv.add_argument(
        "--poll-interval-s",
        type=finite_float(positive=True),
        default=0.2,
        help="feed poll interval (default 0.2 s)",
    )
    srv.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    add_edge_flags(srv)
    return ap


def _serve_options(args: argparse.Namespace) -> Any:
    """``serve``'s flags as the JobOptions its batches start from; SetupError naming a bad flag."""
    from rollout.cli.options import default_gateway_config, options_of
    from rollout.jobs.options import JobOptions

    return options_of(
        JobOptions,
        args,
        gateway_config=args.gateway_config or default_gateway_config(),
        enable_evaluation=not args.no_evaluation,
    )


def serve_main(args: argparse.Namespace) -> int:
    """``serve``: exit 0 when stopped, 1 when it cannot start."""
    from rollout.core.setup import SetupError
    from rollout.servers.batches import serve as serve_batches

    setup_logging(args.log_level)
    return run_command(
        lambda: serve_batches(
            _serve_options(args),
            args.host,
            args.port,
            FeedSettings(min_valid=args.min_valid_samples, poll_interval_s=args.poll_interval_s),
            edge_of(args),
            on_listening=lambda line: print(line, flush=True),
        ),
        args.host,
        args.port,
        (SetupError, ValidationError),
    )


async def _open(url: str, *, reads_only: bool = False) -> Store:
    """The store at ``url``, with the feed's table created when a store made by an older version
    lacks it; with ``reads_only``, a SQLite file this process cannot write is read as it is (nothing
    created). Raises DbUrlError / FileNotFoundError for a bad URL or a missing SQLite file."""
    store = Store(url)
    if store.path is not None and not Path(store.path).is_file():
        await store.close()
        raise FileNotFoundError(f"no trajectory store at {store.path} (run a job first, or pass --db-path)")
    if store.path is not None and Path(store.path).stat().st_size == 0:
        await store.close()  # an empty file is not a store: never turned into one by a reader
        raise FileNotFoundError(
            f"{store.path} is an empty file, not a trajectory store (run a job first, or pass --db-path)"
        )
    if reads_only and store.path is not None and sqlite_read_only(Path(store.path)):
        return store
    await store.init()
    return store


async def serve(args: argparse.Namespace) -> None:
    """Open the store and serve the feed until cancelled (Ctrl-C)."""
    store = await _open(args.db_path)
    try:
        sock = listen(args.host, args.port, exposes="every trajectory")
        print(f"feed on {url_of(sock)} (store {store.identity()}); Ctrl-C stops it", flush=True)
        app = create_feed_app(
            FeedQueries(store.reader),
            FeedSettings(min_valid=args.min_valid_samples, poll_interval_s=args.poll_interval_s),
            backfill=store.backfill_feed,
        )
        await run_server(app, sock, args.host, edge_of(args))
    finally:
        await store.close()


async def export(args: argparse.Namespace) -> int:
    """Write the export; prints what was written and what was left out."""
    store = await _open(args.db_path, reads_only=True)
    try:
        jobless = args.session is not None or args.without_job
        if not jobless and args.job_id is None:
            jobs = await FeedQueries(store.reader).jobs_newest_first()
            if not jobs:
                raise ExportError(
                    f"no job in {store.identity()} (run a job first; --session ID or --without-job "
                    "export sessions without a job)"
                )
            args.job_id = jobs[0]
            print(latest_job_line(jobs[0], len(jobs), store.identity()), file=sys.stderr)
        name = args.job_id or "without-job"
        out = args.out or Path("runs") / f"export-{name}{_SUFFIX[args.format]}"
        if args.job_id is None:
            result = await export_sessions(
                FeedQueries(store.reader),
                args.session,
                args.format,
                out,
                per=args.per,
                only_trainable=args.only_trainable,
                min_score=args.min_score,
            )
        else:
            result = await export_job(
                FeedQueries(store.reader),
                args.job_id,
                args.format,
                out,
                per=args.per,
                only_trainable=args.only_trainable,
                min_score=args.min_score,
                opts=GroupOptions(min_valid=args.min_valid_samples, normalize=args.normalize),
            )
    finally:
        await store.close()
    print(f"{result.rows} rows ({args.format}, one per {args.per}) written to {result.path}")
    for why, n in sorted(result.skipped.items()):
        print(f"  left out {n}: {why}")
    if result.incomplete:
        print(
            f"warning: {result.incomplete} group(s) of job {args.job_id} had sessions not ended (a job still "
            "running, or stopped): written flagged incomplete, never trainable; export again once it has ended",
            file=sys.stderr,
        )
    return 0


def main(argv: list[str]) -> int:
    """Run ``feed`` or ``export``; returns the exit code."""
    args = parse_verb(build_parser(), argv)
    if args.command == "serve":
        return serve_main(args)
    if args.command == "feed":
        setup_logging(args.log_level)
        return run_command(
            lambda: serve(args), args.host, args.port, (DbUrlError, FileNotFoundError, StoreUnavailable)
        )
    try:
        return asyncio.run(export(args))
    except (DbUrlError, FileNotFoundError, StoreUnavailable, ExportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except StepDecodeError as e:  # a damaged row of the store: named, nothing written
        print(f"error: the store cannot be read: {e}", file=sys.stderr)
        return 1
    except DatabaseError as e:  # a damaged database file
        print(f"error: the store cannot be read: {e.orig or e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: cannot write the export: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
