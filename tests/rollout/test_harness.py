"""The harness plugin API: discovery by name or folder, checks of HARNESS, the install cache."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rollout.contract.harness import Harness, HarnessContext, HarnessUnavailable
from rollout.sandbox.harness_cache import (
    HARNESS_ROOT,
    STAMP,
    bundled,
    cache_dir,
    cache_root,
    ensure_installed,
    is_installed,
    load_harness,
)

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]


def _plugin(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "harness.py").write_text(textwrap.dedent(body))
    return folder


TINY = """
    from rollout.contract.harness import Harness, HarnessLaunch

    class Tiny(Harness):
        name = "tiny"
        protocol = "responses"
        version = "3"

        def launch(self, ctx):
            return HarnessLaunch(argv=["echo", ctx.model])

    HARNESS = Tiny()
"""


def test_bundled_bash_agent_is_found_by_name() -> None:
    loaded = load_harness("bash-agent")
    assert (loaded.name, loaded.harness.protocol, loaded.folder) == (
        "bash-agent",
        "chat_completions",
        HARNESS_ROOT / "bash-agent",
    )
    assert "bash-agent" in bundled()


def test_bash_agent_launch_follows_the_cli_contract() -> None:
    h = load_harness("bash-agent").harness
    ctx = HarnessContext(
        instruction="do it",
        model="m1",
        session_url="http://127.0.0.1:41800/v1/sessions/s",
        api_key="k",
        workspace="/workspace",
        home="/tmp/h",
        install_dir="/c",
        max_steps=7,
        temperature=0.5,
        params={"max_tokens": 99, "protocol": "text"},
    )
    launch = h.launch(ctx)
    assert launch.argv == [
        sys.executable,
        "-m",
        "env.bash_agent",
        "--model",
        "m1",
        "--instruction-file",
        "/tmp/h/instruction.md",
        "--protocol",
        "text",
        "--max-steps",
        "7",
        "--temperature",
        "0.5",
        "--max-tokens",
        "99",
    ]
    # every flag it sets is one the CLI knows
    from env.bash_agent import build_parser

    assert build_parser().parse_args(launch.argv[3:]).max_tokens == 99
    assert launch.files == {"/tmp/h/instruction.md": "do it"}
    assert launch.env == {"OPENAI_BASE_URL": "http://127.0.0.1:41800/v1/sessions/s", "OPENAI_API_KEY": "k"}
    assert launch.answer_path == "outputs/answer.json"
    unlimited = h.launch(
        ctx.model_copy(
            update={"max_steps": -1, "temperature": None, "params": {"turn_cap": 5, "bash_timeout_s": 3}}
        )
    )
    assert unlimited.argv[9:] == ["--max-steps", "-1", "--bash-timeout", "3", "--turn-cap", "5"]


def test_a_users_harness_is_found_by_its_folder(tmp_path: Path) -> None:
    folder = _plugin(tmp_path / "mine", TINY)
    loaded = load_harness(str(folder))
    assert (loaded.name, loaded.harness.protocol, loaded.harness.version, loaded.folder) == (
        "tiny",
        "responses",
        "3",
        folder.resolve(),
    )


def test_unknown_name_lists_the_bundled_harnesses(tmp_path: Path) -> None:
    _plugin(tmp_path / "one", TINY)
    with pytest.raises(HarnessUnavailable, match=r"no such harness \(bundled: one;"):
        load_harness("nope", root=tmp_path)
    with pytest.raises(HarnessUnavailable, match="no harness.py in"):
        load_harness(str(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("X = 1\n", "defines no HARNESS"),
        ("HARNESS = object()\n", "defines no HARNESS"),
        ("raise RuntimeError('boom')\n", "import failed: RuntimeError: boom"),
        (
            "from rollout.harness import Harness\nclass H(Harness):\n    name = 'has space'\nHARNESS = H()\n",
            "HARNESS.name 'has space'",
        ),
        (
            "from rollout.harness import Harness\nclass H(Harness):\n    name = 'h'\n    protocol = 'grpc'\nHARNESS = H()\n",
            "HARNESS.protocol 'grpc' is not one of",
        ),
    ],
)
def test_a_bad_plugin_is_refused_with_the_reason(tmp_path: Path, body: str, match: str) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "harness.py").write_text(body)
    with pytest.raises(HarnessUnavailable, match=match):
        load_harness(str(folder))


class _Counting(Harness):
    name = "counting"
    version = "1"

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    def install(self, cache_dir: Path) -> None:
        self.calls += 1
        assert list(cache_dir.iterdir()) == []  # always handed an empty folder
        (cache_dir / "bin").mkdir()
        (cache_dir / "bin" / "tool").write_text("#!/bin/sh\n")
        if self.fail:
            raise OSError("network down")


def test_install_runs_once_and_is_stamped(tmp_path: Path) -> None:
    h = _Counting()
    folder = ensure_installed(h, tmp_path)
    assert (
        folder == tmp_path / "counting-1"
        and (folder / STAMP).is_file()
        and (folder / "bin" / "tool").is_file()
    )
    assert ensure_installed(h, tmp_path) == folder
    assert h.calls == 1 and is_installed(h, tmp_path)


def test_a_failed_install_leaves_no_stamp_and_is_tried_again(tmp_path: Path) -> None:
    bad = _Counting(fail=True)
    with pytest.raises(HarnessUnavailable, match="counting: install failed: OSError: network down"):
        ensure_installed(bad, tmp_path)
    assert not cache_dir(bad, tmp_path).exists() and not is_installed(bad, tmp_path)
    half = cache_dir(bad, tmp_path)  # a killed install: files but no stamp
    (half / "junk").mkdir(parents=True)
    good = _Counting()
    ensure_installed(good, tmp_path)
    assert good.calls == 1 and not (half / "junk").exists() and is_installed(good, tmp_path)


def test_harness_unavailable_from_install_keeps_its_message(tmp_path: Path) -> None:
    class NoNpm(Harness):
        name, version = "nonpm", "1"

        def install(self, cache_dir: Path) -> None:
            raise HarnessUnavailable("npm is not installed")

    with pytest.raises(HarnessUnavailable, match="^npm is not installed$"):
        ensure_installed(NoNpm(), tmp_path)
    assert not is_installed(NoNpm(), tmp_path)


def test_cache_root_follows_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROLLOUT_HARNESS_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.delenv("ROLLOUT_HARNESS_CACHE")
    assert cache_root() == Path.home() / ".cache" / "rollout-factory" / "harnesses"


_INSTALLER = """
import sys, time
from pathlib import Path
from rollout.contract.harness import Harness
from rollout.sandbox.harness_cache import ensure_installed

root, log, wait_for, started = (Path(a) for a in sys.argv[1:5])

class Slow(Harness):
    name, version = "slow", "1"
    def install(self, cache_dir):
        with log.open("a") as f:
            f.write("install\\n")
        deadline = time.monotonic() + 120
        while wait_for.name != "-" and not wait_for.exists():  # hold the lock until the other job waits
            if time.monotonic() > deadline:
                raise SystemExit("the other job never started")
            time.sleep(0.02)

started.touch()
print(ensure_installed(Slow(), root))
"""


def test_a_second_job_waits_for_the_first_install_and_does_not_reinstall(tmp_path: Path) -> None:
    script = tmp_path / "installer.py"
    script.write_text(_INSTALLER)
    root, log = tmp_path / "cache", tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # the first job installs, and keeps installing until the second job has started and reached the lock
    first = subprocess.Popen(
        [PY, str(script), str(root), str(log), str(tmp_path / "b-started"), str(tmp_path / "a")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        while not log.exists():  # the first job is inside install(), holding the lock
            assert first.poll() is None, "the first job ended before installing"
            time.sleep(0.01)
        second = subprocess.run(
            [PY, str(script), str(root), str(log), "-", str(tmp_path / "b-started")],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        out, _ = first.communicate(timeout=180)
    finally:
        first.kill()
    assert first.returncode == 0 and second.returncode == 0, second.stderr
    assert out.strip() == second.stdout.strip() == str(root / "slow-1")
    assert log.read_text() == "install\n"  # one install for the two jobs
