"""The cache of unpacked images (docs/images.md, "The cache"): listed with its size, reference and
last use, pruned by age or all, never an image a running launcher holds (``launcher.py images``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollout.cli.run import main
from rollout.sandbox import images
from tests.test_launcher import REPO

NOW = 1_800_000_000.0
DAY = 86400.0


def _entry(cache: Path, name: str, ref: str | None, used_days_ago: float, size: int = 0) -> Path:
    """A fake unpacked image: ``rootfs`` with a read-only folder, ``done`` (None: unfinished) and
    ``used`` stamped ``used_days_ago`` before :data:`NOW`."""
    folder = cache / name
    (folder / "rootfs" / "usr" / "bin").mkdir(parents=True)
    (folder / "rootfs" / "usr" / "bin" / "tool").write_bytes(b"x" * size)
    (folder / "rootfs" / "usr" / "bin").chmod(0o555)
    stamp = NOW - used_days_ago * DAY
    if ref is not None:
        (folder / "done").write_text(ref)
        (folder / "used").write_text("1\n")
        os.utime(folder / "used", (stamp, stamp))
    os.utime(folder, (stamp, stamp))
    return folder


@pytest.fixture(autouse=True)
def _forget() -> Any:
    images.forget()
    yield
    images.forget()


def test_the_cache_lists_its_images_and_prunes_those_not_used_for_n_days(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _entry(cache, "a" * 32, "localhost/old:1", 10, size=8192)
    _entry(cache, "b" * 32, "localhost/recent:1", 1)
    _entry(cache, "." + "c" * 32 + "-x1y2", None, 5)  # an unpack that never finished
    got = images.cache_entries(cache)
    assert [(e.name, e.ref, e.last_used, e.in_use) for e in got] == [
        ("a" * 32, "localhost/old:1", NOW - 10 * DAY, False),
        ("." + "c" * 32 + "-x1y2", "", NOW - 5 * DAY, False),
        ("b" * 32, "localhost/recent:1", NOW - 1 * DAY, False),
    ]
    assert got[0].size >= 8192
    removed = images.prune(3 * DAY, cache, now=NOW)
    assert [e.name for e in removed] == ["a" * 32, "." + "c" * 32 + "-x1y2"]
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == ["b" * 32]
    assert [e.name for e in images.prune(None, cache, now=NOW)] == ["b" * 32]
    assert images.cache_entries(cache) == []


def _fake_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """``skopeo``/``umoci`` as stand-ins: the export does nothing, the unpack makes a rootfs."""

    def run(argv: list[str], what: str, timeout: float = 0) -> str:
        if argv[:2] == ["umoci", "unpack"]:
            (Path(argv[-1]) / "rootfs" / "etc").mkdir(parents=True)
        return ""

    monkeypatch.setattr(images, "_run", run)
    monkeypatch.setattr(images, "_config", lambda ref: ("sha256:" + "d" * 64, {"config": {}}))


def test_an_image_this_process_unpacked_or_reused_is_in_use_until_it_lets_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_tools(monkeypatch)
    cache = tmp_path / "cache"
    root = images.unpack("localhost/x:1", cache)
    (entry,) = images.cache_entries(cache)
    assert (entry.name, entry.ref, entry.in_use) == ("d" * 32, "localhost/x:1", True)
    assert images.prune(None, cache, now=NOW) == []
    assert root.rootfs.is_dir()
    images.forget()  # the process lets go (a launcher that ended)
    assert [e.name for e in images.prune(None, cache, now=NOW)] == ["d" * 32]
    images.unpack("localhost/x:1", cache)  # unpacked again, and held again
    os.utime(cache / ("d" * 32) / "used", (1000.0, 1000.0))  # last used in 1970
    images.forget()
    images.unpack("localhost/x:1", cache)  # found unpacked: used now, held
    (entry,) = images.cache_entries(cache)
    assert entry.in_use and entry.last_used > 1000.0
    assert images.prune(None, cache, now=NOW) == []


_HOLDER = """
import sys
from pathlib import Path
from rollout.sandbox import images
images._hold(Path(sys.argv[1]))
print("held", flush=True)
sys.stdin.read()
"""


def test_prune_never_removes_an_image_another_running_launcher_holds(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    held = _entry(cache, "e" * 32, "localhost/held:1", 40)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(held)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert [e.in_use for e in images.cache_entries(cache)] == [True]
        assert images.prune(None, cache, now=NOW) == []
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0
    assert [e.name for e in images.prune(None, cache, now=NOW)] == ["e" * 32]


def test_the_images_command_lists_and_prunes_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("ROLLOUT_IMAGE_CACHE", str(cache))
    _entry(cache, "a" * 32, "localhost/old:1", 10_000)  # days before NOW: long before the real now
    assert main(["images", "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert {k: v for k, v in json.loads(line).items() if k != "size"} == {
        "name": "a" * 32,
        "ref": "localhost/old:1",
        "last_used": NOW - 10_000 * DAY,
        "in_use": False,
    }
    assert main(["images"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["IMAGE", "REF", "SIZE", "LAST", "USED", "IN", "USE"]
    assert table[1].split()[:2] == ["a" * 32, "localhost/old:1"]
    with pytest.raises(SystemExit) as bad:
        main(["images", "prune"])  # --days N or --all
    assert bad.value.code == 2
    assert main(["images", "prune", "--days", "7"]) == 0
    assert capsys.readouterr().out.startswith(f"removed 1 image(s) from {cache}, ")
    assert images.cache_entries(cache) == []


def test_a_build_that_installs_ca_certificates_gets_the_hosts_bundle_as_a_local_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``update-ca-certificates`` cannot replace a bundle the host mounted read-only: the build runs
    again with the host's bundle where the package adds local CAs; any other failure is the build's."""
    context = tmp_path / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\nRUN apt-get install -y ca-certificates\n")
    bundle = tmp_path / "host-ca.crt"
    bundle.write_text("host CAs\n")
    builds: list[list[str]] = []
    # the line, then more of the log than the error's tail keeps (an apt-get that goes on)
    failure = [
        "mv: cannot move '/etc/ssl/certs/ca-certificates.crt.new' to 'ca-certificates.crt': Device or resource busy\n"
        + "Setting up a-package ...\n" * 500
    ]

    def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        if argv[:2] == ["buildah", "bud"]:
            builds.append([argv[i + 1] for i, a in enumerate(argv) if a == "-v"])
            if len(builds) == 1:
                return subprocess.CompletedProcess(argv, 1, failure[0], "error building at STEP 2\n")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(images.subprocess, "run", run)
    monkeypatch.setattr(images, "in_store", lambda ref: False)
    source = images.ImageSource(context=context, build_mounts=(f"{bundle}:{images.CA_BUNDLE}:ro",))
    images.build(source)
    assert builds == [[f"{bundle}:{images.CA_BUNDLE}:ro"], [f"{bundle}:{images.LOCAL_CA}:ro"]]
    builds.clear()
    failure[0] = "E: Unable to locate package nosuch"
    with pytest.raises(images.ImageError, match="Unable to locate package"):
        images.build(source)
    assert builds == [[f"{bundle}:{images.CA_BUNDLE}:ro"]]  # built once: another failure is the build's own


def test_a_pull_that_fails_says_how_to_give_a_local_image_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(argv: list[str], what: str, timeout: float = 0) -> str:
        raise images.ImageError(f"{what} failed (exit code 1):\nno such host registry-1.docker.io")

    monkeypatch.setattr(images, "_run", run)
    monkeypatch.setattr(images, "in_store", lambda ref: False)
    with pytest.raises(images.ImageError) as e:
        images.local_ref(images.ImageSource(ref="python:3"))
    assert str(e.value).endswith(
        "no such host registry-1.docker.io\n(without a registry, give an image of the local store instead: "
        "--image python:3=LOCAL, docs/images.md)"
    )
