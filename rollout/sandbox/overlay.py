"""A session's copy-on-write root over an unpacked image (docs/images.md).

bubblewrap 0.8 has no overlay option, so the sandbox command is wrapped: ``unshare`` makes a user
and mount namespace (the launcher's uid mapped to root there), a tmpfs of the session's disk size
(or a kept host folder) holds the overlay's upper and work folders, kernel overlayfs mounts the
image's read-only rootfs under it (``userxattr``: whiteouts and opaque folders as ``user.``
attributes, so removing a folder of the image works without privileges), and bubblewrap binds the
merged tree as ``/``. Every mount lives in that namespace only: it is gone when the sandbox ends,
and nothing is copied from the image.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rollout.errors import RolloutError

MERGED = "m"
"""The merged tree under the session's scratch folder (where bwrap finds it, inside the namespace)."""
_SCRIPT = (
    'set -e; s="$1"; lower="$2"; size="$3"; keep="$4"; shift 4; '
    'if [ "$size" != - ]; then mount -t tmpfs -o "size=$size,mode=0700" tmpfs "$s"; '
    'else mount -t tmpfs -o mode=0700 tmpfs "$s"; fi; '
    'mkdir "$s/u" "$s/w" "$s/m"; '
    'mount -t overlay overlay -o "userxattr,lowerdir=$lower,upperdir=$s/u,workdir=$s/w" "$s/m"; '
    'if [ "$keep" = - ]; then exec "$@"; fi; '
    # keep the layer: copied out (whiteouts and user.overlay attributes too) once the sandbox ended
    'set +e; "$@"; rc=$?; cp -a "$s/u" "$keep/u" && : > "$keep/copied"; exit $rc'
)


class OverlayUnavailable(RolloutError, RuntimeError):
    """``unshare`` is missing (util-linux)."""


def merged(scratch: Path) -> Path:
    """Where the merged root is, as bwrap sees it."""
    return scratch / MERGED


def upper(keep: Path) -> Path:
    """The copy-on-write layer a session kept in ``keep`` (``wrap(keep=...)``): what it wrote,
    removed (whiteouts) or replaced outside its bound folders, as overlayfs keeps an upper layer."""
    return keep / "u"


def kept(keep: Path) -> bool:
    """Whether the layer was copied into ``keep`` whole (the sandbox ended, not killed, and the copy worked)."""
    return (keep / "copied").is_file()


def wrap(
    rootfs: Path,
    scratch: Path,
    size_bytes: int | None,
    argv: list[str],
    *,
    keep: Path | None = None,
    under: Path | None = None,
) -> list[str]:
    """``argv`` (a bwrap command binding :func:`merged` as ``/``) run inside the namespace that
    mounts the overlay of ``rootfs`` at ``scratch`` (an empty folder), its writable layer in a
    tmpfs capped at ``size_bytes``; with ``keep`` (an empty host folder) that layer is copied
    there once ``argv`` ends (:func:`upper`, :func:`kept`); ``under``: a layer a session kept,
    read-only on top of the image."""
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
        f"{upper(under)}:{rootfs}" if under is not None else str(rootfs),
        str(size_bytes) if size_bytes else "-",
        str(keep) if keep is not None else "-",
        *argv,
    ]
