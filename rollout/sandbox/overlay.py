"""A session's copy-on-write root over an unpacked image (docs/images.md).

bubblewrap 0.8 has no overlay option, so the sandbox command is wrapped: ``unshare`` makes a user
and mount namespace (the launcher's uid mapped to root there), a tmpfs of the session's disk size
holds the overlay's upper and work folders, kernel overlayfs mounts the image's read-only rootfs
under it, and bubblewrap binds the merged tree as ``/``. Every mount lives in that namespace
only: it is gone when the sandbox ends, and nothing is copied from the image.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rollout.errors import RolloutError

MERGED = "m"
"""The merged tree under the session's scratch folder (where bwrap finds it, inside the namespace)."""
_SCRIPT = (
    'set -e; s="$1"; lower="$2"; size="$3"; shift 3; '
    'if [ "$size" != - ]; then mount -t tmpfs -o "size=$size,mode=0700" tmpfs "$s"; '
    'else mount -t tmpfs -o mode=0700 tmpfs "$s"; fi; '
    'mkdir "$s/u" "$s/w" "$s/m"; '
    'mount -t overlay overlay -o "lowerdir=$lower,upperdir=$s/u,workdir=$s/w" "$s/m"; '
    'exec "$@"'
)


class OverlayUnavailable(RolloutError, RuntimeError):
    """``unshare`` is missing (util-linux)."""


def merged(scratch: Path) -> Path:
    """Where the merged root is, as bwrap sees it."""
    return scratch / MERGED


def wrap(rootfs: Path, scratch: Path, size_bytes: int | None, argv: list[str]) -> list[str]:
    """``argv`` (a bwrap command binding :func:`merged` as ``/``) run inside the namespace that
    mounts the overlay of ``rootfs`` at ``scratch`` (an empty folder), its writable layer capped at
    ``size_bytes``."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise OverlayUnavailable("a session in an image needs unshare (util-linux)")
    return [
        unshare,
        "--user",
        "--map-root-user",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        _SCRIPT,
        "sh",
        str(scratch),
        str(rootfs),
        str(size_bytes) if size_bytes else "-",
        *argv,
    ]
