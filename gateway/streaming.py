"""A StreamingResponse for relayed streams that always cleans up and tells when the client left.

Starlette's ``StreamingResponse`` never closes its body iterator when the client disconnects
(a generator that had not started never runs its ``finally``), and uvicorn drops what is sent
after a disconnect. :class:`GuardedStreamingResponse` watches ``receive()`` from the start, calls
``on_disconnect()`` before cancelling the body, and on every path closes the body iterator and
awaits ``finalize()``, shielded from cancellation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import anyio
import anyio.lowlevel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
"""Headers of every SSE answer: no caching, and no buffering by a proxy in front (nginx's
``X-Accel-Buffering``), so each event reaches the client as it is sent."""


class GuardedStreamingResponse(StreamingResponse):
    """``StreamingResponse(content)`` plus two callbacks (see the module docstring):

    * ``on_disconnect()``: called once, synchronously, when the client goes away while the
      response is being sent (or already had before it started);
    * ``finalize()``: awaited exactly once after the body iterator was closed, on every path
      (normal end, disconnect, error, server shutdown), shielded from cancellation.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        on_disconnect: Callable[[], None],
        finalize: Callable[[], Awaitable[None]],
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
    ) -> None:
        super().__init__(content, status_code=status_code, headers=headers, media_type=media_type)
        self._content = content
        self._on_disconnect = on_disconnect
        self._finalize = finalize

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            try:
                async with anyio.create_task_group() as tg:

                    async def watch() -> None:
                        await self.listen_for_disconnect(receive)
                        self._on_disconnect()
                        tg.cancel_scope.cancel()

                    tg.start_soon(watch)
                    # one turn of the loop: a client that already left is noticed before streaming
                    await anyio.lowlevel.checkpoint()
                    await self.stream_response(send)
                    tg.cancel_scope.cancel()
            except BaseExceptionGroup as group:  # anyio wraps; re-raise a lone exception as itself
                if len(group.exceptions) != 1:
                    raise
                exc = group.exceptions[0]
                raise exc from exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self._content, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self._finalize()
        if self.background is not None:
            await self.background()
