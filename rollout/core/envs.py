"""Env configs (``env/<name>/env.yaml``) and their datasets, expanded into cases.

An env config is strict (unknown keys are errors). Paths are relative to the config file's folder.
Datasets are JSONL files (one case per line; the case id is ``id_field`` of the row, else the line
index), task directories (``tasks/<id>/instruction.md``, ``expected.json``, optional ``files/``)
or Harbor task directories (``rollout.core.harbor``, docs/verifiers.md).
"""

from __future__ import annotations

import difflib
import json
import logging
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from rollout.core import harbor
from rollout.errors import RolloutError
from wire.text import column_text

CONFIG_NAME = "env.yaml"
log = logging.getLogger(__name__)
MAX_GROUP_SIZE = 10_000
"""Samples per case at most (an env's ``group_size``, ``--rl-group-size``, a batch's ``samples``)."""


class EnvConfigError(RolloutError, ValueError):
    """An env config or its dataset cannot be read or is invalid (the message names the file)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatasetConfig(_Strict):
    """Where the cases come from. ``hidden_fields`` are removed from the case row that the runtime
    sees (``env_params["dataset"]``); the evaluator sees the full row. ``host_toolchain`` (Harbor
    format only): run the tasks whose environment names a container image on the host's tools.
    ``same_container`` (Harbor format only): a task in an image is verified on the agent's own
    copy-on-write layer (what it wrote anywhere in the image), as Harbor does; every record says so."""

    format: Literal["jsonl", "task_dirs", "harbor"] = "jsonl"
    path: str
    id_field: str | None = None
    hidden_fields: list[str] = Field(default_factory=list)
    host_toolchain: bool = False
    same_container: bool = False

    @model_validator(mode="after")
    def _toolchain_for_harbor(self) -> DatasetConfig:
        for key in ("host_toolchain", "same_container"):
            if getattr(self, key) and self.format != "harbor":
                raise ValueError(f"dataset.{key} applies to format: harbor only")
        if self.host_toolchain and self.same_container:
            raise ValueError(SAME_CONTAINER_ON_HOST)
        return self


class LimitsConfig(_Strict):
    """Per-session resource limits (None: no limit). ``memory_mb`` (MiB, the session's processes
    together), ``processes`` (at once, the sandbox's own helpers included), ``output_mb`` (MiB of
    stdout + stderr), ``disk_mb`` (MiB: the workspace's total size, any single file, and the
    size of the private ``/tmp``), ``max_files`` (entries in the workspace: files, folders,
    links). See docs/sandbox.md for how each is enforced."""

    memory_mb: int | None = Field(default=4096, ge=32, le=1 << 40)
    processes: int | None = Field(default=512, ge=8)
    output_mb: int | None = Field(default=64, ge=1)
    disk_mb: int | None = Field(default=4096, ge=1, le=1 << 40)
    max_files: int | None = Field(default=100_000, ge=1)


class ResourcesConfig(_Strict):
    """What one session asks of a node in ``--mode ray`` (Ray resource requests; ``--mode local``
    ignores them: there ``--pool-size`` alone decides). ``num_cpus``: CPUs (fractions allowed),
    ``memory_mb``: MiB of Ray's ``memory`` resource (None: none asked)."""

    num_cpus: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    memory_mb: int | None = Field(default=None, ge=1)


def variable_problem(name: str, value: str) -> str | None:
    """Why ``name=value`` cannot be an environment variable (None: it can): a name empty or holding
    ``=`` or NUL, a value holding NUL (in bwrap's NUL-separated ``--args`` it would be options)."""
    if not name or "=" in name or "\0" in name:
        return f"the variable name {name[:80]!r} is empty or holds '=' or a NUL byte"
    if "\0" in value:
        return f"the variable {name[:80]!r} holds a NUL byte"
    return None


class RuntimeConfig(_Strict):
    """How to run one session: ``command`` (``{python}`` = the launcher's interpreter, ``{env_dir}``
    = the env folder), extra environment variables (``env``: name -> value; ``pass_env``: names
    copied from the launcher's environment when set), the session timeout in seconds, resource
    ``limits`` and ``sandbox`` (``none`` runs this env's runtimes without isolation; default: the
    launcher's ``--sandbox``) and the ``resources`` a session asks of a Ray node.
    ``safactory_env``: also give the runtime the ``SAFACTORY_*`` variables Safactory's runners
    read (on for the envs of a Safactory task config, docs/envs.md)."""

    command: list[str]
    timeout_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    env: dict[str, str] = Field(default_factory=dict)
    pass_env: list[str] = Field(default_factory=list)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    sandbox: Literal["bwrap", "none"] | None = None
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    safactory_env: bool = False

    @field_validator("env")
    @classmethod
    def _variables(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            why = variable_problem(name, value)
            if why is not None:
                raise ValueError(why)
        return v


DEFAULT_ARCHIVE_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_ARCHIVE_MAX_FILES = 10_000


class WorkspaceArchiveConfig(_Strict):
    """What of a session's final workspace is kept with the session, for a regrade to hand to the
    evaluator (``rollout.jobs.workspace_archive``, docs/regrade.md). ``paths``: files or folders
    relative to the workspace (e.g. ``[outputs]``), None for the whole workspace. ``max_bytes``:
    cap on the kept regular files' total size (uncompressed bytes), ``max_files`` on their number;
    a workspace over a cap is not kept at all. ``enabled: false`` keeps nothing (the env's
    sessions then cannot be regraded)."""

    enabled: bool = True
    paths: list[str] | None = None
    max_bytes: int = Field(default=DEFAULT_ARCHIVE_MAX_BYTES, gt=0)
    max_files: int = Field(default=DEFAULT_ARCHIVE_MAX_FILES, gt=0)

    @field_validator("paths")
    @classmethod
    def _relative(cls, paths: list[str] | None) -> list[str] | None:
        if paths is None:
            return None
        out: list[str] = []
        for p in paths:
            parts = Path(p).parts
            if not p.strip() or Path(p).is_absolute() or ".." in parts:
                raise ValueError(
                    f"workspace_archive.paths: {p!r} must be a path inside the workspace "
                    "(relative, without '..')"
                )
            out.append(Path(p).as_posix().rstrip("/"))
        return out


class GraderConfig(_Strict):
    """Where the env's evaluator runs (docs/grading.md): ``isolation`` ``bwrap`` (the grader
    sandbox) or ``none`` (a thread of the launcher: for trusted graders only, flagged in every
    record); None follows the job (``--grader-isolation``, else its ``--sandbox``). The sandbox's
    memory (MiB) and process caps."""

    isolation: Literal["bwrap", "none"] | None = None
    memory_mb: int = Field(default=2048, ge=64)
    processes: int = Field(default=64, ge=4)


class EnvConfig(_Strict):
    """One env: name, dataset, runtime, public params (merged into ``env_params``), default step
    budget (``max_steps``, -1 unlimited), samples per case when the job sets none (``group_size``),
    an optional case limit and what of the final workspace is kept for a regrade (``workspace_archive``).
    ``evaluation``: ``required`` (with ``--enable-evaluation`` the env must have an evaluator, or
    be a Harbor env) or ``none`` (the env is not graded: no evaluator, no verifier, reward NULL).
    ``image``: a container image every session runs in (docs/images.md); ``images``: the image
    map, reference -> local reference (an env's image, a task's, a Dockerfile's ``FROM``);
    ``workdir``: where the workspace is in the image (default: the image's WORKDIR); without an
    image, the workspace is also bound there (``/workspace`` stays the cwd)."""

    name: str
    description: str = ""
    dataset: DatasetConfig
    runtime: RuntimeConfig
    params: dict[str, Any] = Field(default_factory=dict)
    max_steps: int = -1
    group_size: int = Field(default=1, ge=1, le=MAX_GROUP_SIZE)
    limit: int | None = Field(default=None, ge=1)
    workspace_archive: WorkspaceArchiveConfig = Field(default_factory=WorkspaceArchiveConfig)
    grader: GraderConfig = Field(default_factory=GraderConfig)
    evaluation: Literal["required", "none"] = "required"
    image: str | None = Field(default=None, min_length=1)
    images: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = Field(default=None, pattern=r"^/")
    # resolved at load time
    env_dir: Path = Field(default=Path("."), exclude=True)
    config_path: Path = Field(default=Path("."), exclude=True)
    _tasks_flag: bool = PrivateAttr(default=False)  # set by task_folder_env only, never by a file
    _evaluator: Path | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _harbor_runtime(cls, data: Any) -> Any:
        """A Harbor env without ``runtime`` or without ``runtime.command`` (its limits or timeout set
        alone): the runtime ``--tasks`` gives Harbor tasks (the bundled bash agent, ``answer_file:
        false`` unless its params say otherwise)."""
        if not isinstance(data, dict):
            return data
        runtime = data.get("runtime")
        if runtime is not None and not (isinstance(runtime, dict) and "command" not in runtime):
            return data
        dataset = data.get("dataset")
        fmt = dataset.get("format") if isinstance(dataset, dict) else getattr(dataset, "format", None)
        if fmt != "harbor":
            return data
        params = data.get("params", {})
        if isinstance(params, dict):
            params = {"answer_file": False, **params}
        return {**data, "runtime": {**(runtime or {}), "command": list(TASK_RUNTIME)}, "params": params}

    @property
    def from_tasks_flag(self) -> bool:
        """Whether ``--tasks`` made this config (``task_folder_env``): its evaluator is its own."""
        return self._tasks_flag

    @property
    def own_evaluator(self) -> Path | None:
        """A ``--tasks`` env's evaluator: the bundled expected.json grader, None for Harbor tasks
        (their tests grade them)."""
        return self._evaluator

    def dataset_path(self) -> Path:
        """The dataset path, resolved against the config folder."""
        p = Path(self.dataset.path).expanduser()
        return p if p.is_absolute() else (self.env_dir / p).resolve()

    def hidden_paths(self) -> list[Path]:
        """Paths of the env folder a runtime must never see: the dataset (file or task folder)
        and the conventional ``data/`` and ``tasks/`` folders."""
        return [self.dataset_path(), self.env_dir / "data", self.env_dir / "tasks"]

    def command(self) -> list[str]:
        """The runtime command with ``{python}`` and ``{env_dir}`` substituted."""
        return [
            a.replace("{python}", sys.executable).replace("{env_dir}", str(self.env_dir))
            for a in self.runtime.command
        ]

    def missing_runtime_files(self) -> list[str]:
        """Arguments of the runtime command that name a path under ``{env_dir}`` that does not
        exist (a typo in env.yaml: every session would fail the same way)."""
        return [
            a.replace("{env_dir}", str(self.env_dir))
            for a in self.runtime.command
            if a.startswith("{env_dir}") and not Path(a.replace("{env_dir}", str(self.env_dir))).exists()
        ]


class Case(BaseModel):
    """One dataset row of an env. ``row`` is the full row (what the evaluator sees);
    ``public_row()`` what the runtime sees. ``files_dir`` is copied into the workspace.
    ``tests_dir`` (a Harbor task's ``tests/``): the verifier run after the agent ends (never
    shown to the agent); ``solution_dir``: its reference solution (the oracle harness's only)."""

    env_name: str
    case_id: str
    row: dict[str, Any]
    hidden_fields: list[str] = Field(default_factory=list)
    files_dir: str | None = None
    tests_dir: str | None = None
    solution_dir: str | None = None

    def public_row(self) -> dict[str, Any]:
        """The row without its hidden fields."""
        return {k: v for k, v in self.row.items() if k not in self.hidden_fields}


def case_of(cfg: EnvConfig, case_id: str, row: dict[str, Any]) -> Case:
    """The case of ``cfg`` with id ``case_id`` and full dataset row ``row`` (as the dataset gives
    it, or as a session row keeps it in ``env_params["dataset"]``): the hidden fields of the env's
    format, and for task folders the ``files_dir`` the row names."""
    if cfg.dataset.format == "harbor":
        paths = {
            k: row.get(k) if isinstance(row.get(k), str) else None
            for k in ("files_dir", "tests_dir", "solution_dir")
        }
        return Case(
            env_name=cfg.name,
            case_id=case_id,
            row=row,
            hidden_fields=sorted({*cfg.dataset.hidden_fields, *harbor.HIDDEN_FIELDS}),
            **paths,
        )
    if cfg.dataset.format == "task_dirs":
        files = row.get("files_dir")
        return Case(
            env_name=cfg.name,
            case_id=case_id,
            row=row,
            hidden_fields=sorted({*cfg.dataset.hidden_fields, "expected", "files_dir"}),
            files_dir=files if isinstance(files, str) else None,
        )
    return Case(env_name=cfg.name, case_id=case_id, row=row, hidden_fields=cfg.dataset.hidden_fields)


def did_you_mean(key: str, valid: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the valid key nearest ``key`` (difflib), else ``""``."""
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def no_such_env(missing: Iterable[str], have: Iterable[str]) -> str:
    """``--env``'s error for env names that are not here: each named, with the nearest name and
    the envs that are."""
    names = sorted(have)
    gone = ", ".join(f"{m!r}{did_you_mean(m, names)}" for m in sorted(missing))
    return f"--env: no such env {gone} (envs here: {', '.join(names) or 'none'})"


def fields_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """The field names of the (nested) model at ``loc`` of ``model`` ([] when not a model): the
    keys valid there, for ``did_you_mean``."""
    for part in loc:
        field = model.model_fields.get(str(part))
        ann = field.annotation if field is not None else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(model.model_fields)


def config_problems(e: ValidationError, model: type[BaseModel]) -> list[str]:
    """One ``key.path: problem`` line per error of ``e`` (validating ``model``): an unknown key
    with the nearest valid one, a missing one, or pydantic's message without its URL."""
    lines = []
    for err in e.errors(include_url=False):
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key{did_you_mean(str(loc[-1]), fields_at(model, loc[:-1]))}")
        elif err["type"] == "missing":
            lines.append(f"{key}: required key missing")
        else:
            lines.append(f"{key}: {str(err['msg']).removeprefix('Value error, ')}")
    return lines


def load_env_config(path: Path) -> EnvConfig:
    """Read one ``env.yaml``. Raises EnvConfigError naming the file and the problem."""
    path = path.resolve()
    try:
        with path.open(encoding="utf-8") as f:  # a YAML error then names the file and line
            raw = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise EnvConfigError(f"cannot read env config {path}: {e}") from e
    if not isinstance(raw, dict):
        raise EnvConfigError(f"env config {path} must be a mapping")
    if "environments" in raw:
        raise EnvConfigError(
            f"{path}: a Safactory task config (environments:): give it with --agent-config "
            "and its start config with --agent-start-config"
        )
    typo = next((k for k in raw if isinstance(k, str) and did_you_mean(k, ["environments"])), None)
    if typo is not None and "dataset" not in raw and "runtime" not in raw:
        raise EnvConfigError(
            f"{path}: {typo}: unknown key (did you mean 'environments'? the envs of a Safactory task config)"
        )
    raw.setdefault("name", path.parent.name)
    try:
        cfg = EnvConfig.model_validate(raw)
    except ValidationError as e:
        raise EnvConfigError("\n".join(f"{path}: {line}" for line in config_problems(e, EnvConfig))) from None
    cfg.env_dir = path.parent
    cfg.config_path = path
    return cfg


TASK_RUNTIME = ["{python}", "-m", "env.task_runtime"]
"""The bundled runtime of task-directory envs (the bash agent)."""
EXPECTED_JSON_EVALUATOR = Path(__file__).resolve().parents[2] / "env" / "workspace" / "rule_evaluator.py"
"""The bundled grader of ``expected.json`` tasks (``outputs/answer.json`` against it)."""


def task_folder_env(folder: Path, host_toolchain: bool = False, same_container: bool = False) -> EnvConfig:
    """The env ``--tasks FOLDER`` runs, without an env.yaml: each sub-folder is a task, Harbor's
    (one holds ``task.toml``: graded by its tests) or ``instruction.md`` + ``expected.json`` +
    ``files/`` (graded by ``EXPECTED_JSON_EVALUATOR``), run by the bundled bash agent (or
    ``--harness``). Named after the folder, or its parent when it is called ``tasks``.
    ``host_toolchain`` (``--host-toolchain``): Harbor tasks run on the host's tools, as
    ``dataset.host_toolchain: true``; ``same_container`` (``--same-container``): as
    ``dataset.same_container: true``. Raises EnvConfigError when the folder does not exist."""
    root = folder.expanduser().resolve()
    if not root.is_dir():
        raise EnvConfigError(f"--tasks {folder}: not a folder")
    if host_toolchain and same_container:
        raise EnvConfigError(f"--tasks {folder}: {SAME_CONTAINER_ON_HOST}")
    folders = sorted(d for d in root.iterdir() if d.is_dir())
    harbor = [d.name for d in folders if (d / "task.toml").is_file()]
    graded = [d.name for d in folders if (d / "expected.json").is_file() and d.name not in harbor]
    if harbor and graded:
        raise EnvConfigError(
            f"--tasks {folder} mixes Harbor tasks (task.toml: {', '.join(harbor[:3])}"
            f"{', ...' if len(harbor) > 3 else ''}) and expected.json tasks ({', '.join(graded[:3])}"
            f"{', ...' if len(graded) > 3 else ''}): one kind per folder"
        )
    harbor_format = bool(harbor)
    name = root.parent.name if root.name == "tasks" and root.parent.name else root.name
    cfg = EnvConfig(
        name=name,
        description=f"the task folders of {root} (--tasks)",
        dataset=DatasetConfig(
            format="harbor" if harbor_format else "task_dirs",
            path=str(root),
            host_toolchain=host_toolchain and harbor_format,
            same_container=same_container and harbor_format,
        ),
        runtime=RuntimeConfig(command=TASK_RUNTIME),
        params={"answer_file": False} if harbor_format else {},
    )
    cfg.env_dir = cfg.config_path = root
    cfg._tasks_flag = True
    if not harbor_format:
        cfg._evaluator = EXPECTED_JSON_EVALUATOR
    return cfg


def scan_envs(agent_root: Path) -> tuple[list[EnvConfig], list[EnvConfigError]]:
    """Every ``<agent_root>/<name>/env.yaml`` that loads, sorted by folder name, and the error of
    each that does not. Raises EnvConfigError when the folder does not exist or holds no env."""
    if not agent_root.is_dir():
        where = "" if agent_root.is_absolute() else f" (in {Path.cwd()})"
        raise EnvConfigError(
            f"agent root {agent_root} is not a directory{where}: run from the project folder or pass --agent-root"
        )
    paths = sorted(agent_root.glob(f"*/{CONFIG_NAME}"))
    if not paths:
        raise EnvConfigError(f"no env found: no {agent_root}/<name>/{CONFIG_NAME}")
    found: list[EnvConfig] = []
    broken: list[EnvConfigError] = []
    for p in paths:
        try:
            found.append(load_env_config(p))
        except EnvConfigError as e:
            broken.append(e)
    return found, broken


def discover_envs(agent_root: Path) -> list[EnvConfig]:
    """Every ``<agent_root>/<name>/env.yaml``, sorted by name. Raises EnvConfigError when the
    folder does not exist, holds no env, or one of them does not load."""
    found, broken = scan_envs(agent_root)
    if broken:
        raise broken[0]
    return found


def load_cases(cfg: EnvConfig, limit: int | None = None) -> list[Case]:
    """Expand an env's dataset into cases (at most ``limit`` or ``cfg.limit``). Raises
    EnvConfigError for a missing file, a line that is not a JSON object, an id that is not a
    non-empty string or an integer, duplicate case ids, a task's ``expected.json`` that is not a
    non-empty JSON object, or no case at all."""
    path = cfg.dataset_path()
    n = limit or cfg.limit
    if cfg.dataset.format == "harbor":
        cases = _harbor(cfg, path)
    else:
        cases = _task_dirs(cfg, path) if cfg.dataset.format == "task_dirs" else _jsonl(cfg, path, n)
    if not cases:
        raise EnvConfigError(f"env {cfg.name}: its dataset {path} has no case")
    if n is not None:
        cases = cases[:n]
    seen: set[str] = set()
    for c in cases:
        if c.case_id in seen:
            raise EnvConfigError(f"{path}: duplicate case id {c.case_id!r}")
        seen.add(c.case_id)
    return cases


def _jsonl(cfg: EnvConfig, path: Path, limit: int | None) -> list[Case]:
    if not path.is_file():
        raise EnvConfigError(f"env {cfg.name}: dataset {path} not found")
    cases: list[Case] = []
    with path.open(encoding="utf-8") as f:
        index = 0
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise EnvConfigError(f"{path}:{lineno}: not valid JSON: {e}") from None
            if not isinstance(row, dict):
                raise EnvConfigError(f"{path}:{lineno}: each line must be a JSON object")
            fid = cfg.dataset.id_field
            if fid is not None and fid not in row:
                raise EnvConfigError(f"{path}:{lineno}: row has no id field {fid!r}")
            if fid is not None and (
                isinstance(row[fid], bool) or not isinstance(row[fid], str | int) or row[fid] == ""
            ):
                raise EnvConfigError(
                    f"{path}:{lineno}: the id field {fid!r} must be a non-empty string or an "
                    f"integer, not {json.dumps(row[fid])}"
                )
            # the id as every text column stores it (a lone surrogate or NUL escaped): one id everywhere
            case_id = column_text(str(row[fid])) if fid is not None else str(index)
            cases.append(case_of(cfg, case_id, row))
            index += 1
            if limit is not None and index >= limit:
                break
    return cases


def _task_dirs(cfg: EnvConfig, root: Path) -> list[Case]:
    if not root.is_dir():
        raise EnvConfigError(f"env {cfg.name}: task folder {root} not found")
    cases: list[Case] = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        instr, exp = d / "instruction.md", d / "expected.json"
        if not instr.is_file() or not exp.is_file():
            raise EnvConfigError(f"task {d} needs instruction.md and expected.json")
        try:
            expected = json.loads(exp.read_text())
        except ValueError as e:
            raise EnvConfigError(f"{exp}: not valid JSON: {e}") from None
        if not isinstance(expected, dict) or not expected:
            raise EnvConfigError(
                f"{exp}: an expected.json must be a non-empty JSON object (the keys "
                f"outputs/answer.json must match), not {json.dumps(expected)[:80]}"
            )
        files = d / "files"
        row = {
            "id": d.name,
            "instruction": instr.read_text(),
            "expected": expected,
            "files_dir": harbor.task_files(files, EnvConfigError),
        }
        cases.append(case_of(cfg, column_text(d.name), row))  # a name that is not UTF-8: its escapes
    return cases


def _harbor(cfg: EnvConfig, root: Path) -> list[Case]:
    try:
        found = harbor.scan(root, cfg.dataset.host_toolchain)
    except harbor.HarborTaskError as e:
        raise EnvConfigError(f"env {cfg.name}: {e}") from None
    for task_id, why in found.skipped:
        log.warning("env %s: Harbor task %s skipped: %s", cfg.name, task_id, why)
    if not found.rows and found.skipped:
        raise EnvConfigError(
            f"env {cfg.name}: every Harbor task in {root} is skipped:\n"
            + "\n".join(skip_lines(found.skipped))
        )
    return [case_of(cfg, row["id"], row) for row in found.rows]


HOST_TOOLCHAIN_ALONE = (
    "--host-toolchain applies to the Harbor tasks of --tasks folders (an env.yaml sets "
    "dataset.host_toolchain: true)"
)
SAME_CONTAINER_ON_HOST = (
    "same-container verification needs tasks in their images: with the host's tools (--host-toolchain, "
    "dataset.host_toolchain) there is no image layer to verify on; choose one"
)
SAME_CONTAINER_ALONE = (
    "--same-container applies to the Harbor tasks of --tasks folders (an env.yaml sets "
    "dataset.same_container: true)"
)


def skip_lines(skipped: list[tuple[str, str]], names: int = 3) -> list[str]:
    """One line per distinct reason of ``skipped`` (``(task, why)``), most tasks first: the count
    and the first ``names`` task names."""
    by_reason: dict[str, list[str]] = {}
    for task, why in skipped:
        by_reason.setdefault(why, []).append(task)
    out = []
    for why, tasks in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(tasks[:names]) + (", ..." if len(tasks) > names else "")
        out.append(f"  {len(tasks)} task{'s' if len(tasks) != 1 else ''} ({shown}): {why}")
    return out


def session_config(cfg: EnvConfig, case: Case, timeout_s: float | None = None) -> EnvConfig:
    """``cfg`` as one session of ``case`` runs it: ``timeout_s`` (the job's ``--timeout``), else a
    Harbor task's own agent timeout (``agent_timeout_s`` of its row), replaces the env's
    ``runtime.timeout_s``. A host-toolchain Harbor task's Dockerfile WORKDIR (its row's
    ``workdir``) is the session's ``workdir``: the workspace is bound there too."""
    workdir = case.row.get("workdir") if cfg.dataset.format == "harbor" else None
    if isinstance(workdir, str):
        cfg = cfg.model_copy(update={"workdir": workdir})
    timeout = (
        timeout_s
        if timeout_s is not None
        else case.row.get("agent_timeout_s")
        if cfg.dataset.format == "harbor"
        else None
    )
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        return cfg
    return cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update={"timeout_s": float(timeout)})})
