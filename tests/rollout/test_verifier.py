"""run_verifier: a task's tests/test.sh on a copy of the final workspace, in a real bubblewrap
sandbox of its own. Each attack an agent can mount from its workspace (pytest config, Python start-up
hooks, shadowing executables, its own tests, planted reward files, links) is run for real: the
attack is present in the copy the verifier sees, and the verdict stays the honest one."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import rollout.grading.verifier as verifier
from rollout.core.envs import LimitsConfig
from rollout.grading.verifier import VerifierResult, read_reward, run_verifier, verifier_outcome
from rollout.sandbox.bwrap import SandboxUnavailable
from tests.rollout.sandbox_helpers import require_bwrap

# The task: answer.py's answer() must return 42. Its test imports the agent's module by path and
# runs under pytest, the way Harbor tasks usually do (``pytest /tests/test_*.py``, cwd = the workspace).
TEST_PY = """
import importlib.util

def test_answer():
    spec = importlib.util.spec_from_file_location("answer", "/workspace/answer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.answer() == 42
"""
TEST_SH = """#!/bin/bash
echo "workspace holds: $(ls -A /workspace | tr '\\n' ' ')"
if python3 -m pytest -q -p no:cacheprovider /tests/test_answer.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
WRONG = "def answer():\n    return 41\n"
RIGHT = "def answer():\n    return 42\n"
CHEAT_SCRIPT = "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\necho '1 passed'\nexit 0\n"


@pytest.fixture(autouse=True)
def _bwrap() -> None:
    require_bwrap()


@pytest.fixture
def scratch_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The system temp folder of this test: what the verifier leaves behind is seen there."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    assert list(root.iterdir()) == []  # nothing left behind


def task(tmp_path: Path, test_sh: str = TEST_SH) -> Path:
    tests = tmp_path / "task" / "tests"  # (the caller's tmp_path may be a sub-folder to make)
    tests.mkdir(parents=True)
    (tests / "test.sh").write_text(test_sh)
    (tests / "test_answer.py").write_text(TEST_PY)
    return tests


def workspace(tmp_path: Path, answer: str = WRONG) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(parents=True)
    (ws / "answer.py").write_text(answer)
    return ws


def executable(path: Path, text: str = CHEAT_SCRIPT) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


async def verify(ws: Path, tests: Path, timeout_s: float = 120, **kw: object) -> VerifierResult:
    return await run_verifier(ws, tests, timeout_s=timeout_s, **kw)  # type: ignore[arg-type]


async def test_honest_answers_are_rewarded_and_wrong_ones_not(tmp_path: Path, scratch_root: Path) -> None:
    tests = task(tmp_path)
    right = await verify(workspace(tmp_path / "a", RIGHT), tests)
    wrong = await verify(workspace(tmp_path / "b", WRONG), tests)
    assert (right.status, right.reward, right.exit_code) == ("rewarded", 1.0, 0), right
    assert (wrong.status, wrong.reward) == ("rewarded", 0.0), wrong
    assert "1 passed" in right.stdout_tail and "1 failed" in wrong.stdout_tail
    assert right.workspace_copy["files"] == 1 and right.duration_s > 0
    assert verifier_outcome(right).model_dump(include={"status", "score"}) == {
        "status": "scored",
        "score": 10.0,
    }
    assert verifier_outcome(wrong).model_dump(include={"status", "score"}) == {
        "status": "scored",
        "score": 0.0,
    }


async def test_pytest_config_files_in_the_workspace_do_not_change_the_verdict(
    tmp_path: Path, scratch_root: Path
) -> None:
    ws = workspace(tmp_path)
    # a conftest.py that turns every test report into a pass, and ini files that load it / skip tests
    (ws / "conftest.py").write_text(
        "import pytest\n"
        "@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n"
        "    outcome.get_result().outcome = 'passed'\n"
        "def pytest_sessionfinish(session, exitstatus):\n"
        "    session.exitstatus = 0\n"
    )
    (ws / "pytest.ini").write_text("[pytest]\naddopts = -p conftest --co\n")
    (ws / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-p conftest --co'\n")
    (ws / "tox.ini").write_text("[pytest]\naddopts = --co\n")
    (ws / "setup.cfg").write_text("[tool:pytest]\naddopts = --co\n")
    out = await verify(ws, task(tmp_path))
    assert (
        "pytest.ini" in out.stdout_tail
    )  # the ini files are there (pytest reads none of them on /tests/...)
    assert out.workspace_copy["stripped"] == ["conftest.py: a conftest.py outside the task's tests"]
    assert (out.status, out.reward) == ("rewarded", 0.0), out
    assert "1 failed" in out.stdout_tail


async def test_python_start_up_hooks_in_the_workspace_do_not_run(tmp_path: Path, scratch_root: Path) -> None:
    ws = workspace(tmp_path)
    hook = "import os\nopen('/logs/verifier/reward.txt', 'w').write('1')\nos._exit(0)\n"
    for folder in (
        ws,
        ws / ".local" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages",
    ):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "sitecustomize.py").write_text(hook)
        (folder / "usercustomize.py").write_text(hook)
        (folder / "evil.pth").write_text("import os; os._exit(0)\n")
    (ws / "pytest.py").write_text(hook)  # `python -m pytest` with the cwd first on sys.path
    (ws / "_pytest").mkdir()
    (ws / "_pytest" / "__init__.py").write_text(hook)
    out = await verify(ws, task(tmp_path))
    site = f".local/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    assert out.workspace_copy["stripped"] == [
        f"{site}/evil.pth: a .pth file (run by Python at start-up)",
        f"{site}/sitecustomize.py: a Python start-up hook",
        f"{site}/usercustomize.py: a Python start-up hook",
        "_pytest/__init__.py: makes _pytest/ a package shadowing the module _pytest (the cwd is first on sys.path)",
        "evil.pth: a .pth file (run by Python at start-up)",
        "pytest.py: shadows pytest",
        "sitecustomize.py: a Python start-up hook",
        "usercustomize.py: a Python start-up hook",
    ]
    assert (out.status, out.reward) == ("rewarded", 0.0), out
    kept = out.for_evaluator()["workspace_copy"]  # the manifest goes with the verdict into the store
    assert (kept["stripped_count"], kept["stripped"]) == (8, out.workspace_copy["stripped"])


async def test_shadowing_executables_in_the_workspace_are_not_run(tmp_path: Path, scratch_root: Path) -> None:
    ws = workspace(tmp_path)
    for folder in (ws, ws / "bin", ws / ".local" / "bin", ws / "node_modules" / ".bin"):
        for name in ("python", "python3", "pytest", "bash", "sh", "echo"):
            executable(folder / name)
    out = await verify(ws, task(tmp_path))
    assert len(out.workspace_copy["stripped"]) == 4 * 6 - 4  # echo is no shadow: it stays, and runs not
    assert (
        "echo" in out.stdout_tail
        and "node_modules/.bin/python3: an executable shadowing python3" in out.workspace_copy["stripped"]
    )
    assert (out.status, out.reward) == ("rewarded", 0.0), out


# Harbor's common test line: cd to the workspace, `python -m pytest` on the task's tests, which
# import the agent's module from the cwd.
IMPORTING_TEST_PY = "from answer import answer\n\ndef test_answer():\n    assert answer() == 42\n"
COMMON_SH = (
    "#!/bin/bash\ncd /workspace && python3 -m pytest -q -p no:cacheprovider /tests/test_answer.py "
    "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
)


async def test_the_common_harbor_line_imports_the_agents_module_from_the_cwd(
    tmp_path: Path, scratch_root: Path
) -> None:
    tests = task(tmp_path, COMMON_SH)
    (tests / "test_answer.py").write_text(IMPORTING_TEST_PY)
    right = await verify(workspace(tmp_path / "a", RIGHT), tests)
    wrong = await verify(workspace(tmp_path / "b", WRONG), tests)
    assert (right.status, right.reward) == ("rewarded", 1.0), right
    assert (wrong.status, wrong.reward) == ("rewarded", 0.0), wrong
    assert right.workspace_copy["stripped"] == []


async def test_plugins_and_packages_the_test_tools_load_from_the_cwd_are_stripped(
    tmp_path: Path, scratch_root: Path
) -> None:
    """pytest loads every ``pytest11`` entry point it finds on ``sys.path`` (the cwd first): a
    distribution's metadata in the workspace is a plugin; and a package named as one the tools
    import (``anyio``: an installed pytest plugin) is imported from the cwd."""
    tests = task(tmp_path, COMMON_SH)
    (tests / "test_answer.py").write_text(IMPORTING_TEST_PY)
    ws = workspace(tmp_path)
    hook = "import os\nos._exit(0)\n"
    for meta in ("zz-1.0.dist-info", "yy-1.0.EGG-INFO"):  # importlib.metadata matches either case
        (ws / meta).mkdir()
        (ws / meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta[:2]}\nVersion: 1.0\n")
        (ws / meta / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: {meta[:2]}\nVersion: 1.0\n")
        (ws / meta / "entry_points.txt").write_text(f"[pytest11]\n{meta[:2]} = zzplugin\n")
    (ws / "zzplugin.py").write_text(hook)
    (ws / "anyio").mkdir()
    (ws / "anyio" / "__init__.py").write_text(hook)
    out = await verify(ws, tests)
    assert (out.status, out.reward) == ("rewarded", 0.0), out
    assert out.workspace_copy["stripped"] == [
        "anyio/__init__.py: makes anyio/ a package shadowing the module anyio (the cwd is first on sys.path)",
        *(
            f"{meta}/entry_points.txt: a distribution's entry points on sys.path (tools load the plugins they name)"
            for meta in ("yy-1.0.EGG-INFO", "zz-1.0.dist-info")
        ),
    ]
    assert (out.status, out.reward) == ("rewarded", 0.0), out
    assert "1 failed" in out.stdout_tail


READS_A_FILE_PY = "def test_out():\n    assert open('/workspace/out.txt').read() == '42'\n"


async def test_a_module_pytest_looks_for_and_never_finds_is_stripped(
    tmp_path: Path, scratch_root: Path
) -> None:
    """pytest's start-up imports ``copy``, which tries ``org.python.core`` (Jython): a module that
    is installed nowhere, found in the cwd first; the tests here import nothing of the agent's."""
    tests = task(tmp_path, COMMON_SH)
    (tests / "test_answer.py").write_text(READS_A_FILE_PY)
    ws = workspace(tmp_path)
    (ws / "out.txt").write_text("41")
    (ws / "org.py").write_text("import os\nos._exit(0)\n")
    out = await verify(ws, tests)
    assert (out.status, out.reward) == ("rewarded", 0.0), out
    assert out.workspace_copy["stripped"] == ["org.py: shadows the module org (the cwd is first on sys.path)"]


async def test_an_agents_module_named_as_a_package_of_the_launchers_environment_stays(
    tmp_path: Path, scratch_root: Path
) -> None:
    """On the host's tools only what the tools import is guarded, not every package the launcher's
    environment holds: an agent's own ``semver.py`` (a package installed there, never imported by
    pytest) is the module the tests import, as it would be in the task's container."""
    pytest.importorskip("semver")
    tests = task(tmp_path, COMMON_SH)
    (tests / "test_answer.py").write_text(
        "from semver import bump\n\ndef test_bump():\n    assert bump('1.2') == '1.3'\n"
    )
    ws = workspace(tmp_path)
    (ws / "semver.py").write_text(
        "def bump(v):\n    major, minor = v.split('.')\n    return f'{major}.{int(minor) + 1}'\n"
    )
    out = await verify(ws, tests)
    assert (out.status, out.reward, out.workspace_copy["stripped"]) == ("rewarded", 1.0, []), out


GIT_STATUS_SH = "#!/bin/bash\ncd /workspace && git status --short\n" + COMMON_SH.split("\n", 1)[1]
FIX_SH = "#!/bin/sh\nprintf 'def answer():\\n    return 42\\n' > /workspace/answer.py\n"
"""A program that makes the answer right: what git must never run for the agent."""


def git_workspace(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """The task (a test script that runs ``git status`` in the workspace first) and a wrong
    answer committed in a git repository; the git command line for it."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    tests = task(tmp_path, GIT_STATUS_SH)
    (tests / "test_answer.py").write_text(IMPORTING_TEST_PY)
    ws = workspace(tmp_path)
    git = ["git", "-C", str(ws), "-c", "user.name=a", "-c", "user.email=a@b"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "answer.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "start"], check=True)
    return tests, ws, git


async def test_a_git_folder_pointing_at_another_for_its_config_runs_nothing(
    tmp_path: Path, scratch_root: Path
) -> None:
    """A ``.git`` that holds only ``HEAD`` and ``commondir`` (a worktree's layout): git reads the
    config of the folder ``commondir`` names, which may name a program; that pointer is stripped."""
    tests, ws, _ = git_workspace(tmp_path)
    (ws / ".git").rename(ws / "c")
    (ws / ".git").mkdir()
    for name in ("HEAD", "index"):
        shutil.move(ws / "c" / name, ws / ".git" / name)  # c/ no git folder of its own: git needs none
    (ws / ".git" / "commondir").write_text("../c\n")
    executable(ws / "c" / "fsm", FIX_SH)
    with (ws / "c" / "config").open("a") as f:
        f.write("[core]\n\tfsmonitor = /workspace/c/fsm\n")
    out = await verify(ws, tests)
    assert (out.status, out.reward) == ("rewarded", 0.0), out
    assert (
        ".git/commondir: git's configuration or hooks (git runs the programs they name)"
        in out.workspace_copy["stripped"]
    )


async def test_git_runs_no_program_the_agent_named_in_its_repository(
    tmp_path: Path, scratch_root: Path
) -> None:
    """A test script that runs git in the workspace: the repository's config (``core.fsmonitor``)
    and hooks are the agent's, stripped from the copy; git works on without them."""
    tests, ws, git = git_workspace(tmp_path)
    executable(ws / ".git" / "fsm", FIX_SH)  # git runs it at `git status`: the answer made right
    subprocess.run([*git, "config", "core.fsmonitor", "/workspace/.git/fsm"], check=True)
    executable(ws / ".git" / "hooks" / "post-checkout", FIX_SH)
    out = await verify(ws, tests)
    assert (out.status, out.reward) == ("rewarded", 0.0), out
    why = "git's configuration or hooks (git runs the programs they name)"
    assert f".git/config: {why}" in out.workspace_copy["stripped"]
    assert f".git/hooks/post-checkout: {why}" in out.workspace_copy["stripped"]
    assert all(f.startswith((".git/config: ", ".git/hooks/")) for f in out.workspace_copy["stripped"])
    assert (out.status, out.reward) == ("rewarded", 0.0), out
    assert "1 failed" in out.stdout_tail


async def test_hooks_in_the_copy_are_stripped_and_listed_unless_the_task_started_with_them(
    tmp_path: Path, scratch_root: Path
) -> None:
    tests = task(tmp_path, COMMON_SH)
    (tests / "test_answer.py").write_text(IMPORTING_TEST_PY)
    ws = workspace(tmp_path)
    hook = "import os\nopen('/logs/verifier/reward.txt', 'w').write('1')\nos._exit(0)\n"
    for rel in (
        "conftest.py",
        "lib/conftest.py",
        "sitecustomize.py",
        "usercustomize.py",
        "pytest.py",
        "argparse.py",
        "pluggy/__init__.py",
        "lib/evil.pth",
        "own.py",
        "html/index.html",
    ):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(hook)
    executable(ws / "bin" / "python3")
    executable(ws / "bash")
    (ws / "python").write_text("not executable: kept\n")
    baseline = tmp_path / "start"
    (baseline / "lib").mkdir(parents=True)
    (baseline / "lib" / "conftest.py").write_text(hook)  # the task's own file, unchanged: kept
    (baseline / "conftest.py").write_text("# the task's, changed by the agent\n")
    out = await verify(ws, tests, baseline=baseline)
    assert (out.status, out.reward) == ("rewarded", 0.0), out
    assert out.workspace_copy["stripped"] == [
        "argparse.py: shadows the module argparse (the cwd is first on sys.path)",
        "bash: an executable shadowing bash",
        "bin/python3: an executable shadowing python3",
        "conftest.py: a conftest.py outside the task's tests",
        "lib/evil.pth: a .pth file (run by Python at start-up)",
        "pluggy/__init__.py: makes pluggy/ a package shadowing the module pluggy (the cwd is first on sys.path)",
        "pytest.py: shadows pytest",
        "sitecustomize.py: a Python start-up hook",
        "usercustomize.py: a Python start-up hook",
    ]
    assert sorted(p.relative_to(ws).as_posix() for p in ws.rglob("*") if p.is_file()) == [
        "answer.py",
        "argparse.py",
        "bash",
        "bin/python3",
        "conftest.py",
        "html/index.html",
        "lib/conftest.py",
        "lib/evil.pth",
        "own.py",
        "pluggy/__init__.py",
        "pytest.py",
        "python",
        "sitecustomize.py",
        "usercustomize.py",
    ]  # the workspace itself is untouched
    assert (await verify(workspace(tmp_path / "r", RIGHT), tests)).reward == 1.0


async def test_the_agents_own_tests_and_planted_rewards_are_not_used(
    tmp_path: Path, scratch_root: Path
) -> None:
    ws = workspace(tmp_path)
    executable(ws / "tests" / "test.sh")
    (ws / "tests" / "test_answer.py").write_text("def test_answer():\n    pass\n")
    (ws / "reward.txt").write_text("1")
    (ws / "logs" / "verifier").mkdir(parents=True)
    (ws / "logs" / "verifier" / "reward.txt").write_text("1")
    out = await verify(ws, task(tmp_path))
    assert (out.status, out.reward) == ("rewarded", 0.0), out


async def test_the_tests_are_read_only_and_the_workspace_copy_changes_nothing(
    tmp_path: Path, scratch_root: Path
) -> None:
    tests = task(
        tmp_path,
        "#!/bin/bash\n"
        "echo hacked > /tests/test.sh || echo 'tests: read-only'\n"
        "rm -rf /workspace/* && echo 'workspace copy emptied'\n"
        "echo 0.5 > /logs/verifier/reward.txt\n",
    )
    ws = workspace(tmp_path, RIGHT)
    out = await verify(ws, tests)
    assert (out.status, out.reward) == ("rewarded", 0.5), out
    assert "tests: read-only" in out.stdout_tail and "workspace copy emptied" in out.stdout_tail
    assert (
        (tests / "test.sh").read_text().startswith("#!/bin/bash\necho hacked")
    )  # the task's file, untouched
    assert (ws / "answer.py").read_text() == RIGHT  # the session's workspace, untouched


async def test_links_out_of_the_workspace_are_not_copied(tmp_path: Path, scratch_root: Path) -> None:
    host_file = tmp_path / "host_answer.py"
    host_file.write_text(RIGHT)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "answer.py").symlink_to(host_file)  # the right answer, but a host file: not the agent's work
    os.mkfifo(ws / "fifo")
    out = await verify(ws, task(tmp_path))
    assert (out.status, out.reward) == ("rewarded", 0.0), out
    assert out.workspace_copy["skipped"] == ["answer.py: link", "fifo: fifo"]


async def test_the_environment_is_clean_and_the_toolchain_the_hosts(
    tmp_path: Path, scratch_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/workspace")
    monkeypatch.setenv("PYTEST_ADDOPTS", "--co")
    monkeypatch.setenv("SECRET_TOKEN", "s3cret")
    monkeypatch.setenv("PATH", f"/workspace:.:{os.environ['PATH']}")
    tests = task(
        tmp_path,
        "#!/bin/bash\nenv | sort\ncommand -v python3\n"
        "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 3)' "
        "|| echo 'no network'\necho 1 > /logs/verifier/reward.txt\n",
    )
    out = await verify(workspace(tmp_path), tests)
    env = dict(line.split("=", 1) for line in out.stdout_tail.splitlines() if "=" in line)
    assert {k: env.get(k) for k in ("PYTHONSAFEPATH", "PYTHONNOUSERSITE", "HOME")} == {
        "PYTHONSAFEPATH": None,
        "PYTHONNOUSERSITE": "1",
        "HOME": "/tmp",
    }  # the cwd is on sys.path
    assert "PYTHONPATH" not in env and "PYTEST_ADDOPTS" not in env and "SECRET_TOKEN" not in env
    assert all(p.startswith("/") and not p.startswith("/workspace") for p in env["PATH"].split(":")), env[
        "PATH"
    ]
    assert f"{os.path.dirname(sys.executable)}/python3" in out.stdout_tail
    assert "no network" in out.stdout_tail


async def test_a_reward_file_that_is_a_link_is_not_followed(tmp_path: Path, scratch_root: Path) -> None:
    host_one = tmp_path / "one.txt"
    host_one.write_text("1")
    tests = task(tmp_path, f"#!/bin/bash\nln -s {host_one} /logs/verifier/reward.txt\n")
    out = await verify(workspace(tmp_path), tests)
    assert (out.status, out.reward) == ("no_reward", None), out
    assert "reward.txt cannot be read" in (out.reason or "")


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, (None, "neither")),
        ({"reward.txt": "abc"}, (None, "does not hold a finite number")),
        ({"reward.txt": "nan"}, (None, "does not hold a finite number")),
        ({"reward.txt": " 0.25\n"}, (0.25, "reward.txt")),
        ({"reward.json": '{"reward": 0.75, "tests": 4}'}, (0.75, "reward.json")),
        ({"reward.json": '{"accuracy": 0.5, "name": "x"}'}, (0.5, "only number")),
        ({"reward.json": '{"a": 1, "b": 0}'}, (None, "not exactly one number")),
        ({"reward.json": "[1]"}, (None, "not a JSON object")),
        ({"reward.json": '{"reward": true}'}, (None, "not a finite number")),
    ],
)
def test_read_reward(tmp_path: Path, files: dict[str, str], expected: tuple[float | None, str]) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    reward, _, how = read_reward(tmp_path)
    assert reward == expected[0] and expected[1] in how


DEEP = '{"x": ' + "[" * 900 + "]" * 900 + "}"


@pytest.mark.parametrize("deep", ["[" * 60000, DEEP, '{"reward": 1, "x": ' + "[" * 32 + "]" * 32 + "}"])
def test_a_reward_json_too_deep_is_no_object_and_no_error(tmp_path: Path, deep: str) -> None:
    """The code under test writes ``reward.json``: one deeper than the parser recurses, or than the
    evaluator's copy may nest, is not kept (the reward is reward.txt's, else none), never an error."""
    (tmp_path / "reward.json").write_text(deep)
    assert read_reward(tmp_path) == (None, None, "reward.json is not a JSON object (of at most 32 levels)")
    (tmp_path / "reward.txt").write_text("0\n")
    reward, parsed, how = read_reward(tmp_path)
    assert (reward, parsed, how) == (0.0, None, "read from reward.txt")
    result = VerifierResult(status="rewarded", reward=reward, reward_json=parsed, duration_s=1.0)
    assert result.for_evaluator()["reward_json"] is None
    assert verifier_outcome(result).model_dump(include={"status", "score"}) == {
        "status": "scored",
        "score": 0.0,
    }
    (tmp_path / "reward.json").write_text(
        '{"reward": 1, "x": ' + "[" * 31 + "]" * 31 + "}"
    )  # 32 levels: kept
    assert read_reward(tmp_path)[1] is not None


def test_read_reward_refuses_fifos_and_huge_files(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "reward.txt")
    assert read_reward(tmp_path)[0] is None and "not a regular file" in read_reward(tmp_path)[2]
    (tmp_path / "reward.txt").unlink()
    (tmp_path / "reward.txt").write_text("1" + " " * 100_000)
    assert read_reward(tmp_path)[0] is None and "over" in read_reward(tmp_path)[2]


async def test_no_reward_is_the_agents_zero(tmp_path: Path, scratch_root: Path) -> None:
    out = await verify(workspace(tmp_path), task(tmp_path, "#!/bin/bash\necho crashed >&2\nexit 3\n"))
    assert (out.status, out.reward, out.exit_code) == ("no_reward", None, 3), out
    assert "crashed" in out.stderr_tail
    assert verifier_outcome(out).model_dump(include={"status", "score"}) == {"status": "scored", "score": 0.0}


async def test_a_reward_under_1_says_how_the_tests_output_ended(tmp_path: Path, scratch_root: Path) -> None:
    """A test script that needed the network scores 0; the reason shows why without the database."""
    script = (
        "#!/bin/bash\necho 'installing uv'\necho 'bash: line 3: curl: command not found' >&2\n"
        "echo 0 > /logs/verifier/reward.txt\n"
    )
    out = await verify(workspace(tmp_path / "a"), task(tmp_path / "a", script))
    assert out.reason == (
        "read from reward.txt (exit code 0); the tests' output ends: bash: line 3: curl: command not found"
    )
    right = await verify(workspace(tmp_path / "b", RIGHT), task(tmp_path / "b"))
    assert right.reward == 1.0 and right.reason == "read from reward.txt (exit code 0)"


async def test_a_timeout_kills_everything_and_is_a_grading_failure(
    tmp_path: Path, scratch_root: Path
) -> None:
    marker = str(900_000 + uuid.uuid4().int % 90_000)
    tests = task(
        tmp_path,
        f"#!/bin/bash\nsetsid sleep {marker} &\nnohup sleep {marker} &\n"
        "echo 1 > /logs/verifier/reward.txt\nsleep 600\n",
    )
    out = await verify(workspace(tmp_path), tests, timeout_s=3)
    assert out.status == "timeout" and out.reward is None, out
    assert "timed out after 3 s" in (out.reason or "")
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"sleep {marker}" not in left
    assert verifier_outcome(out).model_dump(include={"status", "score"}) == {
        "status": "timeout",
        "score": 0.0,
    }


async def test_limits_apply(tmp_path: Path, scratch_root: Path) -> None:
    tests = task(
        tmp_path, "#!/bin/bash\nhead -c 3000000 /dev/zero | tr '\\0' x\necho 1 > /logs/verifier/reward.txt\n"
    )
    out = await verify(workspace(tmp_path), tests, limits=LimitsConfig(output_mb=1))
    assert (out.status, out.limit_exceeded, out.reward) == ("no_reward", "output", None), out
    cpu = task(
        tmp_path / "cpu", "#!/bin/bash\npython3 -c 'while True: pass'\necho $? > /logs/verifier/reward.txt\n"
    )
    spun = await verify(workspace(tmp_path / "cpu"), cpu, cpu_s=1)
    assert (spun.status, spun.reward) == ("rewarded", 128 + 9), spun  # SIGKILL at the CPU-time limit


async def test_setup_failures(tmp_path: Path, scratch_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_script = tmp_path / "empty_tests"
    no_script.mkdir()
    out = await verify(workspace(tmp_path), no_script)
    assert out.status == "setup_failed" and "test.sh is missing" in (out.reason or "")

    def unavailable() -> None:
        raise SandboxUnavailable("bubblewrap is not installed")

    monkeypatch.setattr(verifier, "sandbox_support", unavailable)
    out = await verify(tmp_path / "ws", task(tmp_path))
    assert out.status == "setup_failed" and "bubblewrap is not installed" in (out.reason or "")
    assert verifier_outcome(out).status == "error"


async def test_an_unreadable_folder_left_by_the_verifier_is_removed(
    tmp_path: Path, scratch_root: Path
) -> None:
    tests = task(
        tmp_path,
        "#!/bin/bash\nmkdir -p /workspace/locked/deep && touch /workspace/locked/deep/f\n"
        "chmod 000 /workspace/locked/deep /workspace/locked\necho 1 > /logs/verifier/reward.txt\n",
    )
    out = await verify(workspace(tmp_path), tests)
    assert out.status == "rewarded", out
    # scratch_root's teardown asserts nothing is left
    assert not any(stat.S_ISDIR(p.stat().st_mode) for p in scratch_root.iterdir())


DEEP_TREE = "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n"


async def test_a_tree_deeper_than_rmtree_recurses_left_by_the_code_under_test_is_removed(
    tmp_path: Path, scratch_root: Path
) -> None:
    """3000 nested folders (past Python's recursion limit) written in the verifier's workspace:
    the verdict stands and the scratch folder is removed (shutil.rmtree raised RecursionError,
    which ended the session as a launcher error: excluded)."""
    tests = task(tmp_path, f'#!/bin/bash\npython3 -c "{DEEP_TREE}"\necho 0 > /logs/verifier/reward.txt\n')
    out = await verify(workspace(tmp_path), tests)
    assert (out.status, out.reward) == ("rewarded", 0.0), out
    # scratch_root's teardown asserts nothing is left


async def test_a_workspace_the_disk_check_cannot_measure_is_the_agents_limit(
    tmp_path: Path, scratch_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder the code under test made unreadable (for a launcher that is not root: same user)
    stops the disk check: a limit hit, the agent's 0, as in its session; never ``setup_failed``."""

    def unreadable(folder: Path, stop_above: int | None = None) -> None:
        raise PermissionError(13, "Permission denied: folder 'x'")

    monkeypatch.setattr(verifier, "disk_used", unreadable)
    tests = task(tmp_path, "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    out = await verify(workspace(tmp_path), tests, limits=LimitsConfig(disk_mb=64))
    assert (out.status, out.limit_exceeded, out.reward) == ("no_reward", "disk", None), out
    assert (
        out.reason
        == "disk limit: the verifier's workspace cannot be measured (Permission denied: folder 'x')"
    )
    assert verifier_outcome(out).model_dump(include={"status", "score"}) == {"status": "scored", "score": 0.0}


async def test_a_workspace_that_cannot_be_read_is_graded_on_nothing(
    tmp_path: Path, scratch_root: Path
) -> None:
    tests = task(tmp_path, "#!/bin/bash\nls -A /workspace | wc -l\necho 0 > /logs/verifier/reward.txt\n")
    out = await verify(tmp_path / "missing", tests)  # (as root, a mode-000 folder would still be readable)
    assert (out.status, out.reward) == ("rewarded", 0.0), out
    assert out.workspace_copy["complete"] is False and out.workspace_copy["skipped"][0].startswith(
        ".: the workspace cannot be read"
    )


async def test_a_script_killed_by_a_signal_gives_no_reward(tmp_path: Path, scratch_root: Path) -> None:
    tests = task(tmp_path, "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\nkill -9 $$\n")
    out = await verify(workspace(tmp_path), tests)
    assert (out.status, out.reward, out.exit_code) == ("no_reward", None, 137), out
    assert "killed" in (out.reason or "")


FIX_MEDIAN = Path(__file__).resolve().parents[2] / "env" / "harbor_tasks" / "tasks" / "fix_median"
CLAIM = "open('/logs/verifier/reward.txt', 'w').write('1')\n"
HOSTILE = {
    "exit_0_on_import": "import os\nos._exit(0)\n",
    "claims_then_wrong": CLAIM + "def median(values):\n    return values[0]\n",
    "kills_its_checker": CLAIM + "import os\nos.kill(os.getppid(), 9)\n",
    "kills_everything": CLAIM + "import os\nos.kill(-1, 9)\n",
    "leaves_a_rewriter": CLAIM
    + (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        for _ in range(1200):\n"
        "            open('/logs/verifier/reward.txt', 'w').write('1')\n"
        "            time.sleep(0.05)\n"
        "    os._exit(0)\n"
        "def median(values):\n    return sorted(values)[len(values) // 2]\n"
    ),
    "hangs": "import time\ntime.sleep(3600)\n",
    # a fork storm (each member forks two and exits) whose members keep renaming a 1 onto the reward
    "fork_storm_rewriter": (
        "import os\n"
        "def median(values):\n    return values[len(values) // 2]\n"
        "if os.path.isdir('/logs/verifier') and os.fork() == 0:\n"
        "    os.setsid()\n"
        "    null = os.open('/dev/null', os.O_RDWR)\n"
        "    for fd in (0, 1, 2):\n"
        "        os.dup2(null, fd)\n"
        "    while True:\n"
        "        kids = 0\n"
        "        for _ in range(2):\n"
        "            try:\n"
        "                if os.fork() == 0:\n"
        "                    kids = -1\n"
        "                    break\n"
        "                kids += 1\n"
        "            except OSError:\n"
        "                pass\n"
        "        if kids > 0:\n"
        "            os._exit(0)\n"
        "        try:\n"
        "            tmp = f'/logs/verifier/.r{os.getpid()}'\n"
        "            open(tmp, 'w').write('1')\n"
        "            os.rename(tmp, '/logs/verifier/reward.txt')\n"
        "        except OSError:\n"
        "            pass\n"
    ),
}


@pytest.mark.parametrize("attack", sorted(HOSTILE))
async def test_the_bundled_bug_fix_checker_holds_against_hostile_code(
    tmp_path: Path, scratch_root: Path, attack: str
) -> None:
    ws = workspace(tmp_path, HOSTILE[attack])
    (ws / "stats.py").write_text(HOSTILE[attack])
    out = await verify(ws, FIX_MEDIAN / "tests")
    assert out.reward in (0.0, None) and out.status in ("rewarded", "no_reward"), out


async def test_the_bundled_bug_fix_scores_its_reference_solution(tmp_path: Path, scratch_root: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(FIX_MEDIAN / "environment", ws)
    before = await verify(ws, FIX_MEDIAN / "tests")
    subprocess.run(["bash", str(FIX_MEDIAN / "solution" / "solve.sh")], cwd=ws, check=True)
    after = await verify(ws, FIX_MEDIAN / "tests")
    assert (before.status, before.reward) == ("rewarded", 0.0), before
    assert (after.status, after.reward) == ("rewarded", 1.0), after


# The code under test, run by test.sh, tries what would let it change the verdict of the script
# (bash) that runs it and of the sandbox's forwarder (whose exit status says whether the script was
# killed): open their fds, their memory, trace them. It prints what it got.
PROBE = r"""
import ctypes, os

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def probe(pid):
    opened = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            os.close(os.open(f"/proc/{pid}/fd/{name}", os.O_RDONLY | os.O_NONBLOCK))
            opened += 1
        except OSError:
            pass
    seen = [f"fds opened {opened}"]
    try:
        with open(f"/proc/{pid}/mem", "r+b"):
            seen.append("mem opened")
    except OSError as e:
        seen.append(f"mem {type(e).__name__}")
    if libc.ptrace(0x4206, pid, None, None) == 0:  # PTRACE_SEIZE
        libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
        seen.append("ptrace attached")
    else:
        seen.append(f"ptrace {os.strerror(ctypes.get_errno())}")
    return "; ".join(seen)


script = os.getppid()
print(f"script: {probe(script)} | forwarder: {probe(parent_of(script))}")
"""


async def test_the_code_under_test_cannot_trace_the_script_or_the_forwarder(
    tmp_path: Path, scratch_root: Path
) -> None:
    ws = workspace(tmp_path)
    (ws / "probe.py").write_text(PROBE)
    out = await verify(
        ws, task(tmp_path, "#!/bin/bash\npython3 /workspace/probe.py\necho 0 > /logs/verifier/reward.txt\n")
    )
    assert (out.status, out.reward) == ("rewarded", 0.0), out
    assert out.stdout_tail.strip() == (
        "script: fds opened 0; mem PermissionError; ptrace Operation not permitted | "
        "forwarder: fds opened 0; mem PermissionError; ptrace Operation not permitted"
    ), out.stdout_tail
