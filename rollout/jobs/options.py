"""A job's settings: ``JobOptions`` (the launcher's flags, validated: every job setting is one
field here, its default defined once) and ``JobContext`` (what a job resolved when it started:
its id, gateway, routes, harnesses, folders)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollout.core.envs import MAX_GROUP_SIZE
from rollout.core.outcomes import DEFAULT_RETRY_ON, RetryPolicy, check_classes
from rollout.grading.evaluation import DEFAULT_EVAL_TIMEOUT_S
from rollout.jobs.breaker import BreakerSettings
from rollout.sandbox.harness_cache import InstalledHarness
from store import JOB_ID_PATTERN, MAX_INT


class SharedOptions(BaseModel):
    """The settings of every command that writes a job (run, ``--regrade``, ``grade``): where the
    envs and the store are, the evaluator timeout, how many run at once, the JSONL output. Each
    field's description is its flag's help (``flag_help``), the default appended from the field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent_root: Path = Field(default=Path("env"), description="folder of envs")
    db_path: str = Field(
        default="sqlite://env_trajs.db",
        description=("trajectory store: a SQLite file path, sqlite://PATH or postgresql://..."),
    )
    eval_timeout: float = Field(
        default=DEFAULT_EVAL_TIMEOUT_S, gt=0, allow_inf_nan=False, description="evaluator timeout in seconds"
    )
    pool_size: int = Field(default=4, ge=1, description="sessions run at once")
    out: Path | None = Field(
        default=None, description="JSONL output (default runs/<UTC time>-<job id>.jsonl)"
    )


class JobOptions(SharedOptions):
    """Everything a job needs (the launcher's flags, validated). Seconds for timeouts."""

    agent_configs: list[Path] = Field(
        default_factory=list,
        description=(
            "an env.yaml, or a Safactory task config (environments:), to run (repeatable); default: every "
            "<agent-root>/<name>/env.yaml"
        ),
    )
    agent_start_config: Path | None = None  # a Safactory start YAML: how its task YAML's envs start
    env_names: list[str] = Field(default_factory=list, description="only these env names (repeatable)")
    case_ids: list[str] = Field(
        default_factory=list, description=("only this case id, of any env (repeatable; with --harness too)")
    )
    tasks: list[Path] = Field(
        default_factory=list,
        description=(
            "a folder of task folders (instruction.md + expected.json + files/, or Harbor tasks) run as one env, no "
            "env.yaml needed (repeatable)"
        ),
    )
    host_toolchain: bool = Field(
        default=False,
        description=(
            "the --tasks folders' Harbor tasks run on the host's tools, not in their images (an env.yaml's "
            "dataset.host_toolchain: true)"
        ),
    )
    same_container: bool = Field(
        default=False,
        description=(
            "the --tasks folders' Harbor tasks in images are verified on the agent's own copy-on-write layer, "
            "as Harbor does (an env.yaml's dataset.same_container: true; every record says so)"
        ),
    )
    timeout: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description=(
            "each session's timeout in seconds (default: the env's runtime.timeout_s, a Harbor task's own)"
        ),
    )
    gateway_base_url: str | None = Field(
        default=None, description=("use a running gateway, e.g. http://127.0.0.1:8000/v1/sessions")
    )
    gateway_config: Path = Field(
        description=("gateway YAML used when the launcher starts the gateway (default: configs/gateway.yaml)")
    )
    llm_model: list[str] = Field(
        default_factory=list,
        description=(
            "route key (repeatable: a matrix of models; default: the gateway config's default route)"
        ),
    )
    harness: list[str] = Field(
        default_factory=list,
        description=(
            "run task-directory envs with this agent CLI (repeatable: a matrix of harnesses): a bundled harness name "
            "(harnesses/<name>/) or a folder holding a harness.py"
        ),
    )
    llm_temperature: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description=("sampling temperature (default: the server's)")
    )
    enable_evaluation: bool = Field(default=False, description="grade sessions with rule_evaluator.py")
    rl_group_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GROUP_SIZE,
        description=("samples per case (default: the env's group_size, else 1)"),
    )
    max_steps: int | None = Field(
        default=None, ge=-1, le=MAX_INT, description=("model calls per session (default: the env's)")
    )
    limit: int | None = Field(default=None, ge=1, description="at most N cases per env")
    job_id: str | None = Field(
        default=None, pattern=JOB_ID_PATTERN, description="job id (default: generated)"
    )
    resume: bool = Field(
        default=False,
        description=(
            "run the unfinished sessions of --job-id and those that ended in an infrastructure failure "
            "(launcher_error only with --rerun-launcher-errors)"
        ),
    )
    rerun_launcher_errors: bool = Field(
        default=False,
        description=(
            "with --resume: also run the sessions that ended in launcher_error (a launcher bug; kept as they ended "
            "by default)"
        ),
    )
    mode: Literal["local", "ray"] = Field(
        default="local",
        description=("where runtimes run: local subprocesses, or ray: tasks on a Ray cluster"),
    )
    ray_address: str | None = Field(
        default=None, description=("with --mode ray: the Ray head, HOST:PORT, or auto (default $RAY_ADDRESS)")
    )
    gateway_advertise_url: str | None = Field(
        default=None,
        description=(
            "the session base URL runtimes use, as their machines reach the gateway (http://HOST:PORT/v1/sessions; "
            "default: the gateway's own URL)"
        ),
    )
    sandbox: Literal["bwrap", "none"] = Field(
        default="bwrap",
        description=("run each runtime in a bubblewrap sandbox (bwrap), or none: no isolation"),
    )
    grader_isolation: Literal["bwrap", "none"] | None = Field(
        default=None,
        description=(
            "run each evaluator in the grader sandbox (bwrap), or none: in the launcher, for trusted graders "
            "(default: as --sandbox)"
        ),
    )
    keep_workspaces: bool = Field(
        default=False,
        description=("keep each session's temporary workspace (the folder is printed at the end)"),
    )
    max_retries: int = Field(
        default=2,
        ge=0,
        description=("attempts after the first for a session that ended in an infrastructure failure"),
    )
    retry_backoff_s: float = Field(
        default=1.0,
        ge=0,
        allow_inf_nan=False,
        description=("backoff before the first retry in seconds, doubled each retry, with jitter"),
    )
    retry_on: list[str] = Field(default_factory=lambda: sorted(DEFAULT_RETRY_ON))
    no_retry_on: list[str] = Field(default_factory=list)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    max_broken_graders: int = Field(
        default=1,
        ge=0,
        description=(
            "stop the job (resumable) at N broken-grader findings: a grader that fails on a session and on the case's "
            "untouched starting workspace too (0: never stop); the job exits 5 either way"
        ),
    )
    image: list[str] = Field(
        default_factory=list,
        description=(
            "run image REF (an env's image, a task's docker_image, a Dockerfile's FROM) as LOCAL, an image of the "
            "local container store (repeatable; docs/images.md)"
        ),
    )

    @field_validator("image")
    @classmethod
    def _image_map(cls, v: list[str]) -> list[str]:
        for item in v:
            ref, sep, local = item.partition("=")
            if not sep or not ref.strip() or not local.strip():
                raise ValueError(
                    f"--image {item!r}: expected REF=LOCAL (e.g. python:3=localhost/my/python:3)"
                )
        return v

    def image_map(self) -> tuple[tuple[str, str], ...]:
        """``--image`` as (reference, local reference) pairs."""
        return tuple((r.strip(), loc.strip()) for r, _, loc in (i.partition("=") for i in self.image))

    @field_validator("llm_model", "harness", mode="before")
    @classmethod
    def _listed(cls, v: object) -> object:
        """One route (or harness) as a list of one: a start config may say ``llm_model: qwen``."""
        return [] if v is None else [v] if isinstance(v, str) else v

    @field_validator("retry_on", "no_retry_on")
    @classmethod
    def _classes(cls, v: list[str]) -> list[str]:
        check_classes(v, "failure classes")
        return v

    @model_validator(mode="after")
    def _ray_flags(self) -> JobOptions:
        if self.rerun_launcher_errors and not self.resume:
            raise ValueError("--rerun-launcher-errors is only used with --resume")
        if self.mode != "ray" and self.ray_address is not None:
            raise ValueError("--ray-address is only used with --mode ray")
        if self.gateway_advertise_url is not None and not self.gateway_advertise_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError("--gateway-advertise-url must be an http(s)://HOST:PORT/v1/sessions URL")
        return self

    def grader_job_mode(self) -> Literal["bwrap", "none"]:
        """Where evaluators run: ``grader_isolation``, else as ``sandbox``."""
        return self.grader_isolation or self.sandbox

    def retry_policy(self) -> RetryPolicy:
        """The retry policy these options describe."""
        return RetryPolicy(
            max_retries=self.max_retries,
            backoff_s=self.retry_backoff_s,
            retry_on=frozenset(self.retry_on),
            no_retry_on=frozenset(self.no_retry_on),
        )


@dataclass(frozen=True)
class JobContext:
    """What a job resolved when it started: its id, the gateway's session base URL and the one
    runtimes are given when it differs (``advertise_url``: e.g. as Ray nodes reach it), the
    gateway's API key (None: auth off; sent on the launcher's calls and given to runtimes), every
    route of the job (the first is the breaker's probe default), the installed harnesses by name,
    the folder of the sessions' workspaces and where harness logs go (None: not kept)."""

    job_id: str
    gateway_url: str
    models: tuple[str, ...]
    workspace_root: Path | None = None  # None: the system temp folder
    gateway_api_key: str | None = None
    advertise_url: str | None = None
    harnesses: Mapping[str, InstalledHarness] = field(default_factory=dict)
    log_dir: Path | None = None

    @property
    def session_base_url(self) -> str:
        """The session base URL runtimes are given."""
        return (self.advertise_url or self.gateway_url).rstrip("/")


def flag_help(name: str, model: type[BaseModel] = JobOptions) -> str:
    """The ``--help`` text of ``model``'s field ``name``: its description, and ``(default X)``
    when the field has a plain default the description does not already state."""
    info = model.model_fields[name]
    text = info.description or ""
    default = info.default
    if "default" in text or default is None or isinstance(default, bool) or info.default_factory is not None:
        return text
    return f"{text} (default {default:g})" if isinstance(default, float) else f"{text} (default {default})"
