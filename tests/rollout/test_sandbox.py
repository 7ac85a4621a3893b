"""The sandbox's pieces: the bwrap command (what is bound, what never is), the clean environment,
the code a runtime needs, the machine check and its messages, cgroup detection and limits on
a cgroup-shaped folder, the env config keys, the report's footer and records."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rollout.jobs.prepare
from rollout.core.envs import EnvConfigError, LimitsConfig
from rollout.core.setup import SetupError
from rollout.jobs.options import JobOptions
from rollout.jobs.prepare import check_sandbox
from rollout.results.report import SessionRecord, table_footer
from rollout.sandbox import cgroups
from rollout.sandbox.bwrap import (
    BRIDGE_SOCKET,
    ETC_ALLOW,
    FORWARDER,
    WORKSPACE,
    Binds,
    SandboxSpec,
    SandboxUnavailable,
    Support,
    bwrap_command,
    clean_env,
    etc_view,
    probe,
    within,
)
from rollout.sandbox.cgroups import Controller, SessionCgroup
from rollout.sandbox.runner import (
    CODE_ROOT,
    CONTRACT,
    ENTRY_BYTES,
    DiskUse,
    code_folders,
    disk_used,
    effective_mode,
    session_env,
    shared_code,
)
from tests.rollout.sandbox_helpers import make_env, require_bwrap


def _binds(argv: list[str]) -> dict[str, tuple[str, str]]:
    """dest -> (kind, src) of every bind in a bwrap command line."""
    out: dict[str, tuple[str, str]] = {}
    for i, a in enumerate(argv):
        if a in ("--ro-bind", "--bind"):
            out[argv[i + 2]] = (a, argv[i + 1])
        if a == "--":
            break
    return out


def test_the_bind_plan_kept_per_process_follows_edits_of_the_folders_and_other_envs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """code_folders and the shared binds are made once per state of what they read: another
    env's env.yaml rewritten in place (its dataset moved), an entry added, a folder swapped for a
    copy with the same modification time: each is seen at the next session."""
    import rollout.sandbox.runner as runner

    monkeypatch.setattr(runner, "CODE_ROOT", tmp_path)
    other = tmp_path / "env" / "other"
    other.mkdir(parents=True)
    (other / "tool.py").write_text("")
    (other / "secret.jsonl").write_text("{}\n")
    run = "runtime: {command: ['{python}', '{env_dir}/tool.py']}\n"
    (other / "env.yaml").write_text("name: other\ndataset: {path: data/cases.jsonl}\n" + run)
    cfg = make_env(tmp_path / "envs", "e", "print(1)")
    cfg = cfg.model_copy(
        update={"runtime": cfg.runtime.model_copy(update={"command": ["{python}", str(other / "tool.py")]})}
    )

    def hidden_of_other() -> list[Path]:
        return next(h for f, h in code_folders(cfg)[0] if f == other)

    assert other / "data" / "cases.jsonl" in hidden_of_other()
    assert other / "secret.jsonl" not in hidden_of_other()
    with open(other / "env.yaml", "r+") as f:  # in place: the folder itself is unchanged
        f.write("name: other\ndataset: {path: secret.jsonl}\n" + run)
        f.truncate()
    assert other / "secret.jsonl" in hidden_of_other()

    def bound(folder: Path) -> set[str]:
        spec = SandboxSpec(tmp_path / "ws", [(folder, [folder / "hidden"])], [], None, 3, None)
        return set(_binds(bwrap_command(Support(bwrap="/usr/bin/bwrap"), spec, ["x"])))

    code = tmp_path / "code"
    code.mkdir()
    (code / "hidden").mkdir()
    (code / "a.py").write_text("")
    assert str(code / "a.py") in bound(code) and str(code / "b.py") not in bound(code)
    (code / "b.py").write_text("")
    assert str(code / "b.py") in bound(code)
    mtime = code.stat().st_mtime_ns
    shutil.move(code, tmp_path / "old")
    shutil.copytree(tmp_path / "old", code)
    (code / "c.py").write_text("")
    os.utime(code, ns=(mtime, mtime))  # a copy with the same modification time, one entry more
    assert str(code / "c.py") in bound(code)


def test_bwrap_command_binds_only_what_a_runtime_may_see(tmp_path: Path) -> None:
    cfg = make_env(tmp_path / "envs", "e", "print(1)", hidden=["answer"])
    (cfg.env_dir / "helper.py").write_text("")
    (cfg.env_dir / "tasks").mkdir()
    folders, files = code_folders(cfg)
    spec = SandboxSpec(
        workspace=tmp_path / "ws",
        code=folders,
        files=[*shared_code(), *files],
        bridge_socket=tmp_path / "gw.sock",
        status_fd=7,
        tmp_bytes=1024,
        rlimits={"fsize": 99},
    )
    argv = bwrap_command(Support(bwrap="/usr/bin/bwrap"), spec, cfg.command())
    binds = _binds(argv)
    assert binds[WORKSPACE] == ("--bind", str(tmp_path / "ws"))  # the only writable bind
    assert [d for d, (kind, _) in binds.items() if kind == "--bind"] == [WORKSPACE]
    assert binds[BRIDGE_SOCKET] == ("--ro-bind", str(tmp_path / "gw.sock"))
    env_dir = str(cfg.env_dir)
    assert binds[f"{env_dir}/runtime.py"][0] == "--ro-bind" and f"{env_dir}/helper.py" in binds
    assert f"{env_dir}/env.yaml" in binds
    assert not [d for d in binds if d.startswith((f"{env_dir}/data", f"{env_dir}/tasks"))]
    assert binds[str(CODE_ROOT / "env" / "runtime_kit.py")][0] == "--ro-bind"
    assert binds[str(CODE_ROOT / "rollout" / "protocol.py")][0] == "--ro-bind"
    assert not [d for d in binds if d in (str(CODE_ROOT), str(CODE_ROOT / "env"), str(CODE_ROOT / "rollout"))]
    assert not [d for d in binds if d.startswith(str(CODE_ROOT / "env" / "workspace"))]  # another env
    assert [d for d in binds if d.startswith("/etc")] == ["/etc"]  # one bind: the allow-listed copy
    view = Path(binds["/etc"][1])
    assert view == etc_view() and (view / "passwd").read_bytes() == Path("/etc/passwd").read_bytes()
    assert (view / "ssl" / "certs").is_dir() and not (view / "ssl" / "private").exists()
    assert {p.name for p in view.iterdir()} <= {n.split("/")[0] for n in ETC_ALLOW}
    assert not {"shadow", "gshadow", "ssh", "sudoers", "pip.conf", "gitconfig"} & {
        p.name for p in view.iterdir()
    }
    assert binds[sys.base_prefix][0] == "--ro-bind"
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"):
        assert flag in argv
    assert argv[argv.index("--uid") + 1] == "65534" and argv[argv.index("--cap-drop") + 1] == "ALL"
    # private /tmp first (a code folder under the host's /tmp is bound on top), its size capped
    assert argv.index("--tmpfs") < argv.index("--ro-bind")
    assert argv[argv.index("--tmpfs") - 2 : argv.index("--tmpfs") + 2] == [
        "--size",
        "1024",
        "--tmpfs",
        "/tmp",
    ]
    tail = argv[argv.index("--") + 1 :]
    assert tail[:4] == [sys.executable, "-I", "-S", FORWARDER]
    assert tail[6:9] == ["7", "fsize=99", "--"] and tail[9:] == cfg.command()


def test_the_bound_code_alone_imports_the_contract(tmp_path: Path) -> None:
    # what a runtime sees of the project: the contract folder and shared_code(), at their places
    shutil.copytree(
        CONTRACT, tmp_path / CONTRACT.relative_to(CODE_ROOT), ignore=shutil.ignore_patterns("__pycache__")
    )
    for f in shared_code():
        (tmp_path / f.relative_to(CODE_ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, tmp_path / f.relative_to(CODE_ROOT))
    modules = [
        "rollout.protocol",
        "rollout.harness",
        *(f"rollout.contract.{p.stem}" for p in sorted(CONTRACT.glob("*.py"))),
    ]
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import importlib, rollout; "
        f"assert rollout.__file__.startswith({str(tmp_path)!r}), rollout.__file__; "
        f"[importlib.import_module(m) for m in {modules!r}]"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def test_a_runtime_file_in_another_env_folder_brings_that_folder_minus_its_data(tmp_path: Path) -> None:
    cfg = make_env(
        tmp_path / "envs",
        "e",
        "",
        runtime_cfg={
            "command": [
                "{python}",
                str(CODE_ROOT / "env" / "gsm8k" / "runtime.py"),
                "/no/such/path",
                "/",
                str(CODE_ROOT),
            ]
        },
    )  # folders named in a command are never bound
    folders, files = code_folders(cfg)
    gsm8k = CODE_ROOT / "env" / "gsm8k"
    assert [f for f, _ in folders] == [cfg.env_dir, gsm8k] and files == []
    spec = SandboxSpec(
        workspace=tmp_path, code=folders, files=[], bridge_socket=tmp_path / "s", status_fd=3, tmp_bytes=None
    )
    binds = _binds(bwrap_command(Support(bwrap="bwrap"), spec, cfg.command()))
    assert str(gsm8k / "runtime.py") in binds and str(gsm8k / "rule_evaluator.py") in binds
    assert not [d for d in binds if d.startswith(str(gsm8k / "data"))]
    assert "/" not in binds and str(CODE_ROOT) not in binds


def test_an_env_folder_inside_a_system_folder_still_hides_its_data(tmp_path: Path) -> None:
    cfg = make_env(tmp_path / "envs", "e", "")
    b = Binds()
    b.ro(tmp_path)  # as if the env lived under /usr
    b.code(cfg.env_dir, cfg.hidden_paths())
    assert b.args[-2:] == ["--tmpfs", str(cfg.env_dir / "data")]


@pytest.mark.parametrize(
    ("path", "folder"),
    [
        ("/usr/lib", "/usr"),
        ("/usr", "/usr"),
        ("/usrx", "/usr"),
        ("/usr", "/usr/lib"),
        ("/a/b", "/"),
        ("/", "/"),
        ("/tmp/a.b/c", "/tmp/a.b"),
        ("/tmp/a.bc", "/tmp/a.b"),
        ("/a", "/a/b/.."),
    ],
)
def test_within_is_is_relative_to(path: str, folder: str) -> None:
    assert within(str(Path(path)), str(Path(folder))) == Path(path).is_relative_to(folder)


def test_clean_env_keeps_the_allow_list_and_the_session_only() -> None:
    source = {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "AWS_SECRET_ACCESS_KEY": "x",
        "GATEWAY_API_KEY": "host-key",
        "HOME": "/root",
        "PYTHONPATH": "/work/repo",
    }
    env = clean_env(session_env("http://127.0.0.1:41800/v1/sessions/s", {"OPENAI_API_KEY": "gw-key"}), source)
    assert env == {
        "PATH": f"{os.path.dirname(sys.executable)}:/usr/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "HOME": "/workspace",
        "TMPDIR": "/tmp",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENAI_BASE_URL": "http://127.0.0.1:41800/v1/sessions/s",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:41800/v1/sessions/s",
        "GATEWAY_BASE_URL": "http://127.0.0.1:41800/v1/sessions/s",
        "OPENAI_API_KEY": "gw-key",
        "ANTHROPIC_API_KEY": "gw-key",
        "GATEWAY_API_KEY": "gw-key",
    }


def test_probe_of_a_missing_or_broken_bwrap_says_how_to_fix_it(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable) as missing:
        probe(bwrap=str(tmp_path / "no-bwrap"))
    assert "apt-get install bubblewrap" in str(missing.value) and "--sandbox none" in str(missing.value)
    with pytest.raises(SandboxUnavailable) as broken:
        probe(bwrap="/bin/false")
    assert "cannot create a sandbox here (exit code 1)" in str(broken.value)
    assert "--sandbox none" in str(broken.value)


def test_probe_finds_a_working_bwrap() -> None:
    support = require_bwrap()
    assert Path(support.bwrap).name == "bwrap"
    assert set(support.mechanisms()) == {"memory", "processes", "cpu", "disk", "files", "output"}


def test_the_job_stops_before_running_anything_without_a_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_env(tmp_path / "envs", "e", "")

    def unavailable() -> Support:
        return probe(bwrap=str(tmp_path / "no-bwrap"))

    monkeypatch.setattr(rollout.jobs.prepare, "sandbox_support", unavailable)
    opts = JobOptions(gateway_config=tmp_path / "gw.yaml")
    with pytest.raises(SetupError, match="apt-get install bubblewrap"):
        check_sandbox(opts, [cfg])
    # opting out needs no bubblewrap, and says so
    check_sandbox(opts.model_copy(update={"sandbox": "none"}), [cfg])
    assert any(
        r.name == "rollout.notice" and r.getMessage().startswith("warning: no sandbox for env(s) e")
        for r in caplog.records
    )
    bare = make_env(tmp_path / "envs", "bare", "", runtime_cfg={"sandbox": "none"})
    assert effective_mode(bare, "bwrap") == "none" and effective_mode(cfg, "bwrap") == "bwrap"
    check_sandbox(opts, [bare])


def test_env_config_limits_and_sandbox_keys(tmp_path: Path) -> None:
    cfg = make_env(
        tmp_path / "envs",
        "e",
        "",
        runtime_cfg={
            "limits": {"memory_mb": 256, "processes": 64, "output_mb": 2, "disk_mb": None},
            "pass_env": ["HF_TOKEN"],
        },
    )
    assert cfg.runtime.limits == LimitsConfig(memory_mb=256, processes=64, output_mb=2, disk_mb=None)
    assert cfg.runtime.pass_env == ["HF_TOKEN"] and cfg.runtime.sandbox is None
    assert LimitsConfig() == LimitsConfig(
        memory_mb=4096, processes=512, output_mb=64, disk_mb=4096, max_files=100_000
    )
    with pytest.raises(EnvConfigError, match="memory_gb"):
        make_env(tmp_path / "envs2", "e", "", runtime_cfg={"limits": {"memory_gb": 1}})
    with pytest.raises(EnvConfigError, match="sandbox"):
        make_env(tmp_path / "envs3", "e", "", runtime_cfg={"sandbox": "docker"})


def _cost(p: Path) -> int:
    st = os.lstat(p)
    return max(st.st_size if stat.S_ISREG(st.st_mode) else 0, st.st_blocks * 512, ENTRY_BYTES)


def test_disk_used_counts_every_entry_never_follows_links_and_stops_early(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 100)
    (tmp_path / "big").write_bytes(b"z" * 100_000)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_bytes(b"y" * 50)
    (tmp_path / "link").symlink_to("/usr")  # a folder outside: never walked into
    (tmp_path / "empty").touch()
    names = ["a", "big", "d", "d/b", "link", "empty"]
    assert disk_used(tmp_path) == DiskUse(sum(_cost(tmp_path / n) for n in names), 6)
    assert _cost(tmp_path / "empty") == ENTRY_BYTES and _cost(tmp_path / "big") >= 100_000
    assert disk_used(tmp_path, stop_above=10).bytes <= ENTRY_BYTES + 100_000 + 8192  # stopped at once
    assert disk_used(tmp_path, max_entries=2).entries == 3


def test_disk_used_counts_empty_folders_and_files(tmp_path: Path) -> None:
    for i in range(200):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"f{i}").touch()
    assert disk_used(tmp_path) == DiskUse(200 * (_cost(tmp_path / "d0") + ENTRY_BYTES), 400)


def test_disk_used_counts_a_tree_deeper_than_path_max(tmp_path: Path) -> None:
    """Paths past PATH_MAX (4096) cannot be named from the top; the walk never needs to."""
    name = "d" * 200
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    depth = 60  # 60 * 201 characters: a path of 12,000
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        big = os.open("deep.bin", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(big, b"q" * (1 << 20))
        os.close(big)
        os.symlink("/", "root-link", dir_fd=fd)
    finally:
        os.close(fd)
    use = disk_used(tmp_path)
    assert use.entries == depth + 2
    assert use.bytes >= (1 << 20) + depth * ENTRY_BYTES
    shutil.rmtree(tmp_path)  # (rmtree walks by descriptors too)


def test_a_folder_that_cannot_be_read_is_an_error_not_zero(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads any folder")
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "f").write_bytes(b"x" * 10_000)
    (tmp_path / "hidden").chmod(0)
    try:
        with pytest.raises(PermissionError, match="folder 'hidden'"):
            disk_used(tmp_path)
    finally:
        (tmp_path / "hidden").chmod(0o700)


MOUNTINFO = """\
30 1 0:26 / {root}/v1mem rw,nosuid shared:9 - cgroup cgroup rw,memory
31 1 0:27 / {root}/v1pids rw,nosuid shared:10 - cgroup cgroup rw,pids
32 1 0:28 / {root}/unified rw,nosuid shared:11 - cgroup2 cgroup2 rw
"""


def test_detect_prefers_a_delegated_cgroup2_and_falls_back_to_v1(tmp_path: Path) -> None:
    for d in ("v1mem/job", "v1pids", "unified/job"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "unified/job/cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "unified/job/cgroup.subtree_control").write_text("memory\n")
    own = "4:memory:/job\n8:pids:/\n0::/job\n"
    found = cgroups.detect(MOUNTINFO.format(root=tmp_path), own)
    assert found == {
        "memory": Controller("memory", 2, tmp_path / "unified/job"),
        "pids": Controller("pids", 1, tmp_path / "v1pids"),
        "cpu": Controller("cpu", 2, tmp_path / "unified/job"),  # available, so enabled for children
    }
    assert (tmp_path / "unified/job/cgroup.subtree_control").read_text() == "+cpu"
    assert found["memory"].mechanism == "cgroup v2 memory.max"
    assert found["pids"].mechanism == "cgroup v1 pids.max"
    assert found["cpu"].mechanism == "cgroup v2 cpu.weight"
    assert cgroups.detect("", "") == {}


def test_session_cgroup_writes_limits_reads_events_and_removes(tmp_path: Path) -> None:
    mem, pids = Controller("memory", 2, tmp_path), Controller("pids", 2, tmp_path)
    cg = SessionCgroup(mem, pids, memory_bytes=64 << 20, max_processes=32)
    cg.create("rollout-s1")
    d = tmp_path / "rollout-s1"
    assert (d / "memory.max").read_text() == str(64 << 20) and (d / "pids.max").read_text() == "32"
    assert cg.procs_files == [f"{d}/cgroup.procs"] and cg.exceeded() is None
    (d / "pids.events").write_text("max 3\n")
    assert cg.exceeded() == "processes"
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
    assert cg.exceeded() == "memory"
    assert not cg.remove_now() and d.exists() and cg.dirs  # not empty: left for remove()
    for f in d.iterdir():  # a real cgroup directory has no files to delete; this fake one does
        f.unlink()
    assert cg.remove(timeout_s=5) and not d.exists()
    again = SessionCgroup(mem, pids, memory_bytes=1 << 20, max_processes=4)
    again.create("rollout-s2")
    for f in (tmp_path / "rollout-s2").iterdir():
        f.unlink()
    assert again.remove_now() and not (tmp_path / "rollout-s2").exists() and not again.dirs


def test_session_cgroup_v1_files(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "p").mkdir()
    cg = SessionCgroup(
        Controller("memory", 1, tmp_path / "m"),
        Controller("pids", 1, tmp_path / "p"),
        memory_bytes=1 << 30,
        max_processes=8,
    )
    cg.create("s")
    assert (tmp_path / "m/s/memory.limit_in_bytes").read_text() == str(1 << 30)
    assert cg.procs_files == [f"{tmp_path}/m/s/cgroup.procs", f"{tmp_path}/p/s/cgroup.procs"]
    (tmp_path / "m/s/memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert cg.exceeded() == "memory"


def test_a_session_cgroup_has_a_cpu_group_of_its_own_with_the_default_weight(tmp_path: Path) -> None:
    for d in ("m", "c"):
        (tmp_path / d).mkdir()
    v1 = Support(
        "bwrap", memory=Controller("memory", 1, tmp_path / "m"), cpu=Controller("cpu", 1, tmp_path / "c")
    )
    cg = v1.session_cgroup(1 << 30, None)
    cg.create("s")
    assert cg.procs_files == [f"{tmp_path}/m/s/cgroup.procs", f"{tmp_path}/c/s/cgroup.procs"]
    assert sorted(p.name for p in (tmp_path / "c/s").iterdir()) == []  # no weight written: all equal
    assert v1.mechanisms()["cpu"] == "an equal share per session: cgroup v1 cpu.shares"
    v2 = Support("bwrap", pids=Controller("pids", 2, tmp_path), cpu=Controller("cpu", 2, tmp_path))
    both = v2.session_cgroup(None, 16)
    both.create("t")
    assert both.dirs == {"pids": tmp_path / "t", "cpu": tmp_path / "t"}  # one cgroup2 folder
    assert both.procs_files == [f"{tmp_path}/t/cgroup.procs"]
    assert Support("bwrap").mechanisms()["cpu"].startswith("NOT SHARED")


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_a_session_with_many_busy_processes_gets_the_cpu_share_of_one_session() -> None:
    """Eight busy processes in one session's groups and one in another's, on one CPU: each gets
    about half (without cpu groups the lone process would get a ninth)."""
    found = cgroups.detect()
    if "cpu" not in found:
        pytest.skip("no cgroup cpu controller here")
    support = Support("bwrap", cpu=found["cpu"])
    one_cpu = {max(os.sched_getaffinity(0))}
    hog, honest = support.session_cgroup(None, None), support.session_cgroup(None, None)
    hog.create(f"rollout-test-hog-{os.getpid()}")
    honest.create(f"rollout-test-honest-{os.getpid()}")
    busy = [sys.executable, "-c", "while True: pass"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for cg, n in ((hog, 8), (honest, 1)):
            for _ in range(n):
                procs.append(
                    subprocess.Popen(cg.joined(busy), preexec_fn=lambda: os.sched_setaffinity(0, one_cpu))
                )
        time.sleep(0.5)  # all started: from here on they compete
        before = [_cpu_ticks(p.pid) for p in procs]
        time.sleep(2.0)
        used = [_cpu_ticks(p.pid) - b for p, b in zip(procs, before, strict=True)]
    finally:
        for p in procs:
            p.kill()
            p.wait()
        assert hog.remove() and honest.remove()
    lone, many = used[-1], sum(used[:-1])
    # both groups weigh the same whatever else runs on that CPU: about 0.5 (a ninth without groups)
    assert lone / (lone + many) > 0.3, used


def _record(env: str, sandbox: str | None) -> SessionRecord:
    return SessionRecord(
        session_id=f"{env}-{sandbox}",
        job_id="j",
        env_name=env,
        case_id="0",
        group_id="g",
        model="m",
        sample_index=0,
        status="succeeded",
        sandbox=sandbox,
    )


def test_footer_warns_about_sessions_run_without_a_sandbox() -> None:
    assert table_footer([_record("a", "bwrap"), _record("b", None)]) is None
    footer = table_footer(
        [_record("a", "none"), _record("a", "none"), _record("b", "none"), _record("c", "bwrap")]
    )
    assert footer == (
        "warning: 3 sessions ran WITHOUT a sandbox (--sandbox none or the env's runtime.sandbox: "
        "none): a (2), b (1). Their runtimes could read the host's files and environment and reach "
        "its network; their scores may not be trustworthy as rewards."
    )


def test_footer_names_the_cases_whose_oracle_did_not_score_10() -> None:
    def oracle(env: str, case: str, score: float | None, eval_status: str | None = "scored") -> SessionRecord:
        r = _record(env, "bwrap").model_copy(
            update={"harness": "oracle", "case_id": case, "score": score, "eval_status": eval_status}
        )
        return r

    assert table_footer([oracle("t", "a", 10.0), _record("t", "bwrap")]) is None
    footer = table_footer(
        [
            oracle("t", "a", 10.0),
            oracle("t", "b", 5.0),
            oracle("t", "b", 0.0),  # a second sample of the same case: named once
            oracle("t", "c", None, "error"),  # its tests crashed on the reference solution
            oracle("t", "d", None, None),  # never graded (an infrastructure failure): not the task's
            oracle("u", "x", 0.0),
            _record("t", "bwrap").model_copy(update={"case_id": "z", "score": 0.0, "eval_status": "scored"}),
        ]
    )
    assert footer == (
        "warning: the oracle (each task's reference solution) scored below 10 on 3 cases "
        "(t: b, c; u: x): a broken solution or broken tests, or a test that needs what this sandbox does not "
        "give (a network, another user, a process the agent left running: docs/images.md); the verifier's "
        "output is in each session's evaluation artifacts (docs/verifiers.md)"
    )


def test_forwarder_uses_only_built_in_modules() -> None:
    source = (CODE_ROOT / "rollout" / "contract" / "forwarder.py").read_text()
    imports = {
        line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))
    }
    assert imports == {"_socket", "_thread", "os", "resource", "sys"}
    assert os.access(CODE_ROOT / "rollout" / "contract" / "forwarder.py", os.R_OK)
