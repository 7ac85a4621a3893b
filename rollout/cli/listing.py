"""``launcher.py list``: what a job could run, without running anything: the envs (their dataset
format, case count, samples per case, step budget, session timeout and grader), with ``--env NAME`` that env's case ids, the bundled harnesses and
the gateway config's routes; ``--json`` for tools. Exit 0, or 1 when the gateway config or an env
asked for (``--env``, ``--agent-config``, ``--tasks``) or its cases cannot be read."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gateway.settings import GatewaySettings
from rollout.cli.next_steps import launcher_command
from rollout.contract.harness import HarnessUnavailable
from rollout.core.envs import (
    HOST_TOOLCHAIN_ALONE,
    SAME_CONTAINER_ALONE,
    EnvConfig,
    EnvConfigError,
    load_cases,
    no_such_env,
    scan_envs,
    session_config,
    task_folder_env,
)
from rollout.core.safactory import load_agent_configs
from rollout.core.setup import SetupError, load_gateway_settings
from rollout.grading.evaluator_loader import env_evaluator
from rollout.jobs.lease import STALE_AFTER_S, holder_gone
from rollout.results.session_fields import utc_text
from rollout.sandbox.harness_cache import bundled, load_harness
from store.engine import shown_url


def add_env_flags(ap: argparse.ArgumentParser) -> None:
    """The flags that choose the envs, as the job's: ``--agent-root``, ``--agent-config``,
    ``--agent-start-config``, ``--tasks`` (``list`` and ``audit``)."""
    ap.add_argument("--agent-root", type=Path, default=Path("env"), help="folder of envs (default: env)")
    ap.add_argument(
        "--agent-config",
        action="append",
        type=Path,
        dest="agent_configs",
        default=[],
        help="an env.yaml, or a Safactory task config (environments:), instead of the agent root's "
        "envs (repeatable)",
    )
    ap.add_argument(
        "--agent-start-config",
        type=Path,
        help="the Safactory start config (agent_name + container:, or agents:) of a Safactory --agent-config",
    )
    ap.add_argument(
        "--tasks",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="a folder of task folders run as one env, as the job's --tasks (repeatable)",
    )
    ap.add_argument(
        "--host-toolchain",
        action="store_true",
        help="the --tasks folders' Harbor tasks run on the host's tools, not in their images",
    )
    ap.add_argument(
        "--same-container",
        action="store_true",
        help="the --tasks folders' Harbor tasks verified on the agent's own layer of the image, as the job's",
    )


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``list``."""
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="launcher.py list",
        description="List the envs (cases, grader), harnesses and routes a job can use.",
    )
    ap.add_argument(
        "--env",
        action="append",
        dest="env_names",
        default=[],
        metavar="NAME",
        help="only this env, with its case ids (repeatable)",
    )
    add_env_flags(ap)
    ap.add_argument("--gateway-config", type=Path, help="gateway YAML (default: configs/gateway.yaml)")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ap.add_argument(
        "--jobs",
        action="store_true",
        help="list the jobs of the store instead (id, created, sessions, finished, envs, mean score), newest first",
    )
    ap.add_argument(
        "--db-path",
        default="sqlite://env_trajs.db",
        help="with --jobs: the trajectory store (default sqlite://env_trajs.db)",
    )
    return ap


async def job_entries(db_path: str) -> list[dict[str, Any]]:
    """The jobs of the store at ``db_path``, newest first: id, created (UTC ISO), sessions, envs,
    mean score (0..10, None when nothing was graded). Raises ViewerError when it cannot be read."""
    from rollout.servers.viewer.db import open_queries

    engine, queries = await open_queries(db_path)
    try:
        rows = await queries.jobs()
        held = await queries.held_jobs(datetime.now(UTC) - timedelta(seconds=STALE_AFTER_S))
    finally:
        await engine.dispose()
    return [
        {
            "job_id": r["job_id"],
            "created": utc_text(r["created_at"]),
            "sessions": int(r["sessions"]),
            "finished": int(r["finished"] or 0),
            "running": r["job_id"] in held and not holder_gone(*held[r["job_id"]]),  # a launcher holds it now
            "graded": bool(r["graded"]),
            "envs": r["envs"],
            "mean_score": None if r["mean_score"] is None else float(r["mean_score"]),
        }
        for r in rows
    ]


def render_jobs(jobs: list[dict[str, Any]], db_path: str) -> str:
    """The jobs as a table, newest first (a job with sessions not finished marked, and how to
    finish it said under the table), or a line saying there are none."""
    db_path = shown_url(db_path)
    if not jobs:
        return f"no job in {db_path}"
    lines = _table(
        [
            [
                j["job_id"],
                (j["created"] or "-")[:19].replace("T", " "),
                str(j["sessions"]),
                f"{j['finished']}"
                + (
                    ""
                    if j["finished"] == j["sessions"]
                    else " (running)"
                    if j["running"]
                    else " (unfinished)"
                ),
                ",".join(j["envs"]),
                "-" if j["mean_score"] is None else f"{j['mean_score']:.2f}",
            ]
            for j in jobs
        ],
        ["job", "created (UTC)", "sessions", "finished", "envs", "mean"],
    )
    if left := [j for j in jobs if j["finished"] != j["sessions"] and not j["running"]]:
        more = f" (and {len(left) - 1} more unfinished)" if len(left) > 1 else ""
        graded = " --enable-evaluation" if left[0]["graded"] else ""
        lines.append(
            f"unfinished: the job's own command with --resume --job-id {left[0]['job_id']} runs the rest{more}, "
            f"e.g. {launcher_command()} --resume --job-id {left[0]['job_id']}{graded} --db-path {db_path} with "
            "the run's --agent-root or --tasks, --gateway-config, --llm-model and --image when it had them "
            "(docs/outcomes.md, Resume)"
        )
    return "\n".join(lines)


def list_jobs(args: argparse.Namespace) -> int:
    """``list --jobs``: print the jobs of ``--db-path``; 1 when the store cannot be read."""
    from rollout.servers.viewer.db import ViewerError

    try:
        jobs = asyncio.run(job_entries(args.db_path))
    except ViewerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(jobs, indent=2) if args.json else render_jobs(jobs, args.db_path), flush=True)
    return 0


def grader_of(agent_root: Path, cfg: EnvConfig) -> str:
    """How ``cfg``'s sessions are graded: ``none`` (``evaluation: none``), ``tests`` (Harbor
    tasks, and their env's evaluator when it has one), the evaluator's path, or ``missing``."""
    if cfg.evaluation == "none":
        return "none"
    path = env_evaluator(agent_root, cfg)
    if cfg.dataset.format == "harbor":
        return "tests" if path is None else f"tests + {path}"
    return str(path) if path is not None else "missing"


def env_entries(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One entry per env (name, format, cases or the error loading them, ``group_size``,
    ``max_steps``, ``timeout_s``, ``task_timeout_s`` [low, high] of Harbor tasks with their own,
    grader; ``case_ids`` with ``--env``). Raises SetupError for an env named by ``--env`` that is not there."""
    broken: list[str] = []
    if args.host_toolchain and not args.tasks:
        raise SetupError(HOST_TOOLCHAIN_ALONE)
    if args.same_container and not args.tasks:
        raise SetupError(SAME_CONTAINER_ALONE)
    try:
        if args.agent_configs or args.agent_start_config is not None or args.tasks:
            configs = [
                *load_agent_configs(args.agent_configs, args.agent_start_config),
                *(task_folder_env(p, args.host_toolchain, args.same_container) for p in args.tasks),
            ]
        else:
            found, errors = scan_envs(args.agent_root)
            configs, broken = found, [str(e) for e in errors]
    except EnvConfigError as e:
        raise SetupError(str(e)) from e
    if args.env_names:
        missing = sorted(set(args.env_names) - {c.name for c in configs})
        if missing:
            raise SetupError(no_such_env(missing, (c.name for c in configs)))
        configs = [c for c in configs if c.name in args.env_names]
    out: list[dict[str, Any]] = []
    for cfg in configs:
        entry: dict[str, Any] = {
            "name": cfg.name,
            "format": cfg.dataset.format,
            "path": str(cfg.config_path),
            "group_size": cfg.group_size,
            "max_steps": cfg.max_steps,
            "timeout_s": cfg.runtime.timeout_s,
            "grader": grader_of(args.agent_root, cfg),
        }
        try:
            cases = load_cases(cfg)
            entry["cases"] = len(cases)
            if cfg.dataset.format == "harbor" and any("agent_timeout_s" in c.row for c in cases):
                own = sorted(session_config(cfg, c).runtime.timeout_s for c in cases)
                entry["task_timeout_s"] = [own[0], own[-1]]
            if args.env_names:
                entry["case_ids"] = [c.case_id for c in cases]
        except EnvConfigError as e:
            entry["cases"], entry["error"] = None, str(e)
        out.append(entry)
    out += [{"name": None, "error": why} for why in broken if not args.env_names]
    return out


def harness_entries() -> list[dict[str, Any]]:
    """The bundled harnesses: name, protocol (``none`` for one that calls no model) and version (or
    why one does not load)."""
    out: list[dict[str, Any]] = []
    for name in bundled():
        try:
            h = load_harness(name).harness
            out.append(
                {"name": name, "protocol": h.protocol if h.calls_model else "none", "version": h.version}
            )
        except HarnessUnavailable as e:
            out.append({"name": name, "error": str(e)})
    return out


def route_entries(gw: GatewaySettings) -> list[dict[str, Any]]:
    """The routes: key, API, upstream (host and port only: a URL may carry a key), default."""
    default = gw.route_for_default()
    out: list[dict[str, Any]] = []
    for key, route in gw.llm_routes.items():
        if route.managed is not None:
            upstream = "managed model server"
        else:
            parts = urlsplit(route.base_url)
            upstream = f"{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}" or route.base_url
        out.append(
            {
                "route": key,
                "api": route.api,
                "upstream": upstream,
                "upstream_model": route.upstream_model,
                "default": key == default,
            }
        )
    return out


def _table(rows: list[list[str]], headers: list[str]) -> list[str]:
    """Aligned columns, a header and a rule; ``(none)`` when there is no row."""
    if not rows:
        return ["  (none)"]
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    rule = ["-" * w for w in widths]
    return [
        "  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [headers, rule, *rows]
    ]


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _timeout(env: dict[str, Any]) -> str:
    """An env's session timeout as text; Harbor tasks with their own: ``per task LOW-HIGH s``."""
    own = env.get("task_timeout_s")
    if own:
        return f"per task {_seconds(own[0])}" if own[0] == own[1] else f"per task {own[0]:g}-{own[1]:g} s"
    return _seconds(env["timeout_s"])


def render(listing: dict[str, Any]) -> str:
    """The listing as text: a table per section, an env's case ids under it."""
    envs = [e for e in listing["envs"] if e.get("name")]
    lines = [f"envs ({listing['source']}):"]
    lines += _table(
        [
            [
                e["name"],
                e["format"],
                "?" if e.get("cases") is None else str(e["cases"]),
                str(e["group_size"]),
                "none" if e["max_steps"] < 0 else str(e["max_steps"]),
                _timeout(e),
                e["grader"],
            ]
            for e in envs
        ],
        ["env", "format", "cases", "samples", "max steps", "timeout", "graded by"],
    )
    lines.append(
        "  (samples per case, step budget and session timeout: the env's; a job's --rl-group-size, "
        "--max-steps and --timeout replace them)"
    )
    for e in listing["envs"]:
        if e.get("error"):
            lines.append(f"  error: {e['error']}")
        if "case_ids" in e:
            lines.append(f"{e['name']} cases: {' '.join(e['case_ids'])}")
    lines += ["", "harnesses (--harness NAME):"]
    lines += _table(
        [
            [h["name"], h.get("protocol", "-"), h.get("version", h.get("error", ""))]
            for h in listing["harnesses"]
        ],
        ["harness", "protocol", "version"],
    )
    lines += ["", f"routes (--llm-model ROUTE; {listing['gateway_config']}):"]
    lines += _table(
        [
            [
                r["route"] + (" (default)" if r["default"] else ""),
                r["api"],
                r["upstream"],
                r["upstream_model"] or "-",
            ]
            for r in listing["routes"]
        ],
        ["route", "api", "upstream", "upstream model"],
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Entry point: ``argv`` without the leading ``list``; returns the exit code."""
    from rollout.cli.run import default_gateway_config

    args = build_parser().parse_args(argv)
    if args.jobs:
        return list_jobs(args)
    gateway_config = args.gateway_config or default_gateway_config()
    try:
        source = (
            "--agent-config / --tasks"
            if args.agent_configs or args.agent_start_config or args.tasks
            else f"--agent-root {args.agent_root}"
        )
        envs = env_entries(args)
        listing = {
            "source": source,
            "envs": envs,
            "harnesses": harness_entries(),
            "gateway_config": str(gateway_config),
            "routes": route_entries(load_gateway_settings(gateway_config)),
        }
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        print(json.dumps(listing, indent=2) if args.json else render(listing), flush=True)
    except BrokenPipeError:  # `list | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    asked = args.env_names or args.agent_configs or args.tasks
    return 1 if asked and any(e.get("error") for e in envs) else 0
