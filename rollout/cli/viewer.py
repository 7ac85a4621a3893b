"""``python launcher.py view`` (serve the viewer) and ``python launcher.py report`` (write a job's
HTML report). Exit codes: 0 done, 1 the store or the job cannot be read, 2 bad flags."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from rollout.cli.next_steps import latest_job_line, launcher_command, viewer_serves
from rollout.cli.verbs import add_edge_flags, edge_of, parse_verb, run_command
from rollout.core.argtypes import port_number
from rollout.core.logs import setup_logging
from rollout.servers.listener import DEFAULT_EDGE, HttpEdge, listen, run_server, url_of
from rollout.servers.viewer.app import create_app, refuse_host
from rollout.servers.viewer.bundle import write_bundle
from rollout.servers.viewer.db import ViewerError, open_queries
from rollout.servers.viewer.report import DEFAULT_VIEWER_URL, write_report
from rollout.servers.viewer.stats import HiddenFields
from store.engine import shown_url
from store.search import StepSearch

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765
COMMANDS = ("view", "report")


def build_parser() -> argparse.ArgumentParser:
    """The ``view`` and ``report`` sub-commands."""
    ap = argparse.ArgumentParser(
        allow_abbrev=False, prog="launcher.py", description="Look at the trajectories of the store."
    )
    sub = ap.add_subparsers(dest="command", required=True)
    view = sub.add_parser(
        "view", allow_abbrev=False, help="serve the trajectory viewer (read-only) on loopback"
    )
    view.add_argument(
        "--db-path", default="sqlite://env_trajs.db", help="trajectory store (default sqlite://env_trajs.db)"
    )
    view.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT}; 0: any free port)",
    )
    view.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)"
    )
    view.add_argument(
        "--agent-root",
        type=Path,
        default=Path("env"),
        help="folder of env configs, to know each env's hidden fields (default env)",
    )
    view.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    add_edge_flags(view)
    rep = sub.add_parser(
        "report", allow_abbrev=False, help="write a job's HTML report (plotly.js once beside it, or inlined)"
    )
    rep.add_argument("--job-id", help="the job (default: the latest job of the store)")
    rep.add_argument(
        "--db-path", default="sqlite://env_trajs.db", help="trajectory store (default sqlite://env_trajs.db)"
    )
    rep.add_argument("--out", type=Path, help="HTML file (default runs/report-<job id>.html)")
    rep.add_argument(
        "--viewer-url",
        help=f"where the report's session links point (default: a viewer running at "
        f"{DEFAULT_VIEWER_URL} that serves this job, else that address, with a warning)",
    )
    rep.add_argument(
        "--self-contained",
        action="store_true",
        help="inline plotly.js (one ~5 MB file, e.g. to send) instead of a file beside the report",
    )
    rep.add_argument(
        "--bundle",
        type=Path,
        metavar="DIR",
        help="write one folder instead: index.html (the report, every session listed) and a page and "
        "a JSON per session transcript, relative links only, opens from disk without a server",
    )
    rep.add_argument(
        "--agent-root",
        type=Path,
        default=Path("env"),
        help="with --bundle: folder of env configs, to leave each env's hidden fields out of the "
        "start requests shown (default env)",
    )
    return ap


async def serve(db_path: str, host: str, port: int, agent_root: Path, edge: HttpEdge = DEFAULT_EDGE) -> None:
    """Open the store, print the address (the first line), create the viewer's indexes, and serve until
    cancelled (Ctrl-C)."""
    engine, queries = await open_queries(db_path)
    try:
        sock = listen(host, port, exposes="every trajectory")
        print(
            f"viewer on {url_of(sock)} (store {shown_url(db_path)}); Ctrl-C stops it", flush=True
        )  # the first line
        try:
            made = await queries.ensure_indexes()
        except Exception as e:  # a read-only file or role: the viewer still works, only slower on big jobs
            why = getattr(e, "orig", None) or e  # the driver's error, without SQLAlchemy's statement and link
            print(
                f"warning: cannot create the viewer's indexes ({type(why).__name__}: {why}); "
                "large jobs will page slowly",
                file=sys.stderr,
            )
        else:
            if made:
                log.info("viewer: created indexes %s", ", ".join(made))
        index = StepSearch(engine)
        problem = None
        try:
            await index.ensure()
        except Exception as e:  # a read-only file or role: every page but the search works
            where = index.index_file or "in the store"
            why = getattr(e, "orig", None) or e
            problem = f"cannot create the search index {where} ({type(why).__name__}: {why})"
            print(f"warning: {problem}", file=sys.stderr)
            await index.close()
        search = index if problem is None else None
        indexing = asyncio.create_task(_index_all(search)) if search is not None else None
        try:
            await run_server(
                create_app(queries, HiddenFields(agent_root), search=search, search_problem=problem),
                sock,
                host,
                edge,
                refuse_host,
            )
        finally:
            if indexing is not None:
                indexing.cancel()
            if search is not None:
                await search.close()
    finally:
        await engine.dispose()


async def _index_all(search: StepSearch | None) -> None:
    """Index every session's steps once at start, in the background (searches index the rest)."""
    if search is None:
        return
    try:
        await search.refresh()
    except Exception:
        log.exception("viewer: building the search index failed; searches retry it")


def main(argv: list[str]) -> int:
    """Run ``view`` or ``report``; returns the exit code."""
    args = parse_verb(build_parser(), argv)
    if args.command == "view":
        setup_logging(args.log_level)
        return run_command(
            lambda: serve(args.db_path, args.host, args.port, args.agent_root, edge_of(args)),
            args.host,
            args.port,
            (ViewerError,),
        )
    if args.job_id is None:
        try:
            args.job_id = asyncio.run(latest_job(args.db_path))
        except ViewerError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    if args.bundle is not None:
        if args.out is not None or args.self_contained or args.viewer_url is not None:
            print(
                "error: --bundle writes a folder of its own: --out, --self-contained and --viewer-url do not apply",
                file=sys.stderr,
            )
            return 2
        return _write(
            "bundle",
            args.bundle,
            lambda: write_bundle(args.db_path, args.job_id, args.bundle, HiddenFields(args.agent_root)),
            lambda index: f"bundle written to {args.bundle} (open {index})",
        )
    out = args.out or Path("runs") / f"report-{args.job_id}.html"
    viewer_url = args.viewer_url or DEFAULT_VIEWER_URL
    code = _write(
        "report",
        out,
        lambda: write_report(
            args.db_path, args.job_id, out, viewer_url=viewer_url, self_contained=args.self_contained
        ),
        lambda path: f"report written to {path}; session links to {viewer_url}",
    )
    if code == 0 and args.viewer_url is None and not viewer_serves(DEFAULT_VIEWER_URL, args.job_id):
        print(
            f"warning: no viewer of job {args.job_id} runs at {DEFAULT_VIEWER_URL}: the report's session links "
            f"point there; start one ({launcher_command()} view --db-path {shown_url(args.db_path)}) or pass --viewer-url",
            file=sys.stderr,
        )
    return code


async def latest_job(db_path: str) -> str:
    """The latest job of the store (one line on stderr says which); ViewerError when it has none."""
    engine, queries = await open_queries(db_path)
    try:
        jobs = await queries.jobs()
    finally:
        await engine.dispose()
    if not jobs:
        raise ViewerError(f"no job in {shown_url(db_path)} (run a job first, or pass --db-path)")
    print(latest_job_line(jobs[0]["job_id"], len(jobs), shown_url(db_path)), file=sys.stderr)
    return str(jobs[0]["job_id"])


def _write(
    what: str, dest: Path, make: Callable[[], Coroutine[Any, Any, Path]], said: Callable[[Path], str]
) -> int:
    """Run ``make`` (it writes ``what`` to ``dest``) and print ``said(path)``; 1 with the error on a
    store that cannot be read or a destination that cannot be written."""
    try:
        path = asyncio.run(make())
    except ViewerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: cannot write the {what} to {dest}: {e}", file=sys.stderr)
        return 1
    print(said(path))
    return 0
