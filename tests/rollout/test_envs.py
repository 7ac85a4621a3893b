"""Env configs and dataset expansion."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rollout.core.envs import EnvConfigError, case_of, discover_envs, load_cases, load_env_config


def _write_env(root: Path, name: str, cfg: str, rows: list[dict] | None = None) -> Path:  # type: ignore[type-arg]
    d = root / name
    (d / "data").mkdir(parents=True)
    (d / "env.yaml").write_text(cfg)
    if rows is not None:
        (d / "data" / "cases.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    return d


BASE = "dataset: {path: data/cases.jsonl, hidden_fields: [answer]}\nruntime: {command: ['{python}', '{env_dir}/rt.py']}\n"


def test_jsonl_cases_use_line_index_and_hide_fields(tmp_path: Path) -> None:
    d = _write_env(
        tmp_path,
        "math",
        BASE,
        [{"question": "1+1", "answer": "#### 2"}, {"question": "2+2", "answer": "#### 4"}],
    )
    cfg = load_env_config(d / "env.yaml")
    assert cfg.name == "math" and cfg.dataset_path() == (d / "data" / "cases.jsonl").resolve()
    assert cfg.command() == [sys.executable, f"{d.resolve()}/rt.py"]
    cases = load_cases(cfg)
    assert [c.case_id for c in cases] == ["0", "1"]
    assert cases[1].row == {"question": "2+2", "answer": "#### 4"}
    assert cases[1].public_row() == {"question": "2+2"}
    assert [c.case_id for c in load_cases(cfg, limit=1)] == ["0"]


def test_id_field_and_duplicates(tmp_path: Path) -> None:
    cfg_text = BASE.replace("hidden_fields", "id_field: id, hidden_fields")
    d = _write_env(tmp_path, "e", cfg_text, [{"id": "x"}, {"id": "x"}])
    with pytest.raises(EnvConfigError, match="duplicate case id 'x'"):
        load_cases(load_env_config(d / "env.yaml"))
    (d / "data" / "cases.jsonl").write_text('{"id": "x"}\n{"nope": 1}\n')
    with pytest.raises(EnvConfigError, match=r"cases.jsonl:2: row has no id field 'id'"):
        load_cases(load_env_config(d / "env.yaml"))
    for bad in ("null", '{"x": 1}', "true", '""', "[1]", "1.5"):  # not made into 'None', "{'x': 1}", 'True'
        (d / "data" / "cases.jsonl").write_text(f'{{"id": 7}}\n{{"id": {bad}}}\n')
        with pytest.raises(EnvConfigError) as e:
            load_cases(load_env_config(d / "env.yaml"))
        assert str(e.value) == (
            f"{d / 'data' / 'cases.jsonl'}:2: the id field 'id' must be a non-empty string or "
            f"an integer, not {bad}"
        )
    (d / "data" / "cases.jsonl").write_text('{"id": 7}\n{"id": "django/django-1"}\n')
    assert [c.case_id for c in load_cases(load_env_config(d / "env.yaml"))] == ["7", "django/django-1"]
    (d / "data" / "cases.jsonl").write_text("\n")
    with pytest.raises(
        EnvConfigError, match=f"^env e: its dataset {d / 'data' / 'cases.jsonl'} has no case$"
    ):
        load_cases(load_env_config(d / "env.yaml"))


def test_bad_lines_and_typos_name_the_file(tmp_path: Path) -> None:
    d = _write_env(tmp_path, "e", BASE, [])
    (d / "data" / "cases.jsonl").write_text('{"a": 1}\nnot json\n')
    with pytest.raises(EnvConfigError, match=r"cases.jsonl:2: not valid JSON"):
        load_cases(load_env_config(d / "env.yaml"))
    (d / "env.yaml").write_text(BASE + "max_step: 3\n")
    with pytest.raises(EnvConfigError, match="max_step"):
        load_env_config(d / "env.yaml")


def test_task_dirs(tmp_path: Path) -> None:
    d = _write_env(tmp_path, "ws", "dataset: {format: task_dirs, path: tasks}\nruntime: {command: [x]}\n")
    t = d / "tasks" / "t1"
    (t / "files").mkdir(parents=True)
    (t / "instruction.md").write_text("do it")
    (t / "expected.json").write_text('{"n": 3}')
    (d / "tasks" / "t2").mkdir()
    (d / "tasks" / "t2" / "instruction.md").write_text("no expected")
    with pytest.raises(EnvConfigError, match="t2 needs instruction.md and expected.json"):
        load_cases(load_env_config(d / "env.yaml"))
    for bad in ("{}", "[1, 2]", '"x"'):  # nothing to match, or never matchable: refused, naming the file
        (d / "tasks" / "t2" / "expected.json").write_text(bad)
        with pytest.raises(EnvConfigError) as e:
            load_cases(load_env_config(d / "env.yaml"))
        assert str(e.value) == (
            f"{d / 'tasks' / 't2' / 'expected.json'}: an expected.json must be a non-empty "
            f"JSON object (the keys outputs/answer.json must match), not {bad}"
        )
    (d / "tasks" / "t2" / "expected.json").write_text('{"m": 1}')
    c1, c2 = load_cases(load_env_config(d / "env.yaml"))
    assert (c1.case_id, c1.row["expected"], c1.files_dir) == ("t1", {"n": 3}, str(t / "files"))
    assert c1.public_row() == {"id": "t1", "instruction": "do it"}
    assert c2.files_dir is None
    # the launcher rebuilds a session's case from the row its session keeps: the same case
    cfg = load_env_config(d / "env.yaml")
    assert [case_of(cfg, c.case_id, json.loads(json.dumps(c.row))) for c in (c1, c2)] == [c1, c2]


@pytest.mark.parametrize("where", ["inside", "itself"])
def test_a_link_in_a_tasks_files_is_refused_never_followed(tmp_path: Path, where: str) -> None:
    d = _write_env(tmp_path, "ws", "dataset: {format: task_dirs, path: tasks}\nruntime: {command: [x]}\n")
    t = d / "tasks" / "t1"
    t.mkdir(parents=True)
    (t / "instruction.md").write_text("do it")
    (t / "expected.json").write_text('{"n": 3}')
    if where == "inside":  # a link to the hidden answer would be copied into the workspace as a file
        (t / "files" / "sub").mkdir(parents=True)
        (t / "files" / "sub" / "shared.json").symlink_to(t / "expected.json")
        link = t / "files" / "sub" / "shared.json"
    else:
        (t / "files").symlink_to("/etc")
        link = t / "files"
    with pytest.raises(EnvConfigError, match=f"{link} is a symbolic link: a task's files are copied as data"):
        load_cases(load_env_config(d / "env.yaml"))


def test_a_session_case_is_the_row_it_was_planned_with(tmp_path: Path) -> None:
    from rollout.core.plan import session_case, session_rows

    d = _write_env(
        tmp_path,
        "e",
        BASE.replace("hidden_fields", "id_field: id, hidden_fields"),
        [{"id": "x", "q": "2+2", "answer": "4"}],
    )
    cfg = load_env_config(d / "env.yaml")
    [row] = session_rows("j", "m", [(cfg, load_cases(cfg))], 1, None)
    (d / "data" / "cases.jsonl").write_text('{"id": "x", "q": "edited later", "answer": "5"}\n')
    case = session_case(cfg, row)
    assert (case.case_id, case.row, case.public_row()) == (
        "x",
        {"id": "x", "q": "2+2", "answer": "4"},
        {"id": "x", "q": "2+2"},
    )
    with pytest.raises(ValueError, match=f"session {row.session_id}: its row keeps no dataset row"):
        session_case(cfg, row.model_copy(update={"env_params": {}}))


def test_discover_envs(tmp_path: Path) -> None:
    with pytest.raises(EnvConfigError, match="no env found"):
        discover_envs(tmp_path)
    _write_env(tmp_path, "b", BASE, [])
    _write_env(tmp_path, "a", BASE, [])
    assert [c.name for c in discover_envs(tmp_path)] == ["a", "b"]


def test_env_group_size_is_the_default_samples_per_case(tmp_path: Path) -> None:
    from rollout.core.plan import session_rows

    one, four = tmp_path / "one", tmp_path / "four"
    for folder, extra in ((one, ""), (four, "group_size: 4\n")):
        (folder / "data").mkdir(parents=True)
        (folder / "data" / "cases.jsonl").write_text('{"q": 1}\n{"q": 2}\n')
        (folder / "env.yaml").write_text(
            "dataset: {path: data/cases.jsonl}\nruntime: {command: [x]}\n" + extra
        )
    envs = [
        (cfg, load_cases(cfg))
        for cfg in (load_env_config(one / "env.yaml"), load_env_config(four / "env.yaml"))
    ]
    rows = session_rows("j", "m", envs, None, None)
    assert [(r.env_name, r.case_id, r.sample_index) for r in rows if r.env_name == "four"] == [
        ("four", c, k) for c in ("0", "1") for k in range(4)
    ]
    assert [(r.case_id, r.sample_index) for r in rows if r.env_name == "one"] == [("0", 0), ("1", 0)]
    assert len({r.group_id for r in rows if r.env_name == "four" and r.case_id == "0"}) == 1
    # --rl-group-size, when given, applies to every env
    assert len(session_rows("j", "m", envs, 2, None)) == 2 * 2 * 2
    with pytest.raises(EnvConfigError, match="group_size"):
        (four / "env.yaml").write_text(
            "dataset: {path: data/cases.jsonl}\nruntime: {command: [x]}\ngroup_size: 0\n"
        )
        load_env_config(four / "env.yaml")


def test_a_broken_env_folder_not_asked_for_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rollout.core.setup import SetupError
    from rollout.jobs.options import JobOptions
    from rollout.jobs.prepare import load_envs

    for name in ("a", "b"):
        (_write_env(tmp_path, name, BASE, [{"id": "1"}]) / "rt.py").write_text("print()\n")
    _write_env(tmp_path, "c", "name: c\ndataset: [unclosed\n", [])  # not valid YAML

    def envs(*names: str) -> list[str]:
        opts = JobOptions.model_validate(
            {"agent_root": tmp_path, "gateway_config": tmp_path / "gw.yaml", "env_names": list(names)}
        )
        return [cfg.name for cfg, _ in load_envs(opts)]

    assert envs("b") == ["b"]
    err = "\n".join(r.getMessage() for r in caplog.records if r.name == "rollout.notice")
    assert (
        err.startswith("warning: skipped an env that does not load (not asked for by --env): ")
        and f"{tmp_path / 'c' / 'env.yaml'}" in err
    ), err
    with pytest.raises(SetupError, match=f"{tmp_path / 'c' / 'env.yaml'}"):
        envs("b", "zz")  # perhaps the broken one is the env asked for: its error, not a silent skip
    with pytest.raises(SetupError, match=f"{tmp_path / 'c' / 'env.yaml'}"):
        envs()  # every env asked for


def test_case_ids_no_utf8_carries_are_escaped_as_stored(tmp_path: Path) -> None:
    """A lone surrogate or NUL in a JSONL id, and a task folder whose name is not UTF-8: the case
    id is escaped as its text column stores it (so ``--resume`` finds it again); the row keeps
    the value exactly; two ids equal once escaped are duplicates."""
    cfg_text = BASE.replace("hidden_fields", "id_field: id, hidden_fields")
    d = _write_env(tmp_path, "e", cfg_text, [{"id": "a\ud800"}, {"id": "b\x00"}])
    a, b = load_cases(load_env_config(d / "env.yaml"))
    assert (a.case_id, b.case_id) == ("a\\ud800", "b\\u0000")
    assert (a.row["id"], b.row["id"]) == ("a\ud800", "b\x00")
    d2 = _write_env(tmp_path, "dup", cfg_text, [{"id": "a\ud800"}, {"id": "a\\ud800"}])
    with pytest.raises(EnvConfigError, match="duplicate case id"):
        load_cases(load_env_config(d2 / "env.yaml"))
    t = _write_env(tmp_path, "ws", "dataset: {format: task_dirs, path: tasks}\nruntime: {command: [x]}\n")
    task = t / "tasks" / (b"t\xff".decode("utf-8", "surrogateescape"))
    task.mkdir(parents=True)
    (task / "instruction.md").write_text("do it")
    (task / "expected.json").write_text('{"n": 1}')
    (c,) = load_cases(load_env_config(t / "env.yaml"))
    assert c.case_id == "t\\udcff" and c.row["id"] == "t\udcff"


def test_a_harbor_env_without_a_runtime_gets_the_one_tasks_gives_it(tmp_path: Path) -> None:
    """An env.yaml of Harbor tasks needs no ``runtime:``: the bundled bash agent with
    ``answer_file: false``, as ``--tasks DIR`` runs them; other formats still need one."""
    from rollout.core.envs import task_folder_env

    tasks = Path(__file__).resolve().parents[2] / "env" / "harbor_tasks" / "tasks"
    folder = tmp_path / "hb"
    folder.mkdir()
    (folder / "env.yaml").write_text(
        f"dataset: {{format: harbor, path: {tasks}}}\nparams: {{max_tokens: 64}}\n"
    )
    cfg = load_env_config(folder / "env.yaml")
    flag = task_folder_env(tasks)
    assert cfg.runtime == flag.runtime and cfg.runtime.command == ["{python}", "-m", "env.task_runtime"]
    assert cfg.params == {"answer_file": False, "max_tokens": 64}
    (folder / "env.yaml").write_text(
        f"dataset: {{format: harbor, path: {tasks}}}\nparams: {{answer_file: true}}\n"
    )
    assert load_env_config(folder / "env.yaml").params == {"answer_file": True}
    assert [c.case_id for c in load_cases(cfg)] == [c.case_id for c in load_cases(flag)]
    (folder / "env.yaml").write_text(  # its limits alone: the same runtime with them
        f"dataset: {{format: harbor, path: {tasks}}}\nruntime: {{timeout_s: 60, limits: {{disk_mb: 64}}}}\n"
    )
    limited = load_env_config(folder / "env.yaml")
    assert limited.runtime.command == ["{python}", "-m", "env.task_runtime"]
    assert (limited.runtime.timeout_s, limited.runtime.limits.disk_mb) == (60, 64)
    (folder / "env.yaml").write_text("dataset: {format: jsonl, path: cases.jsonl}\n")
    with pytest.raises(EnvConfigError, match="runtime: required key missing"):
        load_env_config(folder / "env.yaml")
    (folder / "env.yaml").write_text(
        "dataset: {format: jsonl, path: cases.jsonl}\nruntime: {timeout_s: 60}\n"
    )
    with pytest.raises(EnvConfigError, match="runtime.command: required key missing"):
        load_env_config(folder / "env.yaml")


def test_a_tasks_folder_mixing_harbor_and_expected_json_tasks_says_so(tmp_path: Path) -> None:
    """``--tasks DIR`` runs one kind of task: a folder holding both kinds is refused, naming them
    (read as Harbor's, the other kind's tasks were each an error blaming a missing task.toml)."""
    from rollout.core.envs import task_folder_env

    for name in ("h1", "h2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "task.toml").write_text("")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "expected.json").write_text("{}")
    with pytest.raises(
        EnvConfigError,
        match=r"mixes Harbor tasks \(task.toml: h1, h2\) and expected.json tasks \(plain\): one kind per folder",
    ):
        task_folder_env(tmp_path)
    (tmp_path / "plain" / "expected.json").unlink()
    assert task_folder_env(tmp_path).dataset.format == "harbor"
