"""``launcher.py grade``: sessions recorded without a job graded with an env's evaluator, as a new
job (:mod:`rollout.jobs.grade_sessions`; docs/regrade.md, "Sessions without a job"). Exit codes:
0 every session scored, 2 an evaluator failed or the grader is broken on one, 1 a setup error."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path

from rollout.cli.options import options_of
from rollout.core.argtypes import finite_float, int_at_least
from rollout.core.logs import plural, setup_logging
from rollout.core.setup import SetupError
from rollout.jobs.grade_sessions import GradeOptions, grade_sessions
from rollout.jobs.options import flag_help
from rollout.results.report import render_table, summarize
from store.stepcodec import StepDecodeError


def _when(text: str) -> datetime:
    """An ISO 8601 time (UTC when it names no zone)."""
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time (e.g. 2026-05-01T12:00:00Z)"
        ) from None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _tag(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE (a key of the first request's metadata)")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``grade``."""
    ap = argparse.ArgumentParser(
        prog="launcher.py grade",
        allow_abbrev=False,
        description="Grade sessions recorded without a job (a client named them on the "
        "gateway) with an env's rule_evaluator.py, as a new job.",
    )
    ap.add_argument(
        "--env", required=True, dest="env_name", metavar="NAME", help="the env whose evaluator grades them"
    )
    ap.add_argument(
        "--session",
        action="append",
        dest="session_ids",
        default=[],
        metavar="ID",
        help="a session without a job (repeatable)",
    )
    ap.add_argument(
        "--tag",
        type=_tag,
        metavar="KEY=VALUE",
        help="the sessions whose first request's metadata has KEY equal to VALUE",
    )
    ap.add_argument(
        "--since", type=_when, metavar="TIME", help="sessions whose first call is at or after TIME (ISO 8601)"
    )
    ap.add_argument(
        "--until", type=_when, metavar="TIME", help="sessions whose first call is before TIME (ISO 8601)"
    )
    case = ap.add_mutually_exclusive_group(required=True)
    case.add_argument("--case", dest="case_id", metavar="ID", help="every session is this case of the env")
    case.add_argument(
        "--case-field", metavar="KEY", help="each session's case id: its first request's metadata KEY"
    )
    ap.add_argument(
        "--include-active",
        action="store_true",
        help="also grade sessions the gateway has not closed (what they recorded so far)",
    )
    ap.add_argument("--job-id", help="the new job's id (default: generated)")
    ap.add_argument("--agent-root", type=Path, help=flag_help("agent_root", GradeOptions))
    ap.add_argument("--db-path", help=flag_help("db_path", GradeOptions))
    ap.add_argument(
        "--eval-timeout", type=finite_float(positive=True), help=flag_help("eval_timeout", GradeOptions)
    )
    ap.add_argument("--pool-size", type=int_at_least(1), help=flag_help("pool_size", GradeOptions))
    ap.add_argument(
        "--grader-isolation", choices=["bwrap", "none"], help=flag_help("grader_isolation", GradeOptions)
    )
    ap.add_argument("--out", type=Path, help=flag_help("out", GradeOptions))
    ap.add_argument("--log-level", default="warning", help="log level (default warning)")
    return ap


def main(argv: list[str]) -> int:
    """Run ``grade``; returns the exit code (module docstring)."""
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    try:
        opts = options_of(GradeOptions, args)
        result = asyncio.run(grade_sessions(opts))
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except StepDecodeError as e:
        print(f"error: the store cannot be read: {e}", file=sys.stderr)
        return 1
    print(render_table(summarize(result.records)))
    print(
        f"job {result.job_id}: {plural(len(result.records), 'session')} graded, written to {result.out} and {result.store} "
        f"(launcher.py view, report --job-id {result.job_id}, export --job-id {result.job_id})"
    )
    failed = any(
        r.eval_status in ("error", "timeout", "invalid_reward", "grader_broken") for r in result.records
    )
    return 2 if failed else 0
