"""Processes the launcher starts for a run: the managed local model server and the gateway.

Both run as child processes on free loopback ports and are stopped (SIGTERM, then SIGKILL after
10 s) when the run ends. ``check_gateway`` verifies a running gateway before anything is launched.

Gateway auth (``auth`` in the gateway config, :mod:`gateway.auth`): the launcher calls the gateway
itself (to close sessions) and its runtimes call it, so it needs one of the gateway's keys
(:func:`gateway_api_key`): for a gateway it starts, the first key of that gateway's config; for a
running gateway (``--gateway-base-url``), the environment variable :data:`GATEWAY_API_KEY_ENV`.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import yaml

from gateway.http_edge import host_of_url
from gateway.settings import GatewaySettings, ManagedServer
from rollout.errors import RolloutError

log = logging.getLogger(__name__)

GATEWAY_API_KEY_ENV = "GATEWAY_API_KEY"
"""The environment variable holding the key of a running gateway that has auth on."""
GATEWAY_ADMIN_KEY_ENV = "GATEWAY_ADMIN_KEY"
"""The environment variable holding an admin key of a running gateway (its ``/admin/...``
endpoints); the launcher uses it itself and never passes it to a runtime."""


class ServiceError(RolloutError, RuntimeError):
    """A service could not be started or checked; the message says what to do."""


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (bound once, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ChildProcess:
    """A started child (own process group) with its log file; ``stop()`` ends it."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], log_path: Path, url: str) -> None:
        self.name = name
        self.proc = proc
        self.log_path = log_path
        self.url = url

    def log_tail(self, n: int = 2000) -> str:
        """The last ``n`` characters the child wrote."""
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, wait ``grace_s`` seconds, then SIGKILL."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass


_PR_SET_PDEATHSIG = 1
_prctl = (
    ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
)  # resolved before any fork


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when the launcher dies, even by SIGKILL (Linux)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _spawn(name: str, cmd: list[str], log_dir: Path, url: str) -> ChildProcess:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    fh = log_path.open("wb")
    proc = subprocess.Popen(
        cmd,
        stdout=fh,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    fh.close()
    return ChildProcess(name, proc, log_path, url)


async def _wait_http(child: ChildProcess, url: str, timeout_s: float) -> httpx.Response:
    """Poll ``url`` until it answers 200. Stops the child (never leaves it orphaned) when it
    exits, does not answer in time, or the wait is cancelled (Ctrl-C during start-up)."""
    try:
        return await _poll(child, url, timeout_s)
    except BaseException:
        child.stop()
        raise


async def _poll(child: ChildProcess, url: str, timeout_s: float) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() < deadline:
            if child.proc.poll() is not None:
                raise ServiceError(
                    f"{child.name} exited with code {child.proc.returncode} while starting; "
                    f"its log ({child.log_path}) ends with:\n{child.log_tail()}"
                )
            try:
                r = await client.get(url)
                if r.status_code == 200:
                    return r
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
    raise ServiceError(f"{child.name} did not answer {url} within {timeout_s:g} s; log: {child.log_path}")


def find_gguf(managed: ManagedServer) -> Path:
    """The GGUF file of a managed route: ``model_path``, or the first ``*.gguf`` inside the
    installed package ``model_package``. Raises ServiceError saying how to install it."""
    if managed.model_path:
        p = Path(managed.model_path).expanduser()
        if not p.is_file():
            raise ServiceError(f"managed model file {p} does not exist")
        return p
    pkg = managed.model_package or ""
    spec = importlib.util.find_spec(pkg) if pkg else None
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError(_install_hint(f"the model package {pkg!r} is not installed"))
    for loc in spec.submodule_search_locations:
        ggufs = sorted(Path(loc).glob("*.gguf"))
        if ggufs:
            return ggufs[0]
    raise ServiceError(f"no .gguf file inside the package {pkg!r}")


def _install_hint(what: str) -> str:
    return (
        f"{what}. The default route runs a local model; install the `local` extra with the CMAKE_ARGS "
        "given in the README (Set up and run), e.g.\n"
        '  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF" '
        "pip install -e '.[local]'\n"
        "or point the launcher at another route/gateway (--llm-model, --gateway-base-url)."
    )


async def start_llama_server(managed: ManagedServer, log_dir: Path) -> ChildProcess:
    """Start the managed route's llama.cpp server (``kind: llama_cpp``: ``python -m
    llama_cpp.server``; ``llama_cpp_tokens``: ``python -m rollout.cli.token_server``, which returns
    exact token ids) and wait until ``/v1/models`` answers. Returns the child; its ``url`` is the
    route's new ``base_url`` (ends in ``/v1``)."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise ServiceError(_install_hint("llama-cpp-python is not installed"))
    gguf = find_gguf(managed)
    port = free_port()
    if managed.kind == "llama_cpp_tokens":
        if managed.chat_format:
            raise ServiceError(
                "managed kind llama_cpp_tokens takes no chat_format (the GGUF's chat template is used)"
            )
        cmd = [
            sys.executable,
            "-m",
            "rollout.cli.token_server",
            "--model",
            str(gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n-ctx",
            str(managed.n_ctx),
        ]
        if managed.n_threads:
            cmd += ["--n-threads", str(managed.n_threads)]
    else:
        cmd = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            str(managed.n_ctx),
        ]
        if managed.n_threads:
            cmd += ["--n_threads", str(managed.n_threads)]
        if managed.chat_format:
            cmd += ["--chat_format", managed.chat_format]
    cmd += managed.extra_args
    url = f"http://127.0.0.1:{port}/v1"
    child = _spawn("llama_server", cmd, log_dir, url)
    log.info("starting local model server (%s) on %s", gguf.name, url)
    await _wait_http(child, url + "/models", managed.startup_timeout_s)
    return child


async def start_gateway(
    settings: GatewaySettings, log_dir: Path, timeout_s: float = 60.0, advertise_url: str | None = None
) -> ChildProcess:
    """Start ``python -m gateway`` with ``settings`` (written to a temporary YAML) on a free
    loopback port and wait for ``/readyz``. The child's ``url`` is the session base URL
    (``http://127.0.0.1:PORT/v1/sessions``). With ``advertise_url`` (how other machines reach it,
    e.g. ``http://10.0.0.5:8000/v1/sessions``) it listens on every interface at that URL's port
    (80/443 when it names none) and answers that URL's host (``allowed_hosts``)."""
    host, port = "127.0.0.1", free_port()
    allowed = list(settings.allowed_hosts)
    if advertise_url is not None:
        parts = urlsplit(advertise_url)
        host, port = "0.0.0.0", parts.port or (443 if parts.scheme == "https" else 80)
        allowed.append(host_of_url(advertise_url))  # the Host of every call reaching it by that URL
    data = settings.model_copy(
        update={"listen_host": host, "listen_port": port, "allowed_hosts": allowed}
    ).model_dump(mode="json", exclude_none=True)
    log_dir.mkdir(parents=True, exist_ok=True)  # the derived config is kept with the logs of the run
    fd, cfg_path = tempfile.mkstemp(prefix="gateway-", suffix=".yaml", dir=log_dir)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    root = f"http://127.0.0.1:{port}"
    child = _spawn(
        "gateway",
        [sys.executable, "-m", "gateway", "--config", cfg_path],
        log_dir,
        root + settings.base_session_path,
    )
    await _wait_http(child, root + "/readyz", timeout_s)
    return child


def gateway_root(session_base_url: str) -> str:
    """``http://H:P/v1/sessions`` -> ``http://H:P`` (the prefix before ``/v1/sessions``)."""
    url = session_base_url.rstrip("/")
    for suffix in ("/v1/sessions", "/sessions"):
        if url.endswith(suffix):
            return url[: -len(suffix)]
    return url


def gateway_api_key(settings: GatewaySettings | None) -> str | None:
    """The key the launcher and its runtimes send to the gateway, or None (auth off).

    ``settings`` is the config of the gateway the launcher starts itself: its first key
    (``auth.api_keys``, then ``auth.api_keys_env``), None when it has none. ``settings`` None
    means a running gateway (``--gateway-base-url``): the value of ``$GATEWAY_API_KEY`` (spaces
    stripped), None when unset or empty."""
    if settings is not None:
        keys = settings.auth.keys()
        return keys[0] if keys else None
    return os.environ.get(GATEWAY_API_KEY_ENV, "").strip() or None


def gateway_admin_key(settings: GatewaySettings | None) -> str | None:
    """The key the launcher sends to the gateway's ``/admin/...`` endpoints (policy versions), or
    None. ``settings``: the config of the gateway the launcher starts itself (its first admin
    key); None: a running gateway, the value of ``$GATEWAY_ADMIN_KEY``. Never given to a
    runtime."""
    if settings is not None:
        keys = settings.auth.admin_keys()
        return keys[0] if keys else None
    return os.environ.get(GATEWAY_ADMIN_KEY_ENV, "").strip() or None


def auth_headers(api_key: str | None) -> dict[str, str]:
    """``{"Authorization": "Bearer <key>"}`` for a key, ``{}`` for None."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def readyz_error(body: str) -> str:
    """The ``error`` of a gateway's ``/readyz`` answer (why it is not ready), else the body's
    first 200 characters."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    return error if isinstance(error, str) and error else body[:200]


async def check_gateway(
    session_base_url: str, store_identity: str, route: str, api_key: str | None = None
) -> dict[str, object]:
    """GET ``/readyz`` of a running gateway and check that it writes to the launcher's database,
    serves sessions under the given URL, and has the route ``route``; then GET ``/v1/models``
    with ``api_key`` (``Authorization: Bearer``) to check that the gateway accepts it (a gateway
    with auth off accepts anything).

    Raises ServiceError when it does not answer, is not ready, reports another storage, another
    session path, or no such route, when the route's upstream does not answer (its ``/readyz``
    with ``?route=``), or when it refuses the key (HTTP 401: the message names
    ``GATEWAY_API_KEY``)."""
    url = gateway_root(session_base_url) + "/readyz"
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.get(url)
    except httpx.TransportError as e:
        raise ServiceError(f"gateway at {url} does not answer: {type(e).__name__}: {e}") from None
    if r.status_code != 200:
        raise ServiceError(f"gateway at {url} is not ready (HTTP {r.status_code}): {r.text[:300]}")
    info = r.json()
    if info.get("db_url") != store_identity:
        raise ServiceError(
            f"the gateway at {url} records to {info.get('db_url')!r}, but this launcher uses {store_identity!r}.\n"
            "Steps and rewards would land in different databases. Start the gateway with the same storage "
            "(python -m gateway --db-url ...) or pass the launcher the gateway's --db-path."
        )
    path = str(info.get("base_session_path", "/v1/sessions"))
    if not session_base_url.rstrip("/").endswith(path):
        raise ServiceError(
            f"--gateway-base-url must end with the gateway's session path {path!r}, "
            f"e.g. {gateway_root(session_base_url)}{path}"
        )
    routes = info.get("routes")
    if isinstance(routes, list) and route not in routes:
        raise ServiceError(
            f"the gateway at {url} has no route {route!r} (routes: {', '.join(map(str, routes))})"
        )
    try:  # the route's upstream too: a model server that is down fails the job now, not after the breaker's wait
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.get(url, params={"route": route})
    except httpx.TransportError as e:
        raise ServiceError(f"gateway at {url} does not answer: {type(e).__name__}: {e}") from None
    if r.status_code != 200:
        raise ServiceError(
            f"the gateway at {gateway_root(session_base_url)} is up, but route {route!r} is not: "
            f"{readyz_error(r.text)}; start its model server (or fix the route's base_url) and run again"
        )
    models_url = gateway_root(session_base_url) + "/v1/models"
    try:
        async with httpx.AsyncClient(timeout=10, headers=auth_headers(api_key)) as client:
            r = await client.get(models_url)
    except httpx.TransportError as e:
        raise ServiceError(f"gateway at {models_url} does not answer: {type(e).__name__}: {e}") from None
    if r.status_code == 401:
        if api_key is None:
            raise ServiceError(
                f"the gateway at {gateway_root(session_base_url)} requires an API key (its auth is "
                f"on): set {GATEWAY_API_KEY_ENV} to one of its keys"
            )
        raise ServiceError(
            f"the gateway at {gateway_root(session_base_url)} refused the key in "
            f"{GATEWAY_API_KEY_ENV} (HTTP 401)"
        )
    return info
