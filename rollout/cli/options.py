"""Flags to options: a command's parsed flags (over ``--agent-start-config`` YAML) validated into
one of the options models of ``rollout.jobs.options``, each bad value named by its flag."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rollout.core.envs import did_you_mean, fields_at
from rollout.core.safactory import is_start_config
from rollout.core.setup import SetupError

HERE = Path(__file__).resolve().parents[2]

FLAG_OF = {
    "agent_configs": "agent_config",
    "env_names": "env",
    "case_ids": "case",
    "session_ids": "session",
    "env_name": "env",
}
"""Option fields whose flag has another name."""


def start_config_values(args: argparse.Namespace, cli_only: set[str]) -> tuple[dict[str, Any], set[str]]:
    """Flags over ``--agent-start-config`` YAML (the flags named in ``cli_only`` left out), and the
    keys whose value came from that file."""
    values: dict[str, Any] = {}
    if args.agent_start_config:
        try:
            values = yaml.safe_load(args.agent_start_config.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise SetupError(f"cannot read --agent-start-config {args.agent_start_config}: {e}") from e
        if not isinstance(values, dict):
            raise SetupError(f"--agent-start-config {args.agent_start_config} must be a mapping")
        if is_start_config(values):  # Safactory's: how its task YAML's envs start, not flag defaults
            values = {"agent_start_config": args.agent_start_config}
    flags = {k: v for k, v in vars(args).items() if v is not None and k not in cli_only}
    from_file = {str(k) for k in values if k not in flags}
    values.update(flags)
    return values, from_file


def validate_options(
    model: type[Any], values: dict[str, Any], from_file: set[str], start_config: Path | None
) -> Any:
    """``model`` from ``values``; SetupError naming each bad value's flag, or its key in the
    ``start_config`` file when it came from there (keys in ``from_file``)."""
    try:
        return model.model_validate(values)
    except ValidationError as e:
        msgs = []
        for err in e.errors():
            name = str(err["loc"][0]) if err["loc"] else "?"
            key = "".join(f".{k}" for k in err["loc"][1:] if isinstance(k, str))  # e.g. breaker.window
            msg = str(err["msg"]).removeprefix("Value error, ")
            if isinstance(err.get("input"), int | float | str) and err["type"] != "missing":
                msg += f" (got {err['input']!r})"
            if err["type"] == "extra_forbidden":
                loc = tuple(err["loc"])
                msg = f"unknown key{did_you_mean(str(loc[-1]), fields_at(model, loc[:-1]))}"
            if name in from_file:
                msgs.append(f"--agent-start-config {start_config}: {name}{key}: {msg}")
            else:
                msgs.append(f"--{FLAG_OF.get(name, name).replace('_', '-')}{key}: {msg}")
        raise SetupError("\n".join(msgs)) from None


def default_gateway_config() -> Path:
    """``configs/gateway.yaml`` of the working directory, else the project's."""
    local = Path("configs/gateway.yaml")
    return local if local.is_file() else HERE / "configs" / "gateway.yaml"


def options_of(model: type[Any], args: argparse.Namespace, **values: Any) -> Any:
    """``model`` from the flags of ``args`` that are its fields and were given (None: not given,
    so the model's default), then ``values``; SetupError naming each bad flag."""
    given = {k: v for k, v in vars(args).items() if k in model.model_fields and v is not None}
    return validate_options(model, {**given, **values}, set(), None)
