"""Noticing a client that leaves while the gateway waits for the upstream (before any response).

Starlette does not cancel an endpoint when its client goes; once the request body was read, the
next ASGI ``receive()`` returns only at ``http.disconnect``. :func:`unless_client_leaves` races
the upstream work against that, so a gone client frees the upstream and the route slot at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the work it was waiting for finished (the work was
    cancelled)."""


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when ``receive()`` reports ``http.disconnect``. Call only after the request body
    was read (other messages are skipped)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_client_leaves(receive: Receive, work: Awaitable[T]) -> T:
    """Run ``work`` (a coroutine, or a future/task: cancelling an ``asyncio.shield`` of a task
    leaves the task running) while watching ``receive`` for the client's disconnect.

    Returns ``work``'s result or raises its exception. When the client leaves first, ``work`` is
    cancelled and awaited until it has unwound, then :class:`ClientGone` is raised (unless
    ``work`` finished anyway: its result wins). When the calling task is cancelled, ``work`` is
    cancelled and awaited too. Should ``receive()`` itself fail, the watch stops and ``work``
    runs to its end."""
    job = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait({job, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not job.done():
            if watch.exception() is None:  # the client left
                job.cancel()
            await asyncio.wait({job})
            if job.cancelled():
                raise ClientGone
        return job.result()
    finally:
        watch.cancel()
        if not job.done():  # this task was cancelled: stop the work and let it unwind
            job.cancel()
            await asyncio.wait({job})
