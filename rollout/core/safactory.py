"""Safactory's config shapes read as env configs: its task YAML (``--agent-config``, an
``environments:`` list) with its start YAML (``--agent-start-config``: ``agent_name`` with
``container:``, or an ``agents:`` map). What has a meaning here is mapped (a container image is
the env's ``image``: the runner runs inside it, docs/images.md); what cannot run here (Brainbox
or RJob settings, bind mounts, parquet datasets) is refused, one line per key naming the file,
the key and what to do. The table is in docs/envs.md, "Coming from
Safactory".
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rollout.core.envs import EnvConfig, EnvConfigError, config_problems, did_you_mean, load_env_config

log = logging.getLogger(__name__)

ENTRY_KEYS = (
    "env_name",
    "env_image",
    "env_num",
    "dataset",
    "dataset_load_mode",
    "dataset_columns",
    "env_params",
    "hidden_fields",
)
"""The keys of one ``environments:`` entry of a Safactory task YAML (``hidden_fields`` is ours: the
row's fields the runner never sees)."""
ID_FIELD = "id"
"""A dataset's case id when every row has a unique one (Safactory names no id field)."""
START_KEYS = ("agent_name", "container", "sandbox", "rjob", "agents")
"""The top-level keys of a Safactory start YAML."""
AGENT_KEYS = ("container", "sandbox", "rjob")
"""The keys of one agent of the ``agents:`` map."""
CONTAINER_KEYS = (
    "workdir",
    "runner_entrypoint",
    "run_command",
    "idle_command",
    "result_mode",
    "network",
    "platform",
    "env",
    "mounts",
    "volumes",
    "extra_args",
    "install_runner_script",
)
ENTRYPOINT_KEYS = ("source", "target", "command")
IGNORED_CONTAINER_KEYS = (
    "workdir",
    "idle_command",
    "network",
    "platform",
    "extra_args",
    "install_runner_script",
)
"""Docker-only settings with no meaning here: the runner runs in the session's workspace, in the
bwrap sandbox (a warning names each; ``workdir`` has one for a runner in an image)."""
_SHELL = re.compile(r"[&;|<>$`()*?~\n\\]")


def is_task_config(raw: object) -> bool:
    """Whether a YAML document is a Safactory task config (an ``environments:`` list)."""
    return isinstance(raw, dict) and "environments" in raw


def is_start_config(raw: object) -> bool:
    """Whether a YAML document is a Safactory start config (rather than a file of flag defaults,
    where ``sandbox`` is the ``--sandbox`` flag's value, not a mapping)."""
    if not isinstance(raw, dict):
        return False
    return any(k in raw for k in START_KEYS if k != "sandbox") or isinstance(raw.get("sandbox"), dict)


def _read(path: Path, what: str) -> Any:
    try:
        with path.open(encoding="utf-8") as f:
            return yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise EnvConfigError(f"cannot read {what} {path}: {e}") from e


def load_agent_configs(paths: list[Path], start_config: Path | None) -> list[EnvConfig]:
    """The envs of every ``--agent-config`` file (``load_agent_config``). A Safactory
    ``start_config`` with no Safactory task config to start is an EnvConfigError, not ignored."""
    if start_config is not None and not paths:
        raise EnvConfigError(
            f"{start_config}: a Safactory start config starts the envs of a Safactory task config: "
            "add --agent-config <name>_config.yaml"
        )
    configs = [c for p in paths for c in load_agent_config(p, start_config)]
    if start_config is not None and not any(is_task_config(_read(p, "agent config")) for p in paths):
        raise EnvConfigError(
            f"{start_config}: a Safactory start config, but no --agent-config is a Safactory task "
            "config (environments:); an env.yaml has its own runtime: drop --agent-start-config"
        )
    return configs


def load_agent_config(path: Path, start_config: Path | None = None) -> list[EnvConfig]:
    """The envs of one ``--agent-config`` file: an ``env.yaml`` (one env), or a Safactory task
    YAML (one env per ``environments:`` entry, each started as ``start_config`` says). Raises
    EnvConfigError with one line per problem."""
    path = path.resolve()
    raw = _read(path, "agent config")
    if not is_task_config(raw):
        return [load_env_config(path)]
    if start_config is None:
        raise EnvConfigError(
            f"{path}: a Safactory task config (environments:) needs its start config: "
            "add --agent-start-config <name>_start.yaml"
        )
    start_path = start_config.resolve()
    start = _read(start_path, "--agent-start-config")
    if not is_start_config(start):
        raise EnvConfigError(f"{start_path}: not a Safactory start config (none of {', '.join(START_KEYS)})")
    entries = raw["environments"]
    if not isinstance(entries, list) or not entries:
        raise EnvConfigError(f"{path}: environments: must be a non-empty list of environments")
    problems: list[str] = [
        f"{path}: {k}: unknown key{did_you_mean(k, ['environments'])}" for k in raw if k != "environments"
    ]
    configs: list[EnvConfig] = []
    for i, entry in enumerate(entries):
        where = f"{path}: environments[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: must be a mapping")
            continue
        found, bad = _entry(path, where, entry, start_path, start)
        problems += bad
        if found is not None:
            configs.append(found)
    if problems:
        raise EnvConfigError("\n".join(problems))
    return configs


def env_folders(path: Path) -> list[tuple[str, Path]]:
    """``(env name, env folder)`` of each env of one ``--agent-config`` file, without its start
    config (a regrade runs no runner). Raises EnvConfigError."""
    path = path.resolve()
    raw = _read(path, "agent config")
    if not is_task_config(raw):
        cfg = load_env_config(path)
        return [(cfg.name, cfg.env_dir)]
    entries = raw["environments"] if isinstance(raw["environments"], list) else []
    names = [e.get("env_name") for e in entries if isinstance(e, dict)]
    if not names or not all(isinstance(n, str) and n for n in names):
        raise EnvConfigError(f"{path}: environments: each entry needs an env_name")
    return [(str(n), path.parent) for n in names]


def _entry(
    path: Path, where: str, entry: dict[str, Any], start_path: Path, start: dict[str, Any]
) -> tuple[EnvConfig | None, list[str]]:
    problems = [
        f"{where}.{k}: unknown key{did_you_mean(str(k), ENTRY_KEYS)}" for k in entry if k not in ENTRY_KEYS
    ]
    name = entry.get("env_name")
    if not isinstance(name, str) or not name:
        return None, [
            *problems,
            f"{where}.env_name: required (the env's name, = agent_name of the start config)",
        ]
    image = entry.get("env_image")
    if "env_image" in entry and (not isinstance(image, str) or not image.strip()):
        problems.append(f"{where}.env_image: must be an image reference (e.g. mybench-image:latest)")
    mode = entry.get("dataset_load_mode", "eager")
    if mode != "eager":
        problems.append(
            f"{where}.dataset_load_mode: {mode!r} is not read here; use a JSONL dataset and eager"
        )
    if "dataset_columns" in entry:
        problems.append(f"{where}.dataset_columns: parquet column selection is not read here; remove it")
    dataset = entry.get("dataset")
    if not isinstance(dataset, str) or not dataset:
        problems.append(f"{where}.dataset: required here: a JSONL file, one session per line")
    elif not dataset.endswith(".jsonl"):
        problems.append(
            f"{where}.dataset: {dataset!r}: only JSONL datasets are read here; convert it to "
            "JSONL (one JSON object per line)"
        )
    runtime, container, bad = _runtime(start_path, start, name, isinstance(image, str))
    problems += bad
    if problems:
        return None, problems
    image = image if isinstance(image, str) else container.get("image")
    hidden = entry.get("hidden_fields", [])
    fields, id_field = _scan_rows((path.parent / str(dataset)).resolve())
    values: dict[str, Any] = {
        "name": name,
        "runtime": runtime,
        "dataset": {"format": "jsonl", "path": dataset, "hidden_fields": hidden, "id_field": id_field},
        "params": entry.get("env_params") or {},
        "group_size": entry.get("env_num", 1),
    }
    if image:  # the runner runs inside the image, its workspace at container.workdir (docs/images.md)
        values |= {"image": image, "workdir": container.get("workdir")}
    try:
        cfg = EnvConfig.model_validate(values)
    except ValidationError as e:
        keys = {
            "name": "env_name",
            "group_size": "env_num",
            "params": "env_params",
            "dataset": "dataset",
            "dataset.hidden_fields": "hidden_fields",
        }
        return None, [
            f"{where}.{_key(keys, line.split(':', 1)[0])}:{line.split(':', 1)[1]}"
            for line in config_problems(e, EnvConfig)
        ]
    cfg.env_dir = path.parent
    cfg.config_path = path
    if not cfg.dataset.hidden_fields and fields:
        log.warning(
            "%s: env %s hides no field: the runner sees every field of its rows (%s); hide the answer "
            "with hidden_fields: [<field>, ...] in this entry",
            where,
            name,
            ", ".join(fields),
        )
    return cfg, []


def _key(keys: dict[str, str], loc: str) -> str:
    """The Safactory key of an EnvConfig error location (``dataset.hidden_fields.0`` ->
    ``hidden_fields.0``)."""
    for ours, theirs in sorted(keys.items(), key=lambda kv: -len(kv[0])):
        if loc == ours or loc.startswith(ours + "."):
            return theirs + loc[len(ours) :]
    return loc


def _scan_rows(dataset: Path) -> tuple[list[str], str | None]:
    """The fields of a JSONL dataset's rows (sorted) and its case id field: ``ID_FIELD`` when
    every row has a unique non-empty string or integer one, else None (cases numbered by line).
    ``([], None)`` when the file cannot be read as JSON objects (loading its cases says why)."""
    fields: set[str] = set()
    ids: list[object] = []
    try:
        with dataset.open(encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return [], None
    for row in rows:
        if not isinstance(row, dict):
            return [], None
        fields.update(row)
        ids.append(row.get(ID_FIELD))
    valid = all((isinstance(i, str) and i) or (isinstance(i, int) and not isinstance(i, bool)) for i in ids)
    unique = len({str(i) for i in ids}) == len(ids)
    if rows and valid and not unique or any(ID_FIELD in r for r in rows) and not valid:
        log.warning(
            "%s: the %r fields of its rows are not unique non-empty ids: cases are numbered by line",
            dataset,
            ID_FIELD,
        )
    return sorted(fields), ID_FIELD if rows and valid and unique else None


def _runtime(
    start_path: Path, start: dict[str, Any], name: str, env_image: bool
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The ``runtime:`` of env ``name`` from the start config, its ``container:`` block, and the
    problems found. ``env_image``: the task config names the env's image."""
    where = f"{start_path}:"
    problems = [
        f"{where} {k}: unknown key{did_you_mean(str(k), START_KEYS)}" for k in start if k not in START_KEYS
    ]
    if "agents" in start:
        agents = start["agents"]
        if not isinstance(agents, dict) or not isinstance(agents.get(name), dict):
            have = sorted(agents) if isinstance(agents, dict) else []
            return (
                {},
                {},
                [*problems, f"{where} agents: no agent {name!r} (the env_name){did_you_mean(name, have)}"],
            )
        block: dict[str, Any] = agents[name]
        prefix = f"agents.{name}."
        problems += [
            f"{where} {prefix}{k}: unknown key{did_you_mean(str(k), AGENT_KEYS)}"
            for k in block
            if k not in AGENT_KEYS
        ]
    else:
        if start.get("agent_name") != name:
            return (
                {},
                {},
                [
                    *problems,
                    f"{where} agent_name: {start.get('agent_name')!r} does not match env_name "
                    f"{name!r}; set agent_name: {name}",
                ],
            )
        block, prefix = start, ""
    for key, what in (("sandbox", "Brainbox sandbox instances"), ("rjob", "RJob jobs")):
        if key in block:
            problems.append(
                f"{where} {prefix}{key}: {what} do not run here (runners run in the local bwrap "
                f"sandbox); remove {prefix}{key}"
            )
    container = block.get("container")
    if not isinstance(container, dict):
        return {}, {}, [*problems, f"{where} {prefix}container: required (with runner_entrypoint.command)"]
    prefix += "container."
    problems += [
        f"{where} {prefix}{k}: unknown key{did_you_mean(str(k), CONTAINER_KEYS)}"
        for k in container
        if k not in (*CONTAINER_KEYS, "image")
    ]
    image = container.get("image")
    if "image" in container and (not isinstance(image, str) or not image.strip()):
        problems.append(f"{where} {prefix}image: must be an image reference (e.g. mybench-image:latest)")
    in_image = env_image or isinstance(image, str)
    workdir = container.get("workdir")
    if in_image and workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
        problems.append(f"{where} {prefix}workdir: {workdir!r}: must be an absolute path in the image")
    for key in ("mounts", "volumes"):
        if container.get(key):
            problems.append(
                f"{where} {prefix}{key}: host folders are not bound into the sandbox here; remove "
                f"{key} (the runner's files stay in its workspace, kept with the session)"
            )
    if container.get("result_mode", "json") != "json":
        problems.append(
            f"{where} {prefix}result_mode: {container['result_mode']!r}: only json runs here (an exit "
            "code is never a result); print the result JSON and remove result_mode"
        )
    ignored = [
        f"{prefix}{k}" for k in IGNORED_CONTAINER_KEYS if k in container and not (in_image and k == "workdir")
    ]
    if ignored:
        log.warning(
            "%s %s: ignored (Docker only: the runner runs in the session's workspace, in the sandbox)",
            where,
            ", ".join(ignored),
        )
    env = container.get("env") or {}
    if not isinstance(env, dict):
        problems.append(f"{where} {prefix}env: must be a mapping of names to values")
        env = {}
    command, bad = _command(start_path, where, prefix, container)
    problems += bad
    runtime = {
        "command": command,
        "env": {str(k): "" if v is None else str(v) for k, v in env.items()},
        "safactory_env": True,
    }
    return runtime, container, problems


def _command(
    start_path: Path, where: str, prefix: str, container: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """``container.runner_entrypoint`` (or the legacy ``run_command``) as an argv: the entrypoint's
    ``target`` replaced by its ``source`` (relative to the start config), ``python`` by the
    launcher's interpreter; shell syntax runs under ``/bin/sh -c``."""
    entry = container.get("runner_entrypoint") or {}
    if not isinstance(entry, dict):
        return [], [f"{where} {prefix}runner_entrypoint: must be a mapping (source, target, command)"]
    problems = [
        f"{where} {prefix}runner_entrypoint.{k}: unknown key{did_you_mean(str(k), ENTRYPOINT_KEYS)}"
        for k in entry
        if k not in ENTRYPOINT_KEYS
    ]
    text = entry.get("command") or container.get("run_command")
    if not isinstance(text, str) or not text.strip():
        return [], [
            *problems,
            f"{where} {prefix}runner_entrypoint.command: required (the command run per session)",
        ]
    source, target = entry.get("source"), entry.get("target")
    if source is not None:
        src = (start_path.parent / str(source)).resolve()
        if not src.exists():
            problems.append(f"{where} {prefix}runner_entrypoint.source: {src} does not exist")
        if isinstance(target, str) and target.strip("/"):
            text = re.sub(re.escape(target.rstrip("/")) + r"(?=$|[/\s'\";&|)])", lambda _: str(src), text)
    if _SHELL.search(text):
        return ["/bin/sh", "-c", text], problems
    try:
        argv = shlex.split(text)
    except ValueError as e:
        return [], [*problems, f"{where} {prefix}runner_entrypoint.command: cannot be split: {e}"]
    if argv and argv[0] in ("python", "python3"):
        argv[0] = "{python}"
    return argv, problems
