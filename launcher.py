"""``python launcher.py --enable-evaluation --pool-size N``: run envs' cases through the gateway,
grade each session with its env's ``rule_evaluator.py`` and report.

Flags follow Safactory's launcher (DESIGN.md section 4). Exit codes: 0 when every session ran
(whatever the scores), 2 when some session errored or timed out (runtime or evaluator), 1 for a
setup error (bad config, gateway mismatch, missing model), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

from gateway.settings import ConfigError, GatewaySettings, load_settings
from rollout.envs import Case, EnvConfig, EnvConfigError, discover_envs, load_cases, load_env_config
from rollout.records import job_records
from rollout.report import SessionRecord, render_table, summarize, write_jsonl
from rollout.scheduler import HARNESS_FAILURES, RunSettings, Scheduler, session_rows
from rollout.services import ChildProcess, ServiceError, check_gateway, start_gateway, start_llama_server
from store import DbUrlError, Store

log = logging.getLogger("launcher")
HERE = Path(__file__).resolve().parent


class SetupError(RuntimeError):
    """The run cannot start; the message tells the user what to fix."""


def build_parser() -> argparse.ArgumentParser:
    """The launcher's flags."""
    ap = argparse.ArgumentParser(description="Run agent sessions through the gateway and grade them.")
    ap.add_argument("--agent-config", action="append", type=Path, help="an env.yaml to run (repeatable); "
                    "default: every <agent-root>/<name>/env.yaml")
    ap.add_argument("--agent-start-config", type=Path, help="YAML file of defaults for these flags "
                    "(keys are flag names with underscores, e.g. pool_size: 8)")
    ap.add_argument("--agent-root", type=Path, default=None, help="folder of envs (default: env)")
    ap.add_argument("--env", action="append", dest="env_names", help="only these env names (repeatable)")
    ap.add_argument("--gateway-base-url", help="use a running gateway, e.g. http://127.0.0.1:8000/v1/sessions")
    ap.add_argument("--gateway-config", type=Path, default=None,
                    help="gateway YAML used when the launcher starts the gateway (default: configs/gateway.yaml)")
    ap.add_argument("--llm-model", help="route key (default: the gateway config's default route)")
    ap.add_argument("--llm-temperature", type=float, default=None, help="sampling temperature (default: route's)")
    ap.add_argument("--enable-evaluation", action="store_true", help="grade sessions with rule_evaluator.py")
    ap.add_argument("--eval-timeout", type=float, default=None, help="evaluator timeout in seconds (default 60)")
    ap.add_argument("--db-path", default=None, help="trajectory store (default sqlite://env_trajs.db)")
    ap.add_argument("--pool-size", type=int, default=None, help="sessions run at once (default 4)")
    ap.add_argument("--rl-group-size", type=int, default=None, help="samples per case (default 1)")
    ap.add_argument("--max-steps", type=int, default=None, help="model calls per session (default: env's)")
    ap.add_argument("--limit", type=int, default=None, help="at most N cases per env")
    ap.add_argument("--job-id", help="job id (default: generated)")
    ap.add_argument("--resume", action="store_true", help="run the unfinished sessions of --job-id")
    ap.add_argument("--mode", default=None, choices=["local"], help="runtime backend (default local)")
    ap.add_argument("--out", type=Path, default=None, help="JSONL output (default runs/<UTC time>.jsonl)")
    ap.add_argument("--keep-workspaces", action="store_true", help="keep each session's temporary workspace")
    ap.add_argument("--count-unscored-as-zero", action="store_true",
                    help="average evaluator errors/timeouts/invalid rewards as 0 (default: leave them out)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--log-level", default=None, help="logging level (default WARNING)")
    return ap


_DEFAULTS: dict[str, Any] = {"agent_root": Path("env"), "db_path": "sqlite://env_trajs.db", "pool_size": 4,
                             "rl_group_size": 1, "mode": "local", "eval_timeout": 60.0, "log_level": "WARNING"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Flags > ``--agent-start-config`` YAML > built-in defaults. Raises SetupError for a bad YAML."""
    args = build_parser().parse_args(argv)
    merged = dict(_DEFAULTS)
    if args.agent_start_config:
        try:
            extra = yaml.safe_load(args.agent_start_config.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise SetupError(f"cannot read --agent-start-config {args.agent_start_config}: {e}") from e
        unknown = set(extra) - set(vars(args))
        if unknown:
            raise SetupError(f"--agent-start-config: unknown keys {sorted(unknown)}")
        merged.update(extra)
    for k, v in vars(args).items():
        if v is not None and v is not False:
            merged[k] = v
        merged.setdefault(k, v)
    ns = argparse.Namespace(**merged)
    ns.agent_root = Path(ns.agent_root)
    if ns.pool_size < 1 or ns.rl_group_size < 1:
        raise SetupError("--pool-size and --rl-group-size must be at least 1")
    if ns.resume and not ns.job_id:
        raise SetupError("--resume needs --job-id")
    return ns


def load_envs(ns: argparse.Namespace) -> list[tuple[EnvConfig, list[Case]]]:
    """The env configs and their cases, filtered by ``--env`` and ``--limit``."""
    try:
        configs = [load_env_config(p) for p in ns.agent_config] if ns.agent_config else discover_envs(ns.agent_root)
        if ns.env_names:
            missing = set(ns.env_names) - {c.name for c in configs}
            if missing:
                raise SetupError(f"--env: no such env {sorted(missing)} (have {[c.name for c in configs]})")
            configs = [c for c in configs if c.name in ns.env_names]
        return [(c, load_cases(c, ns.limit)) for c in configs]
    except EnvConfigError as e:
        raise SetupError(str(e)) from e


def gateway_settings(ns: argparse.Namespace) -> GatewaySettings:
    """The gateway config: ``--gateway-config``, else ``configs/gateway.yaml`` (cwd, then repo)."""
    path = ns.gateway_config
    if path is None:
        path = Path("configs/gateway.yaml")
        if not path.is_file():
            path = HERE / "configs" / "gateway.yaml"
    try:
        return load_settings(path)
    except ConfigError as e:
        raise SetupError(str(e)) from e


async def run(ns: argparse.Namespace) -> int:
    """The whole job. Returns the exit code (see the module docstring)."""
    envs = load_envs(ns)
    gw_settings = gateway_settings(ns)
    model = ns.llm_model or gw_settings.route_for_default()
    if not model:
        raise SetupError("no --llm-model and no route in the gateway config")
    try:
        store = Store(ns.db_path)
    except DbUrlError as e:
        raise SetupError(str(e)) from e
    children: list[ChildProcess] = []
    try:
        await store.init()
        job_id = ns.job_id or f"job-{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
        by_name = {cfg.name: cfg for cfg, _ in envs}
        cases = {(c.env_name, c.case_id): c for _, cs in envs for c in cs}
        if ns.resume:
            rows = await store.job_sessions(job_id, unfinished_only=True)
            unknown = {(r.env_name, r.case_id) for r in rows} - set(cases)
            if unknown:
                raise SetupError(f"--resume: sessions of {job_id} refer to envs/cases not loaded now: "
                                 f"{sorted(unknown)[:5]}")
            model = rows[0].llm_model if rows else model
            for r in rows:
                await store.reset_for_retry(r.env_id, r.attempts)
        else:
            rows = session_rows(job_id, model, envs, ns.rl_group_size, ns.max_steps)
            await store.add_job_sessions(rows)
        log_dir = Path("runs") / "logs" / job_id
        if ns.gateway_base_url:
            try:
                await check_gateway(ns.gateway_base_url, store.identity())
            except ServiceError as e:
                raise SetupError(str(e)) from e
            gateway_url = ns.gateway_base_url.rstrip("/")
        else:
            gateway_url = await _start_services(gw_settings, model, store, log_dir, children)
        print(f"job {job_id}: {len(rows)} sessions on route {model!r} via {gateway_url} "
              f"(pool {ns.pool_size}, db {store.identity()})", file=sys.stderr)
        settings = RunSettings(job_id=job_id, model=model, gateway_url=gateway_url, agent_root=ns.agent_root,
                               pool_size=ns.pool_size, temperature=ns.llm_temperature, max_steps=ns.max_steps,
                               enable_evaluation=ns.enable_evaluation, eval_timeout_s=ns.eval_timeout,
                               keep_workspaces=ns.keep_workspaces)
        bar = tqdm(total=len(rows), unit="session", desc=job_id, disable=ns.no_progress, file=sys.stderr)

        def done(rec: SessionRecord) -> None:
            bar.update(1)
            bar.set_postfix_str(f"last: {rec.env_name}/{rec.case_id} {rec.status} score={rec.score}")

        scheduler = Scheduler(store, settings, by_name, cases, on_done=done)
        try:
            await scheduler.run(rows)
        finally:
            bar.close()
        records = await job_records(store, job_id)
        out = ns.out or Path("runs") / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}.jsonl"
        write_jsonl(out, records)
        await store.checkpoint()
        print(render_table(summarize(records, count_unscored_as_zero=ns.count_unscored_as_zero)))
        print(f"{len(records)} sessions written to {out}; steps and rewards in {store.identity()}")
        failed = [r for r in records if r.status in HARNESS_FAILURES or r.eval_status in ("error", "timeout")]
        return 2 if failed else 0
    finally:
        for child in reversed(children):
            child.stop()
        await store.close()


async def _start_services(gw: GatewaySettings, model: str, store: Store, log_dir: Path,
                          children: list[ChildProcess]) -> str:
    route = gw.llm_routes.get(model)
    if route is None:
        raise SetupError(f"--llm-model {model!r} is not a route of the gateway config ({sorted(gw.llm_routes)})")
    routes = dict(gw.llm_routes)
    try:
        if route.managed is not None:
            llama = await start_llama_server(route.managed, log_dir)
            children.append(llama)
            routes[model] = route.model_copy(update={"base_url": llama.url})
        settings = gw.model_copy(update={
            "llm_routes": routes, "storage_type": store.kind,
            "storage_config": gw.storage_config.model_copy(update={"db_url": store.identity()}),
        })
        child = await start_gateway(settings, log_dir)
    except ServiceError as e:
        raise SetupError(str(e)) from e
    children.append(child)
    return child.url


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    try:
        ns = parse_args(argv)
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    logging.basicConfig(level=str(ns.log_level).upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(run(ns))
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: sessions in flight were cancelled and closed; rerun with "
              "--resume --job-id to finish the job", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
