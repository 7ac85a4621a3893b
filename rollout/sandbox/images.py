"""Container images as a session's root file system, without a container daemon (docs/images.md).

``resolve`` turns an :class:`ImageSource` (a reference, or a Dockerfile's build context) into an
:class:`ImageRoot`: an unpacked root file system in a cache keyed by the image's config digest,
with the image's WORKDIR, ENV and USER. In order: the image map replaces a reference (and each
``FROM`` of a Dockerfile), the local container store (``containers-storage:``, shared with buildah
and podman) is asked, a Dockerfile is built with ``buildah bud --isolation chroot``, a reference
not in the store is pulled with ``skopeo copy``; then ``skopeo copy`` to an OCI layout and
``umoci unpack`` into the cache, once per image (a file lock). Each source is resolved once per
process: its failure (a build that failed, with the log's tail) is kept and given to every
session that asks again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from rollout.core.envs import Case, EnvConfig, variable_problem
from rollout.errors import RolloutError
from rollout.sandbox.bwrap import WORKSPACE

log = logging.getLogger("rollout.sandbox.images")

TOOLS = ("buildah", "skopeo", "umoci")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
LOCAL_CA = "/usr/local/share/ca-certificates/rollout-host-ca.crt"
"""Where the host's CA bundle goes in a build that (re)generates the image's own bundle: Debian's
``update-ca-certificates`` adds the certificates found there to the bundle it writes."""
_CA_BUSY = ("ca-certificates.crt", "Device or resource busy")
"""What ``update-ca-certificates`` says when the bundle it replaces is the host's, mounted read-only."""
"""The host's CA bundle: mounted read-only into a build's RUN steps by default (a proxy's CA)."""
BUILD_TIMEOUT_S = 1800.0
LOG_TAIL = 2000
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_FROM = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE)


class ImageError(RolloutError, RuntimeError):
    """The image cannot be had (a build or pull that failed: the message ends with its log's tail,
    ``log`` is the whole of it)."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log or message


@dataclass(frozen=True)
class ImageSource:
    """Where a session's image comes from: a reference (``ref``), or a Dockerfile in a build
    context (``context``), with the image map (reference -> local reference) and the build's
    read-only mounts (``HOST:CONTAINER``)."""

    ref: str | None = None
    context: Path | None = None
    image_map: tuple[tuple[str, str], ...] = ()
    build_mounts: tuple[str, ...] = field(default=(f"{CA_BUNDLE}:{CA_BUNDLE}:ro",))

    def mapped(self, ref: str) -> str:
        """``ref`` as the image map replaces it (itself when unmapped)."""
        return dict(self.image_map).get(ref, ref)

    def describe(self) -> str:
        return f"{self.context}/Dockerfile" if self.context is not None else str(self.ref)


class ImageRoot(BaseModel):
    """An unpacked image: ``rootfs`` (read-only: sessions write to a copy-on-write layer),
    ``digest`` (of its config), its ``workdir``, ``env`` and ``user``, and ``ref`` (the local
    reference it was unpacked from)."""

    model_config = ConfigDict(frozen=True)

    digest: str
    rootfs: Path
    workdir: str = "/"
    env: dict[str, str] = {}
    user: str = ""
    ref: str = ""

    def uid_gid(self) -> tuple[int, int]:
        """The image's USER as numbers (a name is looked up in the image's ``/etc/passwd``; no
        USER: root). Raises ImageError for a name the image does not know."""
        name, _, group = self.user.partition(":")
        if not name:
            return 0, 0
        if name.isdigit():
            uid, gid = int(name), int(name)
        else:
            uid, gid = _lookup(self.rootfs / "etc" / "passwd", name, 2)
        if group:
            gid = int(group) if group.isdigit() else _lookup(self.rootfs / "etc" / "group", group, 2)[0]
        return uid, gid


def _lookup(path: Path, name: str, col: int) -> tuple[int, int]:
    try:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            parts = line.split(":")
            if len(parts) > col + 1 and parts[0] == name:
                return int(parts[col]), int(parts[col + 1]) if col + 1 < len(parts) and parts[
                    col + 1
                ].isdigit() else int(parts[col])
    except (OSError, ValueError):
        pass
    raise ImageError(f"the image's USER {name!r} is not in its {path.name}")


def source_for(cfg: EnvConfig, case: Case, image_map: tuple[tuple[str, str], ...] = ()) -> ImageSource | None:
    """The image ``case`` runs in: its Harbor task's Dockerfile (``image_context``) or
    ``docker_image`` (``image_ref``), else the env's ``image``; None for none. ``image_map`` (the
    job's ``--image``) wins over the env's ``images``."""
    mapping = tuple({**cfg.images, **dict(image_map)}.items())
    context, ref = case.row.get("image_context"), case.row.get("image_ref")
    if cfg.dataset.format == "harbor" and isinstance(context, str):
        return ImageSource(context=Path(context), image_map=mapping)
    if cfg.dataset.format == "harbor" and isinstance(ref, str):
        return ImageSource(ref=ref, image_map=mapping)
    return ImageSource(ref=cfg.image, image_map=mapping) if cfg.image else None


def at_workdir(image: ImageRoot, cfg: EnvConfig) -> ImageRoot:
    """``image`` with the env's ``workdir`` (if it sets one) as its WORKDIR."""
    return image.model_copy(update={"workdir": cfg.workdir}) if cfg.workdir else image


def own_files(source: ImageSource | None, cfg: EnvConfig) -> bool:
    """Whether the case's ``files_dir`` is copied into the workspace too: not for a Harbor task
    in its own image (its ``environment/`` is the build context; the image's WORKDIR holds its files)."""
    return (
        source is None
        or cfg.dataset.format != "harbor"
        or (cfg.image is not None and source.ref == cfg.image)
    )


def missing_tools() -> list[str]:
    """The image tools not installed here."""
    return [t for t in TOOLS if shutil.which(t) is None]


def cache_root() -> Path:
    """Where unpacked images are kept: ``$ROLLOUT_IMAGE_CACHE``, else the user's cache folder."""
    env = os.environ.get("ROLLOUT_IMAGE_CACHE")
    base = (
        Path(env)
        if env
        else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rollout-factory"
    )
    return (base / "images") if not env else base


def _run(argv: list[str], what: str, timeout: float = BUILD_TIMEOUT_S) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ImageError(f"{what}: {e}") from None
    if p.returncode != 0:
        whole = p.stdout + p.stderr
        raise ImageError(f"{what} failed (exit code {p.returncode}):\n{whole[-LOG_TAIL:]}", whole)
    return p.stdout


def in_store(ref: str) -> bool:
    """Whether the local container store holds ``ref``."""
    try:
        p = subprocess.run(
            ["skopeo", "inspect", "--raw", f"containers-storage:{ref}"],
            capture_output=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


def _context_hash(context: Path, dockerfile: str) -> str:
    h = hashlib.sha256(dockerfile.encode())
    for parent, dirs, names in sorted(os.walk(context)):
        dirs.sort()
        for name in sorted(names):
            p = Path(parent) / name
            h.update(str(p.relative_to(context)).encode() + b"\0")
            if p.is_file() and not p.is_symlink():
                h.update(p.read_bytes())
    return h.hexdigest()[:24]


def mapped_dockerfile(text: str, source: ImageSource) -> str:
    """The Dockerfile with each ``FROM`` reference replaced by the image map."""
    out = []
    for line in text.splitlines():
        m = _FROM.match(line)
        out.append(f"{m[1]}{m[2]}{source.mapped(m[3])}{m[4]}" if m else line)
    return "\n".join(out) + "\n"


def bases(dockerfile: str) -> list[str]:
    """The images a Dockerfile's ``FROM`` lines name, in order: not ``scratch``, not an earlier
    stage (``AS name``), not one naming a build ARG (``$``)."""
    out: list[str] = []
    stages: set[str] = set()
    for line in dockerfile.splitlines():
        m = _FROM.match(line)
        if not m:
            continue
        name = m[3]
        if name.lower() not in stages and name != "scratch" and "$" not in name and name not in out:
            out.append(name)
        stage = re.match(r"\s+AS\s+(\S+)", m[4], re.IGNORECASE)
        if stage:
            stages.add(stage[1].lower())
    return out


def build_ref(source: ImageSource) -> tuple[str, str]:
    """The local reference ``source``'s build is tagged with, and its mapped Dockerfile. The tag
    hashes the build context, the mapped Dockerfile and the config digest of each base image as
    the local store holds it (a base not there is pulled first): a base rebuilt under the same
    tag gives a new tag, and tasks whose contexts are the same share one build."""
    assert source.context is not None
    dockerfile = mapped_dockerfile((source.context / "Dockerfile").read_text(encoding="utf-8"), source)
    keyed = dockerfile + "".join(
        f"\0{base}\0{_config(local_ref(ImageSource(ref=base)))[0]}" for base in bases(dockerfile)
    )
    return f"localhost/rollout-build/context:{_context_hash(source.context, keyed)}", dockerfile


def build(source: ImageSource) -> str:
    """Build ``source``'s Dockerfile (FROM lines mapped) into the local store; its local reference.
    A context already built (same files, same mapped Dockerfile, same base images) is not built again."""
    assert source.context is not None
    ref, dockerfile = build_ref(source)
    if in_store(ref):
        return ref
    with tempfile.TemporaryDirectory(prefix="rollout-dockerfile-") as tmp:
        path = Path(tmp) / "Dockerfile"
        path.write_text(dockerfile, encoding="utf-8")
        mounts = [m for m in source.build_mounts if Path(m.split(":", 1)[0]).exists()]
        log.info("building the image of %s as %s", source.describe(), ref)
        try:
            _bud(source, path, ref, mounts)
        except ImageError as e:
            at_bundle = [m for m in mounts if m.split(":")[1:2] == [CA_BUNDLE]]
            if not at_bundle or not any(all(s in line for s in _CA_BUSY) for line in e.log.splitlines()):
                raise
            # the Dockerfile installs ca-certificates, whose bundle cannot replace the host's mount:
            # the host's certificates go where that package adds local ones to the bundle it writes
            log.info("building %s again with the host's CA bundle at %s", source.describe(), LOCAL_CA)
            moved = [m.replace(f":{CA_BUNDLE}", f":{LOCAL_CA}", 1) if m in at_bundle else m for m in mounts]
            _bud(source, path, ref, moved)
    return ref


def _bud(source: ImageSource, dockerfile: Path, ref: str, mounts: list[str]) -> None:
    _run(
        [
            "buildah",
            "bud",
            "--isolation",
            "chroot",
            "--pull=missing",
            *(a for m in mounts for a in ("-v", m)),
            "-f",
            str(dockerfile),
            "-t",
            ref,
            str(source.context),
        ],
        f"building {source.describe()}",
    )


def local_ref(source: ImageSource) -> str:
    """``source`` as a reference in the local store: mapped, found, built or pulled."""
    if source.context is not None:
        return build(source)
    assert source.ref is not None
    ref = source.mapped(source.ref)
    if in_store(ref):
        return ref
    log.info("pulling %s", ref)
    try:
        _run(["skopeo", "copy", f"docker://{ref}", f"containers-storage:{ref}"], f"pulling {ref}")
    except ImageError as e:
        raise ImageError(
            f"{e}\n(without a registry, give an image of the local store instead: --image {ref}=LOCAL, "
            "docs/images.md)"
        ) from None
    return ref


def _config(ref: str) -> tuple[str, dict[str, Any]]:
    raw = _run(
        ["skopeo", "inspect", "--config", "--raw", f"containers-storage:{ref}"],
        f"reading {ref}'s config",
        120,
    )
    return "sha256:" + hashlib.sha256(raw.encode()).hexdigest(), json.loads(raw)


def unpack(ref: str, cache: Path | None = None) -> ImageRoot:
    """``ref`` (in the local store) unpacked into the cache, once per image digest."""
    digest, config = _config(ref)
    cfg = config.get("config") or {}
    env = dict(e.split("=", 1) for e in cfg.get("Env") or [] if "=" in e)
    for k, v in env.items():
        why = variable_problem(k, v)
        if why is not None:
            raise ImageError(f"{ref}: its config's Env: {why}")
    env.setdefault("PATH", DEFAULT_PATH)
    folder = (cache or cache_root()) / digest.split(":", 1)[1][:32]
    root = ImageRoot(
        digest=digest,
        rootfs=folder / "rootfs",
        workdir=cfg.get("WorkingDir") or "/",
        env=env,
        user=cfg.get("User") or "",
        ref=ref,
    )
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "done").is_file():
            _hold(folder)
            return root
        shutil.rmtree(folder, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            _run(
                ["skopeo", "copy", f"containers-storage:{ref}", f"oci:{tmp / 'oci'}:img"], f"exporting {ref}"
            )
            rootless = ["--rootless"] if os.geteuid() != 0 else []
            _run(
                ["umoci", "unpack", *rootless, "--image", f"{tmp / 'oci'}:img", str(tmp / "bundle")],
                f"unpacking {ref}",
            )
            folder.mkdir()
            (tmp / "bundle" / "rootfs").rename(folder / "rootfs")
            (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
            (folder / "done").write_text(ref, encoding="utf-8")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _hold(folder)
    return root


_held: dict[Path, Any] = {}


def _hold(folder: Path) -> None:
    """Mark ``folder`` (an unpacked image) as used now and in use by this process until it ends
    (or :func:`forget`): a shared lock on ``<name>.use`` that :func:`prune` never breaks. Called
    under the entry's unpack lock, so a prune cannot slip in between."""
    (folder / "used").write_text(f"{os.getpid()}\n", encoding="utf-8")
    with _guard:
        if folder in _held:
            return
        use = open(folder.parent / f"{folder.name}.use", "a")  # noqa: SIM115 (held for the process's life)
        fcntl.flock(use, fcntl.LOCK_SH)
        _held[folder] = use


_memo: dict[ImageSource, ImageRoot | ImageError] = {}
_locks: dict[ImageSource, threading.Lock] = {}
_guard = threading.Lock()


def resolve(source: ImageSource, cache: Path | None = None) -> ImageRoot:
    """``source`` as an unpacked image (blocking; once per process and source). Raises
    ImageError (the same one again for a source that failed before)."""
    with _guard:
        lock = _locks.setdefault(source, threading.Lock())
    with lock:
        done = _memo.get(source)
        if isinstance(done, ImageError):
            raise done
        if done is not None:
            return done
        if missing_tools():
            err = ImageError(
                f"a task in a container image needs {', '.join(missing_tools())} "
                "(apt-get install buildah skopeo umoci)"
            )
            _memo[source] = err
            raise err
        try:
            out = unpack(local_ref(source), cache)
        except (ImageError, OSError, ValueError) as e:
            err = (
                e
                if isinstance(e, ImageError)
                else ImageError(f"{source.describe()}: {type(e).__name__}: {e}")
            )
            _memo[source] = err
            raise err from None
        _memo[source] = out
        return out


def forget() -> None:
    """Drop what this process resolved, and its hold on the images it used (tests)."""
    with _guard:
        _memo.clear()
        _locks.clear()
        for use in _held.values():
            use.close()
        _held.clear()


class CacheEntry(BaseModel):
    """An unpacked image in the cache: its folder's ``name``, the ``ref`` it was unpacked from
    (empty for an unpack that never finished), ``size`` in bytes, ``last_used`` (a Unix time: the
    last time a process started using it) and ``in_use`` (a running process holds it)."""

    name: str
    ref: str
    size: int
    last_used: float
    in_use: bool


def _size(folder: Path) -> int:
    seen: set[tuple[int, int]] = set()
    total = 0
    for parent, _, names in os.walk(folder):
        for n in names:
            st = os.lstat(os.path.join(parent, n))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def _flock_now(path: Path, how: int) -> Any | None:
    """``path`` opened and locked (``how``) without waiting; None when another holds it."""
    f = open(path, "a")  # noqa: SIM115 (returned locked)
    try:
        fcntl.flock(f, how | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def _entry(folder: Path) -> CacheEntry:
    done, used = folder / "done", folder / "used"
    ref = done.read_text(encoding="utf-8").strip() if done.is_file() else ""
    stamp = used if used.is_file() else done if done.is_file() else folder
    use = _flock_now(folder.parent / f"{folder.name.lstrip('.').split('-')[0]}.use", fcntl.LOCK_EX)
    if use is not None:
        use.close()
    return CacheEntry(
        name=folder.name, ref=ref, size=_size(folder), last_used=stamp.stat().st_mtime, in_use=use is None
    )


def cache_entries(cache: Path | None = None) -> list[CacheEntry]:
    """The cache's unpacked images (and unfinished unpacks), least recently used first."""
    root = cache or cache_root()
    if not root.is_dir():
        return []
    found = [_entry(p) for p in root.iterdir() if p.is_dir() and not p.is_symlink()]
    return sorted(found, key=lambda e: (e.last_used, e.name))


def _rmtree(folder: Path) -> None:
    """Remove ``folder``, making its read-only folders writable first (a rootless unpack keeps the
    image's modes)."""
    os.chmod(folder, stat.S_IRWXU)
    for parent, dirs, _ in os.walk(folder):  # top-down: a folder is made readable before it is walked
        for d in dirs:
            p = os.path.join(parent, d)
            if not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
    shutil.rmtree(folder)


def prune(
    unused_for_s: float | None, cache: Path | None = None, now: float | None = None
) -> list[CacheEntry]:
    """Remove the cache's images not used for ``unused_for_s`` seconds before ``now`` (None: all),
    never one a running process holds, nor an unpack under way; the entries removed."""
    root = cache or cache_root()
    removed = []
    for entry in cache_entries(root):
        if entry.in_use or (
            unused_for_s is not None
            and (now if now is not None else time.time()) - entry.last_used < unused_for_s
        ):
            continue
        base = entry.name.lstrip(".").split("-")[0]
        unpacking = _flock_now(root / f"{base}.lock", fcntl.LOCK_EX)
        if unpacking is None:
            continue  # an unpack of that image is under way
        with unpacking:
            use = _flock_now(root / f"{base}.use", fcntl.LOCK_EX)
            if use is None:
                continue  # taken since it was listed
            with use:
                log.info("removing the unpacked image %s (%s)", entry.name, entry.ref or "unfinished")
                _rmtree(root / entry.name)
        removed.append(entry)
    return removed


def _not_files(folder: str, names: list[str]) -> list[str]:
    """The entries of ``folder`` that are neither folders, regular files nor links: device nodes,
    FIFOs and sockets, never read (a copy of ``/dev/full`` never ends)."""
    keep = (stat.S_ISDIR, stat.S_ISREG, stat.S_ISLNK)
    return [n for n in names if not any(ok(os.lstat(os.path.join(folder, n)).st_mode) for ok in keep)]


def bound_at(image: ImageRoot) -> str:
    """Where the workspace is bound in ``image``: its WORKDIR, ``/workspace`` when that is ``/``."""
    return image.workdir.rstrip("/") or WORKSPACE


def seed_workspace(image: ImageRoot, workspace: Path) -> None:
    """Copy what the image holds where the workspace is bound (:func:`bound_at`: its WORKDIR's
    folders, regular files and links, never a device node) into ``workspace``; for a WORKDIR of
    ``/``, its ``/workspace`` (the root itself is the session's ``/`` already)."""
    src = image.rootfs / bound_at(image).lstrip("/")
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, workspace, symlinks=True, dirs_exist_ok=True, ignore=_not_files)
