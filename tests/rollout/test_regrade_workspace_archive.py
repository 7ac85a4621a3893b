"""rollout.jobs.workspace_archive on real folders: what is kept of a final workspace, the caps, and a
restore that reproduces the kept tree and refuses archives that would write outside it."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest
import yaml

from rollout.core.envs import EnvConfigError, WorkspaceArchiveConfig, load_env_config
from rollout.jobs.workspace_archive import ArchiveError, build_archive, restore_workspace


def tree(root: Path) -> dict[str, str]:
    """Relative path -> content for files, '<dir>' for folders, '-> target' for links."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = f"-> {os.readlink(p)}"
            elif p.is_dir():
                out[rel] = "<dir>"
            else:
                out[rel] = p.read_text()
    return out


def make_workspace(ws: Path, outside: Path) -> None:
    (ws / "outputs" / "deep").mkdir(parents=True)
    (ws / "outputs" / "answer.json").write_text('{"n": 3}')
    (ws / "outputs" / "deep" / "notes.txt").write_text("notes")
    (ws / "empty").mkdir()
    (ws / "data.csv").write_text("a,b\n1,2\n")
    (ws / "run.sh").write_text("#!/bin/sh\n")
    (ws / "run.sh").chmod(0o755)
    os.symlink("outputs/answer.json", ws / "latest.json")  # relative, stays inside: kept
    os.symlink(str(outside), ws / "abs_link")  # absolute: skipped
    os.symlink("../secret.txt", ws / "up_link")  # leaves the workspace: skipped
    os.mkfifo(ws / "pipe")  # not a regular file: skipped


def test_whole_workspace_round_trip(tmp_path: Path) -> None:
    ws, dest, outside = tmp_path / "ws", tmp_path / "dest", tmp_path / "secret.txt"
    ws.mkdir()
    dest.mkdir()
    outside.write_text("secret")
    make_workspace(ws, outside)

    kept = build_archive(ws, WorkspaceArchiveConfig())
    assert (kept.status, kept.reason, kept.paths) == ("kept", None, None)
    assert kept.file_count == 4
    assert kept.total_bytes == len('{"n": 3}') + len("notes") + len("a,b\n1,2\n") + len("#!/bin/sh\n")
    assert sorted(kept.skipped) == [
        "abs_link: link to " + str(outside) + " leaves the workspace",
        "pipe: not a regular file, folder or link",
        "up_link: link to ../secret.txt leaves the workspace",
    ]
    cols = kept.columns()
    assert kept.archive is not None
    assert cols["sha256"] == hashlib.sha256(kept.archive).hexdigest() and cols["archive_bytes"] == len(
        kept.archive
    )

    assert restore_workspace(kept.archive, cols["sha256"], dest) == 4
    assert tree(dest) == {
        "outputs": "<dir>",
        "outputs/deep": "<dir>",
        "outputs/answer.json": '{"n": 3}',
        "outputs/deep/notes.txt": "notes",
        "empty": "<dir>",
        "data.csv": "a,b\n1,2\n",
        "run.sh": "#!/bin/sh\n",
        "latest.json": "-> outputs/answer.json",
    }
    assert (dest / "latest.json").read_text() == '{"n": 3}'
    assert os.stat(dest / "run.sh").st_mode & 0o777 == 0o755
    with tarfile.open(fileobj=io.BytesIO(kept.archive)) as tar:  # no owner names of the launcher's user
        assert {(m.uname, m.gname, m.uid, m.gid) for m in tar.getmembers()} == {("", "", 0, 0)}


def test_configured_paths_only_and_missing_ones_listed(tmp_path: Path) -> None:
    ws, dest = tmp_path / "ws", tmp_path / "dest"
    ws.mkdir()
    dest.mkdir()
    make_workspace(ws, tmp_path / "x")
    kept = build_archive(ws, WorkspaceArchiveConfig(paths=["outputs", "data.csv", "nope/x.txt"]))
    assert kept.status == "kept" and kept.missing == ["nope/x.txt"] and kept.file_count == 3
    assert kept.archive is not None
    restore_workspace(kept.archive, None, dest)
    assert tree(dest) == {
        "outputs": "<dir>",
        "outputs/deep": "<dir>",
        "outputs/answer.json": '{"n": 3}',
        "outputs/deep/notes.txt": "notes",
        "data.csv": "a,b\n1,2\n",
    }


def test_a_path_reached_through_a_link_out_of_the_workspace_is_not_kept(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "host"
    ws.mkdir()
    (outside / "outputs").mkdir(parents=True)
    (outside / "outputs" / "secret.txt").write_text("host file")
    os.symlink(str(outside), ws / "via")
    kept = build_archive(ws, WorkspaceArchiveConfig(paths=["via/outputs"]))
    assert kept.status == "kept" and kept.file_count == 0
    assert kept.skipped == ["via/outputs: reached through a link that leaves the workspace"]


def test_over_the_size_cap_nothing_is_kept_and_big_files_are_never_read(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "small.txt").write_text("x" * 100)
    with open(ws / "huge.bin", "wb") as f:  # 10 GB sparse: reading it would take minutes
        f.truncate(10 * 1024**3)
    kept = build_archive(ws, WorkspaceArchiveConfig(max_bytes=1024 * 1024))
    assert kept.status == "too_large" and kept.archive is None
    assert kept.reason == (
        "final workspace not kept: its files hold more than 1048576 bytes "
        "(cap: workspace_archive.max_bytes in env.yaml)"
    )
    assert kept.columns()["sha256"] is None and kept.columns()["archive_bytes"] == 0
    # under the cap when only the small file is asked for
    assert build_archive(ws, WorkspaceArchiveConfig(paths=["small.txt"], max_bytes=1024)).status == "kept"


def test_folders_nested_too_deep_are_not_kept_with_a_reason(tmp_path: Path) -> None:
    deep = tmp_path
    for _ in range(1100):  # deeper than os.walk's recursion goes
        deep = deep / "a"
        deep.mkdir()
    try:
        kept = build_archive(tmp_path, WorkspaceArchiveConfig())
        assert (kept.status, kept.archive) == ("failed", None)
        assert kept.reason is not None and kept.reason.startswith("final workspace not kept: RecursionError")
    finally:  # bottom-up: pytest's own clean-up of tmp_path recurses and would fail on this depth
        while deep != tmp_path:
            deep.rmdir()
            deep = deep.parent


def test_too_many_entries_and_disabled(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(30):
        (ws / f"f{i}").write_text("")
    kept = build_archive(ws, WorkspaceArchiveConfig(max_files=20))
    assert kept.status == "too_large" and "more than 20 entries" in str(kept.reason)
    off = build_archive(ws, WorkspaceArchiveConfig(enabled=False))
    assert (off.status, off.archive, off.reason) == (
        "disabled",
        None,
        "workspace_archive.enabled is false in env.yaml",
    )


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _info(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o644
    return info


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([(_info("../escape.txt"), b"x")], "would land outside the workspace"),
        ([(_info("/tmp/abs.txt"), b"x")], "would land outside the workspace"),
        ([(_info("a/../../b.txt"), b"x")], "would land outside the workspace"),
        ([(_info("ln", tarfile.SYMTYPE, "../../etc/passwd"), None)], "links outside the workspace"),
        ([(_info("ln", tarfile.SYMTYPE, "/etc/passwd"), None)], "links outside the workspace"),
        ([(_info("hard", tarfile.LNKTYPE, "x"), None)], "unsupported type"),
        ([(_info("dev", tarfile.CHRTYPE), None)], "unsupported type"),
    ],
)
def test_restore_refuses_members_that_escape(tmp_path: Path, members: list, message: str) -> None:  # type: ignore[type-arg]
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ArchiveError, match=message):
        restore_workspace(_tar(*members), None, dest)
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "b.txt").exists()


def test_restore_checks_digest_and_corruption(tmp_path: Path) -> None:
    data = _tar((_info("a.txt"), b"hello"))
    with pytest.raises(ArchiveError, match="digest does not match"):
        restore_workspace(data, "0" * 64, tmp_path)
    with pytest.raises(ArchiveError, match="cannot be extracted"):
        restore_workspace(data[: len(data) // 2], None, tmp_path)
    assert restore_workspace(data, hashlib.sha256(data).hexdigest(), tmp_path) == 1
    assert (tmp_path / "a.txt").read_text() == "hello"


def test_env_config_key_is_strict(tmp_path: Path) -> None:
    def config(archive: object) -> Path:
        path = tmp_path / "env.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": "e",
                    "dataset": {"path": "x.jsonl"},
                    "runtime": {"command": ["x"]},
                    "workspace_archive": archive,
                }
            )
        )
        return path

    cfg = load_env_config(config({"paths": ["outputs/", "logs/run.txt"], "max_bytes": 4096}))
    assert cfg.workspace_archive == WorkspaceArchiveConfig(paths=["outputs", "logs/run.txt"], max_bytes=4096)
    assert load_env_config(config({})).workspace_archive == WorkspaceArchiveConfig()
    for bad, text in (
        ({"paths": ["/etc"]}, "must be a path inside the workspace"),
        ({"paths": ["../x"]}, "must be a path inside the workspace"),
        ({"max_bytes": 0}, "max_bytes"),
        ({"path": ["outputs"]}, "path"),
    ):
        with pytest.raises(EnvConfigError, match=text):
            load_env_config(config(bad))
