"""A streamed answer's SSE events, served through the app's SSE module and written in bursts (divergence 3)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from sse_starlette.event import ensure_bytes
from sse_starlette.sse import EventSourceResponse
from starlette.responses import Response

_HOP_HEADERS = {
    "content-type",
    "content-length",
    "transfer-encoding",
    "cache-control",
    "x-accel-buffering",
    "connection",
}


def coalesce_sse(response: Response) -> Response:
    """Serve the SDK's SSE stream through the app's SSE module (`core.streaming.sse.SSEResponse`).

    It brings its headers, keep-alive, write timeout and disconnect handling; events that are ready
    together are written together (Divergence #3). Other responses pass through.
    """
    if isinstance(response, EventSourceResponse):
        from core.streaming.sse import SSEResponse

        headers = {k: v for k, v in response.headers.items() if k.lower() not in _HOP_HEADERS}
        return SSEResponse(_coalesced(response.body_iterator, response.sep), headers=headers)
    return response


_END_OF_STREAM = object()
MAX_EVENTS_PER_WRITE = 512


async def _coalesced(source: Any, sep: str) -> Any:
    """`source`'s SSE events, joined into one bytes chunk per burst of events that were ready together."""
    ready: asyncio.Queue[Any] = asyncio.Queue(maxsize=MAX_EVENTS_PER_WRITE)
    failure: list[BaseException] = []

    async def pump() -> None:
        try:
            async for item in source:
                await ready.put(item)
        except Exception as exc:  # handed to the writer, which raises it where sse-starlette expects it
            failure.append(exc)
        finally:
            with contextlib.suppress(Exception):
                await source.aclose()
        await ready.put(_END_OF_STREAM)  # not when cancelled: then nobody reads any more

    # A plain task, not BackgroundTasks: it lives exactly as long as this response's stream.
    pumping = asyncio.get_running_loop().create_task(pump(), name="a2a sse pump")
    try:
        while True:
            item = await ready.get()
            if item is _END_OF_STREAM:
                break
            chunks = [ensure_bytes(item, sep)]
            while not ready.empty():
                item = ready.get_nowait()
                if item is _END_OF_STREAM:
                    break
                chunks.append(ensure_bytes(item, sep))
            yield b"".join(chunks)
            if item is _END_OF_STREAM:
                break
        if failure:
            raise failure[0]
    finally:
        pumping.cancel()  # the client went away: the source closes (and releases its hub subscription)
