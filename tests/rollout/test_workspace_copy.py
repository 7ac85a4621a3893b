"""copy_workspace: a file's holes are copied as holes, its bytes exactly; the caps count a file's size."""

from __future__ import annotations

from pathlib import Path

from rollout.grading.workspace_copy import CopyCaps, copy_workspace

GiB = 1 << 30


def _holes_supported(folder: Path) -> bool:
    probe = folder / "probe"
    with probe.open("wb") as f:
        f.truncate(64 << 20)
    sparse = probe.stat().st_blocks * 512 < (1 << 20)
    probe.unlink()
    return sparse


def test_a_sparse_file_is_copied_as_one_exactly_and_quickly(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    assert _holes_supported(src)
    with (src / "big.bin").open("wb") as f:  # 1 GiB: two pieces of data, holes around them
        f.seek(1000)
        f.write(b"head")
        f.seek(GiB // 2)
        f.write(b"middle" * 1000)
        f.truncate(GiB)
    (src / "plain.txt").write_bytes(b"plain\n")
    out = copy_workspace(src, dest, CopyCaps(max_bytes=2 * GiB))
    assert (out.files, out.bytes, out.complete) == (2, GiB + 6, True)
    copied = dest / "big.bin"
    assert copied.stat().st_size == GiB
    assert copied.stat().st_blocks * 512 < (16 << 20)  # what it holds, not its size
    with copied.open("rb") as f:
        assert f.read(1004)[1000:] == b"head"
        f.seek(GiB // 2)
        assert f.read(6000) == b"middle" * 1000
        f.seek(GiB - 10)
        assert f.read() == bytes(10)
    assert (dest / "plain.txt").read_bytes() == b"plain\n"


def test_a_file_over_the_bytes_cap_is_left_out_by_its_size(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    with (src / "big.bin").open("wb") as f:
        f.truncate(10 << 20)  # all hole: still 10 MiB of the cap
    out = copy_workspace(src, dest, CopyCaps(max_bytes=1 << 20))
    assert not (dest / "big.bin").exists() and out.complete is False
    assert out.skipped and out.skipped[0].startswith("big.bin: ")
