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
from rollout.jobs.breaker import BreakerSettings
from rollout.sandbox.harness_cache import InstalledHarness
from store import JOB_ID_PATTERN, MAX_INT


class JobOptions(BaseModel):
    """Everything a job needs (the launcher's flags, validated). Seconds for timeouts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent_root: Path = Path("env")
    agent_configs: list[Path] = Field(default_factory=list)
    agent_start_config: Path | None = None  # a Safactory start YAML: how its task YAML's envs start
    env_names: list[str] = Field(default_factory=list)
    case_ids: list[str] = Field(default_factory=list)  # only these case ids (of any env); empty: all
    tasks: list[Path] = Field(default_factory=list)  # folders of task folders, each run as one env
    host_toolchain: bool = False  # the tasks folders' Harbor tasks run on the host's tools
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # per session; None: the env's
    gateway_base_url: str | None = None
    gateway_config: Path
    llm_model: list[str] = Field(default_factory=list)
    harness: list[str] = Field(default_factory=list)
    llm_temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    enable_evaluation: bool = False
    eval_timeout: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    db_path: str = "sqlite://env_trajs.db"
    pool_size: int = Field(default=4, ge=1)
    rl_group_size: int | None = Field(default=None, ge=1, le=MAX_GROUP_SIZE)  # None: each env's group_size
    max_steps: int | None = Field(default=None, ge=-1, le=MAX_INT)
    limit: int | None = Field(default=None, ge=1)
    job_id: str | None = Field(default=None, pattern=JOB_ID_PATTERN)  # it names folders and files
    resume: bool = False
    rerun_launcher_errors: bool = False
    mode: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    gateway_advertise_url: str | None = None
    sandbox: Literal["bwrap", "none"] = "bwrap"
    grader_isolation: Literal["bwrap", "none"] | None = None  # None: as ``sandbox``
    out: Path | None = None
    keep_workspaces: bool = False
    max_retries: int = Field(default=2, ge=0)
    retry_backoff_s: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    retry_on: list[str] = Field(default_factory=lambda: sorted(DEFAULT_RETRY_ON))
    no_retry_on: list[str] = Field(default_factory=list)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    max_broken_graders: int = Field(default=1, ge=0)  # stop at this many broken-grader findings; 0: never
    image: list[str] = Field(default_factory=list)  # the image map: REF=LOCAL (docs/images.md)

    @field_validator("image")
    @classmethod
    def _image_map(cls, v: list[str]) -> list[str]:
        for item in v:
            ref, sep, local = item.partition("=")
            if not sep or not ref.strip() or not local.strip():
                raise ValueError(f"--image {item!r}: expected REF=LOCAL (e.g. python:3=localhost/my/python:3)")
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
        if self.gateway_advertise_url is not None and not self.gateway_advertise_url.startswith(("http://", "https://")):
            raise ValueError("--gateway-advertise-url must be an http(s)://HOST:PORT/v1/sessions URL")
        return self

    def grader_job_mode(self) -> Literal["bwrap", "none"]:
        """Where evaluators run: ``grader_isolation``, else as ``sandbox``."""
        return self.grader_isolation or self.sandbox

    def retry_policy(self) -> RetryPolicy:
        """The retry policy these options describe."""
        return RetryPolicy(max_retries=self.max_retries, backoff_s=self.retry_backoff_s,
                           retry_on=frozenset(self.retry_on), no_retry_on=frozenset(self.no_retry_on))


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
