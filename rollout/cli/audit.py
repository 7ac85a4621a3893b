"""``launcher.py audit``: run the battery of scripted attacks on a benchmark's cases and say which
ones earned more than doing nothing (docs/audit.md). Exit codes: 0 clean, 4 when the audit failed
(an attack paid, a grader failed on agent input, a baseline passed or a reference failed),
2 when none paid but a case could not be judged, 1 for a setup error, 130 on Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from pathlib import Path

from pydantic import ValidationError
from sqlalchemy.exc import DatabaseError

from rollout.audit.audit import AuditOptions, AuditReport, exit_code, run_audit
from rollout.audit.battery import ATTACK_ROOT, BASELINE, attack_folders, load_attack
from rollout.audit.battery import info as attack_info
from rollout.audit.report import (
    SANITY_HEADERS,
    html_section,
    render_table,
    sanity_cells,
    table_rows,
    verdict_line,
)
from rollout.cli.listing import add_env_flags
from rollout.cli.options import options_of
from rollout.contract.harness import HarnessUnavailable
from rollout.core.argtypes import finite_float, int_at_least
from rollout.core.logs import setup_logging
from rollout.core.setup import SetupError
from rollout.jobs.options import flag_help


def build_parser() -> argparse.ArgumentParser:
    """The audit's flags."""
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="launcher.py audit",
        description="Run scripted hostile agents on each case and report every attack "
        "whose reward beats a do-nothing agent's.",
        epilog="exit codes: 0 clean; 4 the audit failed (an attack paid, a grader failed on agent "
        "input, the do-nothing baseline passed, or the reference solution did not score 10); 2 nothing "
        "found but a case could not be judged; 1 setup error",
    )
    ap.add_argument("--env", action="append", dest="env_names", default=[], help="only this env (repeatable)")
    ap.add_argument(
        "--case", action="append", dest="case_ids", default=[], help="only this case id (repeatable)"
    )
    ap.add_argument(
        "--attack",
        action="append",
        dest="attacks",
        default=[],
        metavar="NAME|PATH",
        help=f"only this attack: a bundled name ({ATTACK_ROOT.name}/<name>/) or a folder (repeatable; "
        "default: the whole battery)",
    )
    add_env_flags(ap)
    ap.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="REF=LOCAL",
        help="run image REF as LOCAL, an image of the local container store, as the job's --image "
        "(repeatable; docs/images.md)",
    )
    ap.add_argument("--pool-size", type=int_at_least(1), help=flag_help("pool_size", AuditOptions))
    ap.add_argument(
        "--eval-timeout", type=finite_float(positive=True), help=flag_help("eval_timeout", AuditOptions)
    )
    ap.add_argument("--db-path", help="keep the sessions in this store (default: a temporary SQLite file)")
    ap.add_argument("--out", type=Path, help="keep the sessions' JSONL there (default: temporary)")
    ap.add_argument("--job-id", help="job id (default: generated)")
    ap.add_argument(
        "--json", action="store_true", help="print the report as JSON on stdout instead of the table"
    )
    ap.add_argument(
        "--report",
        type=Path,
        metavar="PATH.html",
        help="write the job's HTML report with the audit's section there",
    )
    ap.add_argument("--list", action="store_true", help="list the battery and exit")
    ap.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    return ap


def list_battery() -> int:
    """Print the bundled attacks: name, what it does, where it comes from."""
    rows = []
    for folder in attack_folders():
        a = attack_info(load_attack(str(folder)))
        rows.append([a.name + (" (baseline)" if a.name == BASELINE else ""), a.summary, a.source])
    print(render_table(rows, ["attack", "what it does", "source"]))
    return 0


def print_report(report: AuditReport, kept: bool) -> None:
    """The table, then the verdict and where the sessions are (``kept``: in a store of the user's)."""
    if report.sanity:
        print(render_table([sanity_cells(r) for r in report.sanity], SANITY_HEADERS))
        print()
    print(render_table(table_rows(report)))
    print()
    print(verdict_line(report))
    where = f"store {report.store}" if kept else "sessions not kept: --db-path keeps them"
    print(
        f"job {report.job_id}: {len(report.findings)} attack run(s) judged on {len(report.cases)} case(s) in "
        f"{report.duration_s:.0f} s ({where})"
    )


def main(argv: list[str]) -> int:
    """Entry point: ``argv`` without the leading ``audit``; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.list:
        return list_battery()
    setup_logging(args.log_level)
    logging.getLogger("rollout.jobs.workspace_archive").setLevel(
        logging.ERROR
    )  # what a regrade keeps: moot here
    keep = (
        tempfile.TemporaryDirectory(prefix="rollout-audit-report-")
        if args.report and not args.db_path
        else None
    )
    db_path = args.db_path or (f"sqlite://{Path(keep.name) / 'audit.db'}" if keep else None)
    try:
        opts = options_of(AuditOptions, args, db_path=db_path)
        report = asyncio.run(run_audit(opts))
        if args.report is not None:
            from rollout.servers.viewer.db import ViewerError
            from rollout.servers.viewer.report import write_report

            try:
                asyncio.run(
                    write_report(
                        opts.db_path or "", report.job_id, args.report, sections=[html_section(report)]
                    )
                )
            except ViewerError as e:
                print(f"error: the report could not be written: {e}", file=sys.stderr)
                return 1
    except (SetupError, HarnessUnavailable, ValidationError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except DatabaseError as e:  # a damaged database file given with --db-path
        print(f"error: the store cannot be used: {e.orig or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the audit was stopped", file=sys.stderr)
        return 130
    finally:
        if keep is not None:
            keep.cleanup()
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        print_report(report, kept=args.db_path is not None)
        if args.report is not None:
            print(f"report written to {args.report}")
    return exit_code(report)
