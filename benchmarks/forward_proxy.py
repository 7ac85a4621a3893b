"""Reference point: a forwarding-only FastAPI proxy (aiohttp client, no parsing, no recording).

``gateway_bench.py`` measures it in the same run as the gateway, so the cost of recording can
be told apart from the cost of FastAPI + aiohttp forwarding on whatever the machine does that
day. ``python benchmarks/forward_proxy.py --upstream http://127.0.0.1:18080 --port 18090``
forwards ``POST /{prefix}/v1/chat/completions`` as received and streams SSE answers back.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse


def create_app(upstream: str) -> FastAPI:
    """The proxy app forwarding to ``upstream`` (``http://host:port``)."""
    state: dict[str, aiohttp.ClientSession] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        yield
        await state["s"].close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.post("/{prefix}/v1/chat/completions")
    async def chat(prefix: str, request: Request) -> Response:
        body = await request.body()
        resp = await state["s"].post(
            f"{upstream}/{prefix}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        if resp.content_type == "text/event-stream":

            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for data in resp.content.iter_any():
                        yield data
                finally:
                    resp.release()

            return StreamingResponse(relay(), status_code=resp.status, media_type="text/event-stream")
        content = await resp.read()
        resp.release()
        return Response(content, status_code=resp.status, media_type=resp.content_type)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="forwarding-only FastAPI + aiohttp proxy (benchmark reference)")
    ap.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    uvicorn.run(
        create_app(args.upstream.rstrip("/")),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
