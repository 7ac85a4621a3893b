"""Preparing a job before any session row is written: its envs and cases loaded and selected,
harnesses found, evaluators and the sandbox checked, the gateway config and routes read. Every
problem is a ``SetupError`` whose message tells the user what to fix."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from gateway.settings import GatewaySettings
from rollout.contract.harness import HarnessUnavailable
from rollout.core.envs import (
    HOST_TOOLCHAIN_ALONE,
    SAME_CONTAINER_ALONE,
    Case,
    EnvConfig,
    EnvConfigError,
    discover_envs,
    load_cases,
    no_such_env,
    scan_envs,
    task_folder_env,
)
from rollout.core.logs import notices, plural
from rollout.core.plan import select_cases
from rollout.core.safactory import load_agent_configs
from rollout.core.setup import SetupError, load_gateway_settings
from rollout.grading.evaluator_loader import EVALUATOR_FILE_NAME, env_evaluator
from rollout.grading.grader import grader_mode
from rollout.jobs.options import JobOptions
from rollout.sandbox.bwrap import SandboxUnavailable
from rollout.sandbox.harness_cache import (
    InstalledHarness,
    LoadedHarness,
    cache_dir,
    is_installed,
    load_harness,
)
from rollout.sandbox.harness_cache import install as install_harness
from rollout.sandbox.runner import effective_mode, sandbox_support


@dataclass
class PreparedJob:
    """A job checked and ready to plan: its envs with their selected cases, the harnesses named
    (loaded, not installed), the gateway config and the job's routes."""

    envs: list[tuple[EnvConfig, list[Case]]]
    harnesses: dict[str, LoadedHarness]
    gateway: GatewaySettings
    models: list[str]


def select_envs(opts: JobOptions) -> tuple[list[tuple[EnvConfig, list[Case]]], dict[str, LoadedHarness]]:
    """The envs and cases ``opts`` selects (left to those a wrapper harness can run) and the
    harnesses it names; with ``enable_evaluation``, every env graded (:func:`check_evaluators`).
    What a launcher job and a ``serve`` batch both check. Raises SetupError."""
    envs = load_envs(opts)
    loaded = load_harnesses(opts.harness)
    if any(h.harness.runtime is None for h in loaded.values()) and not opts.resume:
        envs = harness_envs(envs)  # the wrapper needs an instruction; a harness's own runtime runs any env
    # the oracle: a wrapper harness that runs solve.sh (one with its own runtime finds its reference itself)
    for name in (n for n, h in loaded.items() if h.harness.uses_solution and h.harness.runtime is None):
        check_solutions(name, envs)
    if opts.enable_evaluation:
        check_evaluators(opts.agent_root, [cfg for cfg, _ in envs])
    return envs, loaded


def job_models(opts: JobOptions, gw: GatewaySettings) -> list[str]:
    """The job's routes: ``--llm-model`` (each once), else the gateway config's default route.
    SetupError when there is neither."""
    default = gw.route_for_default()
    models = list(dict.fromkeys(opts.llm_model)) or ([default] if default else [])
    if not models:
        raise SetupError("no --llm-model and no route in the gateway config")
    return models


def prepare(opts: JobOptions) -> PreparedJob:
    """Everything checked before a job opens its store: :func:`select_envs`, the sandbox (probed
    here unless on Ray, where each node checks its own), the gateway config and the routes.
    Raises SetupError."""
    envs, loaded = select_envs(opts)
    if opts.max_steps == 0:
        notices.warning(
            "warning: --max-steps 0: no model call is allowed; each session's first call is answered "
            "with the gateway's synthetic stop and the session ends truncated (-1: no limit)"
        )
    check_sandbox(opts, [cfg for cfg, _ in envs], probe=opts.mode == "local")
    gw = load_gateway_settings(opts.gateway_config)
    models = job_models(opts, gw)
    if not opts.gateway_base_url and not opts.resume:
        check_routes(gw, models)
        check_harness_apis(gw, models, loaded)
    return PreparedJob(envs, loaded, gw, models)


API_OF_PROTOCOL = {"chat_completions": "openai", "responses": "openai", "anthropic_messages": "anthropic"}
"""The gateway route ``api`` that serves each harness protocol."""


def check_harness_apis(gw: GatewaySettings, models: list[str], harnesses: dict[str, LoadedHarness]) -> None:
    """SetupError for an agent CLI harness whose protocol a route of the job does not serve: the
    gateway would refuse every call of its sessions (``route_api_mismatch``), known before any
    session runs."""
    for name, h in harnesses.items():
        if h.harness.runtime is not None or h.harness.uses_solution:  # an attack's own runtime, the oracle
            continue
        api = API_OF_PROTOCOL[h.harness.protocol]
        wrong = [m for m in models if gw.llm_routes[m].api != api]
        if wrong:
            raise SetupError(
                f"--harness {name} speaks {h.harness.protocol} (an {api} API route), but route(s) "
                f"{', '.join(map(repr, wrong))} speak the {gw.llm_routes[wrong[0]].api} API: the gateway would "
                f"refuse every call; pick a route with api: {api} (--llm-model)"
            )


TASK_FORMATS = ("task_dirs", "harbor")
"""Dataset formats whose cases a harness can run (an instruction per case)."""


def load_envs(opts: JobOptions) -> list[tuple[EnvConfig, list[Case]]]:
    """The env configs (``agent_configs`` and the ``tasks`` folders, else every env of the agent
    root) and their cases, filtered by ``env_names``, ``limit`` and ``case_ids`` (an
    env left without a case is left out). Raises SetupError
    for bad configs, unknown env names or case ids, two envs with the same name and a runtime command naming
    a file of the env folder that does not exist. With ``env_names``, an env folder of the agent
    root that does not load is skipped with a warning when the envs asked for are all found."""
    if opts.host_toolchain and not opts.tasks:
        raise SetupError(HOST_TOOLCHAIN_ALONE)
    if opts.same_container and not opts.tasks:
        raise SetupError(SAME_CONTAINER_ALONE)
    try:
        if opts.agent_configs or opts.agent_start_config is not None or opts.tasks:
            configs = [
                *load_agent_configs(opts.agent_configs, opts.agent_start_config),
                *(task_folder_env(p, opts.host_toolchain, opts.same_container) for p in opts.tasks),
            ]
        elif opts.env_names:
            configs, broken = scan_envs(opts.agent_root)
            if broken and set(opts.env_names) - {c.name for c in configs}:
                raise broken[0]  # perhaps the env asked for
            for e in broken:
                notices.warning(f"warning: skipped an env that does not load (not asked for by --env): {e}")
        else:
            configs = discover_envs(opts.agent_root)
        seen: dict[str, Path] = {}
        for c in configs:
            if c.name in seen:
                raise SetupError(f"two envs are named {c.name!r}: {seen[c.name]} and {c.config_path}")
            seen[c.name] = c.config_path
        if opts.env_names:
            missing = set(opts.env_names) - set(seen)
            if missing:
                raise SetupError(no_such_env(missing, seen))
            configs = [c for c in configs if c.name in opts.env_names]
        for c in configs:
            if absent := c.missing_runtime_files():
                raise SetupError(
                    f"env {c.name} ({c.config_path}): runtime.command names {absent[0]}, which does not exist"
                )
        envs = [(c, load_cases(c, opts.limit)) for c in configs]
        return select_cases(envs, opts.case_ids)
    except EnvConfigError as e:
        raise SetupError(str(e)) from e


def check_evaluators(agent_root: Path, configs: list[EnvConfig]) -> None:
    """With ``--enable-evaluation``, before any session: SetupError naming each env that would not
    be graded (no evaluator found, not a Harbor env graded by its tests) and the file expected;
    an env that says ``evaluation: none`` is run ungraded."""
    missing = [
        cfg
        for cfg in configs
        if cfg.evaluation != "none"
        and cfg.dataset.format != "harbor"
        and env_evaluator(agent_root, cfg) is None
    ]
    if missing:
        where = "; ".join(
            f"env {cfg.name!r} needs {agent_root / cfg.name / EVALUATOR_FILE_NAME}"
            + (
                f" (or {cfg.env_dir.parent / cfg.name / EVALUATOR_FILE_NAME})"
                if cfg.env_dir.parent.resolve() != Path(agent_root).resolve()
                else ""
            )
            + (
                f" (its env.yaml is in {cfg.env_dir.name}/, but evaluators are found by the env's name:"
                f" rename the folder to {cfg.name}/ or its name: to {cfg.env_dir.name!r})"
                if cfg.env_dir.name != cfg.name and (cfg.env_dir / EVALUATOR_FILE_NAME).is_file()
                else ""
            )
            for cfg in missing
        )
        raise SetupError(
            f"--enable-evaluation: no evaluator: {where}; or set `evaluation: none` in its "
            "env.yaml to run it ungraded"
        )


def harness_envs(envs: list[tuple[EnvConfig, list[Case]]]) -> list[tuple[EnvConfig, list[Case]]]:
    """The envs a harness can run: task-directory envs (``dataset.format: task_dirs`` or
    ``harbor``). The others are left out with a warning line; SetupError when none is left."""
    kept = [(cfg, cases) for cfg, cases in envs if cfg.dataset.format in TASK_FORMATS]
    skipped = sorted(cfg.name for cfg, _ in envs if cfg.dataset.format not in TASK_FORMATS)
    if skipped:
        notices.warning(
            f"warning: --harness runs task-directory envs only (dataset.format: task_dirs or harbor); skipping "
            f"{', '.join(skipped)}"
        )
    if not kept:
        raise SetupError(
            "--harness: none of the selected envs is a task-directory env (dataset.format: "
            f"task_dirs or harbor); skipped {', '.join(skipped)}"
        )
    return kept


def check_solutions(harness: str, envs: list[tuple[EnvConfig, list[Case]]]) -> None:
    """SetupError when a case has no reference solution (a Harbor task's ``solution/solve.sh``) for
    ``harness``, which runs it (the ``oracle``): its sessions could only fail, and not the agent's."""
    missing = [f"{cfg.name}/{c.case_id}" for cfg, cases in envs for c in cases if c.solution_dir is None]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise SetupError(
            f"--harness {harness} runs each case's reference solution (a Harbor task's solution/solve.sh); "
            f"{plural(len(missing), 'case')} {'has' if len(missing) == 1 else 'have'} none: "
            f"{', '.join(missing[:5])}{more} (select cases that have one with --case, or drop --harness {harness})"
        )


def load_harnesses(specs: list[str]) -> dict[str, LoadedHarness]:
    """The harnesses named (or given by folder) by ``--harness``, by name; SetupError for one that
    cannot be found or loaded, or two with the same name."""
    found: dict[str, LoadedHarness] = {}
    for spec in specs:
        try:
            h = load_harness(spec)
        except HarnessUnavailable as e:
            raise SetupError(str(e)) from e
        if h.name in found and found[h.name].folder != h.folder:
            raise SetupError(
                f"--harness: two harnesses are named {h.name!r}: {found[h.name].folder} and {h.folder}"
            )
        found[h.name] = h
    return found


async def install_harnesses(loaded: dict[str, LoadedHarness]) -> dict[str, InstalledHarness]:
    """Install each harness once per machine (``rollout.sandbox.harness_cache.ensure_installed``, in a thread);
    SetupError when one cannot be installed here."""
    ready: dict[str, InstalledHarness] = {}
    for name, h in loaded.items():
        if not is_installed(h.harness):
            notices.info(
                f"harness {name}: installing {h.harness.version} into {cache_dir(h.harness)} "
                "(once per machine)"
            )
        try:
            ready[name] = await asyncio.to_thread(install_harness, h)
        except HarnessUnavailable as e:
            raise SetupError(f"harness {name} cannot be used here: {e}") from e
    return ready


def check_sandbox(opts: JobOptions, envs: list[EnvConfig], probe: bool = True) -> None:
    """Before anything runs: when an env runs sandboxed, check that bubblewrap works here (else
    SetupError saying how to install it or opt out) and print how each limit is enforced; warn
    about envs that run without a sandbox. ``probe`` False: the warning only (on Ray each node
    checks its own sandbox)."""
    bare = sorted(cfg.name for cfg in envs if effective_mode(cfg, opts.sandbox) == "none")
    if bare:
        notices.warning(
            f"warning: no sandbox for env(s) {', '.join(bare)}: their runtimes see the host's files, "
            "environment and network"
        )
    trusted = (
        sorted(cfg.name for cfg in envs if grader_mode(cfg, opts.grader_isolation or opts.sandbox) == "none")
        if opts.enable_evaluation
        else []
    )
    if trusted:
        notices.warning(
            f"warning: evaluators of env(s) {', '.join(trusted)} run in the launcher (grader isolation none): "
            "trust them, and what they run of the agent's answer, with this machine"
        )
    graded_in_sandbox = opts.enable_evaluation and len(trusted) < len(envs)
    if (len(bare) == len(envs) and not graded_in_sandbox) or not probe:
        return
    try:
        support = sandbox_support()
    except SandboxUnavailable as e:
        raise SetupError(str(e)) from e
    how = "; ".join(f"{k}: {v}" for k, v in support.mechanisms().items())
    notices.info(f"sandbox: bubblewrap ({support.bwrap}); limits enforced by {how}")
    if support.pids is None:
        notices.warning(
            "warning: the per-session process limit is not enforced on this machine (no usable cgroup "
            "pids controller)"
        )


def check_routes(gw: GatewaySettings, models: list[str]) -> None:
    """SetupError naming each of ``models`` that is not a route of the gateway config."""
    unknown = [m for m in models if m not in gw.llm_routes]
    if unknown:
        raise SetupError(
            f"--llm-model {', '.join(map(repr, unknown))}: not a route of the gateway config "
            f"({', '.join(sorted(gw.llm_routes))})"
        )
