"""The launcher's command line (``python launcher.py``, ``launcher.py`` is its entry point):
``python launcher.py --enable-evaluation --pool-size N``: run envs' cases through the gateway,
grade each session with its env's ``rule_evaluator.py`` and report. ``--regrade --job-id ID``
grades a finished job again from the store (``rollout.jobs.regrade``: no runtime, no model call).

Only the CLI: flags (Safactory-compatible) become
``rollout.jobs.options.JobOptions``; ``rollout.jobs.run.run_job`` does the work. Exit codes (docs/launcher.md):
0 when the run completed (whatever the scores: runtime timeouts, agent failures and evaluator
errors are results), 1 for a setup error (bad config, unknown case, missing evaluator, gateway
mismatch, missing model), 2 for bad flags (argparse), 3 when infrastructure left sessions unrun or
ungraded (the circuit breaker stopped the job, or sessions failed on infrastructure after every
retry; ``--resume`` runs them), 5 when a grader is broken (it failed on a case's untouched
starting workspace too), 130 on Ctrl-C and 143 on SIGTERM (sessions in flight are
cancelled and closed, left for --resume).
With ``--regrade``: 0 when every selected session was graded again, 2 when an evaluator errored or
timed out or a session could not be regraded, 1 for a setup error, 130/143 when interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from sqlalchemy.exc import DatabaseError
from tqdm import tqdm

from rollout.cli.next_steps import command_again, next_step_lines
from rollout.cli.options import FLAG_OF, default_gateway_config, start_config_values, validate_options
from rollout.core.envs import did_you_mean
from rollout.core.logs import notices, plural, setup_logging
from rollout.core.setup import SetupError
from rollout.jobs.options import JobOptions, flag_help
from rollout.jobs.regrade import (
    NotRegraded,
    Regraded,
    RegradeOptions,
    RegradeResult,
    regrade_exit_code,
    regrade_job,
    render_regrade_summary,
)
from rollout.jobs.run import JobResult, run_job
from rollout.results.progress import ProgressState, render_progress
from rollout.results.report import SessionRecord, output_path_problem, render_table, summarize
from store.session_result import GRADER_BROKEN
from store.stepcodec import StepDecodeError

"""The project folder (its ``configs/gateway.yaml`` is the default gateway config)."""
VIEWER_COMMANDS = ("view", "report")  # sub-commands of rollout.cli.viewer (imported only when used)
FEED_COMMANDS = ("feed", "export", "serve")  # sub-commands of rollout.cli.feed (imported only when used)


COMMANDS = (
    (
        "list",
        "the envs, their cases, the harnesses and the routes (--env NAME: its case ids; --jobs: the store's jobs; --json)",
    ),
    ("view", "serve the read-only trajectory viewer"),
    ("report", "write a job's HTML report (--job-id ID; default: the latest job)"),
    ("feed", "serve the feed of ready groups for a trainer"),
    ("export", "write a job's groups as jsonl, parquet or openai (--job-id ID; default: the latest job)"),
    ("serve", "long-running: run the batches a trainer posts, serve their groups"),
    ("train", "GRPO on an env with the embedded model (the train extra)"),
    ("audit", "run scripted hostile agents on each case; report the attacks that paid"),
    ("images", "the cache of unpacked container images; images prune --days N | --all"),
    (
        "grade",
        "grade sessions recorded without a job (--session ID, --tag, --since) with an env's evaluator, as a new job",
    ),
)
"""The launcher's commands (the first argument), one line each for ``--help``."""


def commands_help() -> str:
    """The ``--help`` epilog: every command, one line each, and the exit codes."""
    width = max(len(c) for c, _ in COMMANDS)
    lines = [f"  {c.ljust(width)}  {what}" for c, what in COMMANDS]
    return (
        "commands (launcher.py COMMAND --help for their flags; docs/launcher.md):\n"
        + "\n".join(lines)
        + "\n\nexit codes: 0 the run completed (whatever the scores), 1 setup error (a config or a flag's\n"
        "  value out of range), 2 an unknown flag or a value argparse refuses (missing, not a number),\n"
        "  3 infrastructure left sessions unrun or ungraded (--resume runs them), 5 a grader is broken\n"
        "  (it fails on a case's untouched starting workspace too), 130/143 interrupted"
    )


class _NotAFlag(argparse.Action):
    """``--task``: another tool's flag, refused with the launcher's own (never read as ``--tasks``)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            f"{option_string} is not a flag of the launcher: --case ID runs one case (repeatable), "
            "--tasks DIR a folder of task folders"
        )


def build_parser() -> argparse.ArgumentParser:
    """The launcher's flags (no abbreviations: a prefix such as ``--task`` is never another flag)."""
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="launcher.py",
        usage="%(prog)s [FLAGS]  |  %(prog)s COMMAND [FLAGS]",
        description="Run agent sessions through the gateway and grade them (the flags "
        "below), or run one of the commands.",
        epilog=commands_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--agent-config", action="append", type=Path, dest="agent_configs", help=flag_help("agent_configs")
    )
    ap.add_argument(
        "--agent-start-config",
        type=Path,
        help="YAML file of defaults for these flags "
        "(keys are flag names with underscores, e.g. pool_size: 8), or a Safactory start config "
        "(agent_name + container:, or agents:) for a Safactory --agent-config",
    )
    ap.add_argument("--agent-root", type=Path, help=flag_help("agent_root"))
    ap.add_argument("--env", action="append", dest="env_names", help=flag_help("env_names"))
    ap.add_argument(
        "--task", action=_NotAFlag, nargs="?", help=argparse.SUPPRESS
    )  # never a prefix of --tasks
    ap.add_argument("--case", action="append", dest="case_ids", metavar="ID", help=flag_help("case_ids"))
    ap.add_argument("--tasks", action="append", type=Path, metavar="DIR", help=flag_help("tasks"))
    ap.add_argument("--host-toolchain", action="store_true", default=None, help=flag_help("host_toolchain"))
    ap.add_argument("--same-container", action="store_true", default=None, help=flag_help("same_container"))
    ap.add_argument("--timeout", type=float, metavar="S", help=flag_help("timeout"))
    ap.add_argument("--gateway-base-url", help=flag_help("gateway_base_url"))
    ap.add_argument("--gateway-config", type=Path, help=flag_help("gateway_config"))
    ap.add_argument("--llm-model", action="append", help=flag_help("llm_model"))
    ap.add_argument("--harness", action="append", metavar="NAME|PATH", help=flag_help("harness"))
    ap.add_argument("--llm-temperature", type=float, help=flag_help("llm_temperature"))
    ap.add_argument(
        "--enable-evaluation", action="store_true", default=None, help=flag_help("enable_evaluation")
    )
    ap.add_argument("--eval-timeout", type=float, help=flag_help("eval_timeout"))
    ap.add_argument("--db-path", help=flag_help("db_path"))
    ap.add_argument("--pool-size", type=int, help=flag_help("pool_size"))
    ap.add_argument("--rl-group-size", type=int, help=flag_help("rl_group_size"))
    ap.add_argument("--max-steps", type=int, help=flag_help("max_steps"))
    ap.add_argument("--limit", type=int, help=flag_help("limit"))
    ap.add_argument("--job-id", help=flag_help("job_id"))
    ap.add_argument("--resume", action="store_true", default=None, help=flag_help("resume"))
    ap.add_argument(
        "--rerun-launcher-errors", action="store_true", default=None, help=flag_help("rerun_launcher_errors")
    )
    ap.add_argument("--max-retries", type=int, help=flag_help("max_retries"))
    ap.add_argument("--retry-backoff-s", type=float, help=flag_help("retry_backoff_s"))
    ap.add_argument(
        "--regrade",
        action="store_true",
        default=None,
        help="grade the finished sessions of --job-id again with the current rule_evaluator.py "
        "(from the store: no runtime, no model call)",
    )
    ap.add_argument("--mode", choices=["local", "ray"], help=flag_help("mode"))
    ap.add_argument("--ray-address", help=flag_help("ray_address"))
    ap.add_argument("--gateway-advertise-url", help=flag_help("gateway_advertise_url"))
    ap.add_argument("--sandbox", choices=["bwrap", "none"], help=flag_help("sandbox"))
    ap.add_argument("--grader-isolation", choices=["bwrap", "none"], help=flag_help("grader_isolation"))
    ap.add_argument("--out", type=Path, help=flag_help("out"))
    ap.add_argument("--keep-workspaces", action="store_true", default=None, help=flag_help("keep_workspaces"))
    ap.add_argument("--image", action="append", metavar="REF=LOCAL", help=flag_help("image"))
    ap.add_argument("--max-broken-graders", type=int, metavar="N", help=flag_help("max_broken_graders"))
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    ap.add_argument(
        "--report",
        type=Path,
        metavar="PATH.html",
        help="after the job, write its HTML report there, plotly.js once beside it (see also: launcher.py report)",
    )
    return ap


_CLI_ONLY = {"agent_start_config", "no_progress", "log_level", "regrade", "report"}
_RUN_ONLY = (
    "llm_model",
    "harness",
    "llm_temperature",
    "gateway_base_url",
    "gateway_config",
    "rl_group_size",
    "max_steps",
    "limit",
    "resume",
    "rerun_launcher_errors",
    "mode",
    "ray_address",
    "gateway_advertise_url",
    "sandbox",
    "keep_workspaces",
    "max_retries",
    "retry_backoff_s",
    "report",
    "case_ids",
    "timeout",
    "max_broken_graders",
    "image",
)
"""Flags that only mean something when sessions run; refused with ``--regrade``."""


def parse_args(argv: list[str] | None) -> tuple[JobOptions, argparse.Namespace]:
    """Flags > ``--agent-start-config`` YAML > defaults, validated into JobOptions.
    Raises SetupError naming the bad flag or key."""
    args = build_parser().parse_args(argv)
    return job_options(args), args


def job_options(args: argparse.Namespace) -> JobOptions:
    """The parsed flags of a run as JobOptions; SetupError naming the bad flag or key."""
    values, from_file = start_config_values(args, _CLI_ONLY)
    if values.get("resume") and not values.get("job_id"):
        raise SetupError("--resume needs --job-id")
    if values.get("rerun_launcher_errors") and not values.get("resume"):
        raise SetupError("--rerun-launcher-errors is only used with --resume")
    if values.get("gateway_config") is None:
        values["gateway_config"] = default_gateway_config()
    return validate_options(JobOptions, values, from_file, args.agent_start_config)  # type: ignore[no-any-return]


def regrade_options(args: argparse.Namespace) -> RegradeOptions:
    """The parsed flags of ``--regrade`` as RegradeOptions. Run-only flags given on the command
    line are refused; keys of the start-config YAML that a regrade does not use are ignored (the
    same file serves the run). Raises SetupError naming the bad flag."""
    given = [f"--{FLAG_OF.get(k, k).replace('_', '-')}" for k in _RUN_ONLY if getattr(args, k) is not None]
    if given:
        raise SetupError(
            f"--regrade runs no session and calls no model: {', '.join(given)} cannot be used with it"
        )
    values, from_file = start_config_values(args, _CLI_ONLY)
    if not values.get("job_id"):
        raise SetupError("--regrade needs --job-id (the job to grade again)")
    return validate_options(
        RegradeOptions,
        {k: v for k, v in values.items() if k in RegradeOptions.model_fields},  # type: ignore[no-any-return]
        from_file,
        args.agent_start_config,
    )


class Again(NamedTuple):
    """The commands a report advises, as typed again: the job's own with ``--resume`` (the
    sessions not run) and with ``--regrade`` (grade its sessions again)."""

    resume: str
    regrade: str

    @classmethod
    def of(cls, argv: list[str], job_id: str) -> Again:
        """The commands for ``job_id`` from the flags a run was given."""
        ap, job = build_parser(), ["--job-id", job_id]
        return cls(
            resume=command_again(ap, argv, ("resume", "job_id"), ["--resume", *job]),
            # not the run's --out: a regrade writes its own records, never over the run's
            regrade=command_again(ap, argv, (*_RUN_ONLY, "job_id", "regrade", "out"), ["--regrade", *job]),
        )


def report(
    result: JobResult, evaluated: bool = True, db_path: str | None = None, again: Again | None = None
) -> int:
    """Print the summary table and where things are; returns the exit code (``job_exit_code``).
    ``evaluated``: False when the job ran without ``--enable-evaluation`` (the table says so);
    ``db_path``: the store as given, named in the last lines (the commands that show the job) for
    PostgreSQL; a SQLite store is named by its absolute path there, the same from any folder;
    ``again``: the resume and regrade commands advised (default: the job's flags alone)."""
    totals = result.totals
    again = again or Again.of([], result.job_id)
    print(render_table(totals.summary()))
    if footer := totals.footer():
        print(footer)
    if not evaluated:
        print(f"not graded: the job ran without --enable-evaluation (regrade it with {again.regrade})")
    print(
        f"{plural(totals.sessions, 'session')} written to {result.out}; steps and rewards in {result.store}"
    )
    infra_attempts = totals.infra_attempts
    if infra_attempts:
        lost = totals.lost
        print(
            f"{plural(infra_attempts, 'attempt')} ended in an infrastructure failure; {plural(lost, 'session')} never recovered "
            "(not graded, reward NULL)"
        )
    opened = sum(1 for e in result.breaker_events if e.state == "open")
    if opened:
        print(f"circuit breaker opened {opened} time(s)")
    if result.workspaces:
        print(f"workspaces kept in {result.workspaces}")
    if broken := totals.grader_broken:
        named = ", ".join(f"{env} {n}" for env, n in broken.items())
        then = (  # a regrade takes a finished job only: the rest runs first
            f"{again.resume} (runs the rest), then {again.regrade} (grades these)"
            if result.stopped
            else again.regrade
        )
        print(
            f"error: {plural(sum(broken.values()), 'session')} met a broken grader ({named}): it failed on the case's untouched "
            "starting workspace too, so they are not counted; fix it (the reason is in each session's "
            "eval_reason: an exception, a timeout; a missing or unreadable answer must score 0), "
            f"then: {then} (docs/trust-model.md)",
            file=sys.stderr,
        )
    if result.stopped and result.stop_kind == "broken_graders":
        print(f"error: job stopped: {result.stopped}", file=sys.stderr)  # the advice is the line above
    elif result.stopped:
        print(
            f"error: job stopped: {result.stopped}; rerun with {again.resume} to finish it", file=sys.stderr
        )
    elif totals.lost:
        bugs = (
            f" ({totals.launcher_errors} of them launcher_error, run again only with --rerun-launcher-errors)"
            if totals.launcher_errors
            else ""
        )
        print(
            f"error: {plural(totals.lost, 'session')} lost to infrastructure failures after every retry; rerun with "
            f"{again.resume} to run them again{bugs}",
            file=sys.stderr,
        )
    shown = result.store if result.store.startswith("sqlite://") else (db_path or result.store)  # absolute
    for line in next_step_lines(result.job_id, shown):
        print(line)
    return job_exit_code(result)


EXIT_INFRA = 3
"""The job's exit code when infrastructure left work undone: the circuit breaker stopped the job,
or sessions failed on infrastructure after every retry (``--resume`` runs them again)."""
EXIT_GRADER_BROKEN = 5
"""The job's exit code when a grader is broken: a session's grader failed on the case's untouched
starting workspace too (``grader_broken``: not counted), whether or not that stopped the job."""


def job_exit_code(result: JobResult) -> int:
    """0 when the run completed, whatever the scores: runtime timeouts, agent failures and
    evaluator errors are results (counted in the table); ``EXIT_GRADER_BROKEN`` when a grader was
    found broken (before the infrastructure code: it needs the author, not a rerun);
    ``EXIT_INFRA`` when the breaker stopped the job or a session's last attempt was an
    infrastructure failure."""
    if result.stop_kind == "broken_graders" or result.totals.grader_broken:
        return EXIT_GRADER_BROKEN
    return EXIT_INFRA if result.stopped or result.totals.lost else 0


def plain_line_due(done: int, total: int) -> bool:
    """Whether a progress line is printed off a terminal after ``done`` of ``total``: at each
    tenth, and at the end."""
    return done % max(1, total // 10) == 0 or done == total


class Progress:
    """The job's progress on ``stream`` (stderr). On a terminal: ``render_progress``'s one or two
    lines, redrawn in place as each session finishes and every ``tick_s`` seconds by a thread (so
    the clock runs between completions), never wider than the terminal (read at each frame); the
    first frame is drawn on a line of its own, and a log line or notice written meanwhile clears
    the frame first (the next frame is drawn below it). Elsewhere: one plain line at each tenth of
    the job and at its end. ``clock`` and ``width`` are injectable (tests draw frames with ``tick``)."""

    def __init__(
        self,
        enabled: bool,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        width: Callable[[], int] = lambda: shutil.get_terminal_size((100, 24)).columns,
        tick_s: float | None = 1.0,
    ) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock, self.width, self.tick_s = clock, width, tick_s
        self.state = ProgressState(totals={})
        self.t0 = clock()
        self.drawn = 0  # lines of the frame on screen (the cursor is on its last one)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._watched: list[logging.Handler] = []

    def plan(self, totals: dict[str, int]) -> None:
        self.state = ProgressState(totals=totals)

    def start(self, job_id: str, n: int) -> None:
        self.t0 = self.clock()
        if self.enabled and self.tty:
            self._watched = [*logging.getLogger().handlers, *notices.handlers]
            for handler in self._watched:
                handler.addFilter(self._before_log)
            self.tick()
            if self.tick_s:
                self._ticker = threading.Thread(target=self._tick_loop, name="progress", daemon=True)
                self._ticker.start()

    def _tick_loop(self) -> None:
        assert self.tick_s is not None
        while not self._stop.wait(self.tick_s):
            self.tick()

    def tick(self) -> None:
        """Draw the current frame over the previous one."""
        with self._lock:
            if self._stop.is_set():  # closed: the last frame stays as it is
                return
            lines = render_progress(self.state, self.clock() - self.t0, self.width())
            up = f"\x1b[{self.drawn - 1}F" if self.drawn > 1 else ""
            self.stream.write(("\r" + up + "\x1b[J" if self.drawn else "") + "\n".join(lines))
            self.stream.flush()
            self.drawn = len(lines)

    def _before_log(self, record: logging.LogRecord) -> bool:
        """A handler's filter: clear the frame so the record's line starts at a clean line."""
        with self._lock:
            if self.drawn:
                self.stream.write("\r" + (f"\x1b[{self.drawn - 1}F" if self.drawn > 1 else "") + "\x1b[J")
                self.stream.flush()
                self.drawn = 0
        return True

    def done(self, rec: SessionRecord) -> None:
        with self._lock:
            self.state.update(rec)
        if not self.enabled:
            return
        if self.tty:
            self.tick()
        elif plain_line_due(self.state.n_done, self.state.n_total):
            text = self.state.describe(self.clock() - self.t0)
            print(f"progress {self.state.n_done}/{self.state.n_total}: {text}", file=self.stream, flush=True)

    def close(self) -> None:
        """Stop the clock; the last frame stays, the cursor below it."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        for handler in self._watched:
            handler.removeFilter(self._before_log)
        with self._lock:
            if self.drawn:
                self.stream.write("\n")
                self.stream.flush()
                self.drawn = 0


async def _run(opts: JobOptions, progress: bool, job: dict[str, str]) -> JobResult:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    display = Progress(progress)

    def started(job_id: str, n: int) -> None:
        job["id"] = job_id
        display.start(job_id, n)

    try:
        return await run_job(opts, on_start=started, on_done=display.done, on_plan=display.plan)
    finally:
        display.close()


async def _regrade(opts: RegradeOptions, progress: bool) -> RegradeResult:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    bar: tqdm[Any] | None = None
    counted = [0, 0]  # done, total: plain lines where stderr is no terminal (as a job's progress)

    def started(n: int) -> None:
        nonlocal bar
        counted[1] = n
        if progress and sys.stderr.isatty():
            bar = tqdm(total=n, unit="session", desc=f"regrade {opts.job_id}", file=sys.stderr)

    def done(item: Regraded | NotRegraded) -> None:
        counted[0] += 1
        if bar is not None:
            bar.update(1)
        elif progress and plain_line_due(*counted):
            print(f"regrade {opts.job_id}: {counted[0]}/{counted[1]} sessions", file=sys.stderr, flush=True)

    try:
        return await regrade_job(opts, on_start=started, on_done=done)
    finally:
        if bar is not None:
            bar.close()


def regrade_main(args: argparse.Namespace) -> int:
    """``--regrade``: grade a finished job again, print the table and what was not regraded;
    returns the exit code (module docstring)."""
    try:
        opts = regrade_options(args)
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    setup_logging(args.log_level)
    try:
        result = asyncio.run(_regrade(opts, not args.no_progress))
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except StepDecodeError as e:  # a damaged row of the store
        print(f"error: the store cannot be read: {e}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError) as e:
        print(
            "interrupted: sessions regraded so far have their new evaluation, the others their previous one; "
            "rerun the same command to regrade them all",
            file=sys.stderr,
        )
        return 130 if isinstance(e, KeyboardInterrupt) else 143
    print(render_table(summarize(result.records)))
    print(render_regrade_summary(result))
    print(
        f"{plural(len(result.records), 'session')} written to {result.out}; new evaluations in {result.store} "
        "(previous ones kept in job_environments.eval_history)"
    )
    broken = Counter(r.env_name for r in result.regraded if r.after_status == GRADER_BROKEN)
    if broken:
        named = ", ".join(f"{env} {n}" for env, n in sorted(broken.items()))
        print(
            f"error: the grader is still broken ({named}): it failed on the case's untouched starting "
            "workspace too (the reason is in each session's eval_reason; docs/trust-model.md)",
            file=sys.stderr,
        )
    return regrade_exit_code(result)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code. ``list`` as the first argument lists what a job can
    run (``rollout.cli.listing``); ``view`` and ``report`` run
    the trajectory viewer and the HTML report (``rollout.cli.viewer``); ``feed``, ``export`` and
    ``serve`` the feed of ready groups, the export of a job and the long-running mode
    (``rollout.cli.feed``); ``train`` GRPO on an env (``rollout.cli.train``); ``audit`` the battery
    of scripted attacks (``rollout.cli.audit``); ``images`` the image cache (``rollout.cli.images``)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in VIEWER_COMMANDS:
        from rollout.cli.viewer import main as viewer_main

        return viewer_main(argv)
    if argv and argv[0] in FEED_COMMANDS:
        from rollout.cli.feed import main as feed_main

        return feed_main(argv)
    if argv and argv[0] == "train":
        from rollout.cli.train import main as train_main

        return train_main(argv[1:])
    if argv and argv[0] == "audit":
        from rollout.cli.audit import main as audit_main

        return audit_main(argv[1:])
    if argv and argv[0] == "grade":
        from rollout.cli.grade import main as grade_main

        return grade_main(argv[1:])
    if argv and argv[0] == "images":
        from rollout.cli.images import main as images_main

        return images_main(argv[1:])
    if argv and argv[0] == "list":
        from rollout.cli.listing import main as list_main

        return list_main(argv[1:])
    if argv and not argv[0].startswith("-"):  # a job takes flags only: this was meant as a command
        names = [c for c, _ in COMMANDS]
        print(
            f"launcher.py: error: no command {argv[0]!r}{did_you_mean(argv[0], names)}; the commands: "
            f"{', '.join(names)}; a job takes flags only (launcher.py --help)",
            file=sys.stderr,
        )
        return 2
    args = build_parser().parse_args(argv)
    if args.regrade:
        return regrade_main(args)
    try:
        opts = job_options(args)
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for flag, path, example in (("--out", opts.out, "out.jsonl"), ("--report", args.report, "report.html")):
        if path is not None and (problem := output_path_problem(path, example)) is not None:
            print(f"error: {flag}: {problem}", file=sys.stderr)  # before the job, not after it
            return 1
    setup_logging(args.log_level)
    job: dict[str, str] = {}
    try:
        result = asyncio.run(_run(opts, not args.no_progress, job))
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except DatabaseError as e:  # a damaged database file: named, no traceback
        print(f"error: the store cannot be used: {e.orig or e}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError) as e:
        hint = Again.of(argv, job["id"]).resume if "id" in job else "the same command"
        print(
            f"interrupted: sessions in flight were cancelled and closed; rerun with {hint} to finish the job",
            file=sys.stderr,
        )
        return 130 if isinstance(e, KeyboardInterrupt) else 143
    code = report(result, opts.enable_evaluation, opts.db_path, Again.of(argv, result.job_id))
    if args.report is not None:
        from rollout.servers.viewer.db import ViewerError
        from rollout.servers.viewer.report import write_report

        try:
            path = asyncio.run(write_report(opts.db_path, result.job_id, args.report))
        except (ViewerError, OSError) as e:
            print(f"error: the report could not be written: {e}", file=sys.stderr)
            return code or 1
        print(f"report written to {path}")
    return code
