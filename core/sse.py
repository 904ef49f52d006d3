"""The hub's SSE face: one function turns a hub subscription into an SSE response.

Every event carries its hub id as the SSE `id:`, so a browser's EventSource
(or any client sending `Last-Event-ID`, or `?lastEventId=` for clients that
cannot set headers) resumes exactly after the last event it saw. The payload is
the UI stream protocol object (`{"type": "text-delta", ...}`) as `data:`, so
`EventSource.onmessage` receives every event.

When the id asked for cannot be honoured (not a number, older than what the
buffer still holds, or newer than anything it ever had), the client first gets
a `reset` event with the reason, then the whole buffered history: never a
silent gap.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from core.hub import StreamHub, SubscriberOverflow, Subscription

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
RETRY_MS = 2000
PING_S = 15


def last_event_id(request: Request) -> str | None:
    """The id to resume after: the `Last-Event-ID` header, else the `lastEventId` query parameter."""
    return request.headers.get("last-event-id") or request.query_params.get("lastEventId")


def hub_sse_response(hub: StreamHub, key: str, resume_after: str | None) -> EventSourceResponse:
    """An SSE response of the buffer `key`, resuming after `resume_after` (raw header value).

    The caller has checked that the buffer exists and that the client may read it.
    """
    subscription, reset_reason = _subscribe(hub, key, resume_after)
    return EventSourceResponse(
        _events(subscription, reset_reason),
        headers=SSE_HEADERS,
        ping=PING_S,
        send_timeout=30,
    )


def _subscribe(hub: StreamHub, key: str, resume_after: str | None) -> tuple[Subscription, str | None]:
    if resume_after is None or resume_after == "":
        return hub.subscribe(key), None
    try:
        after = int(resume_after)
    except ValueError:
        return hub.subscribe(key), f"Last-Event-ID {resume_after!r} is not a number"
    subscription = hub.subscribe(key, after=after)
    if subscription.gap:
        subscription.close()
        return hub.subscribe(key), f"events after {after} are no longer buffered"
    if subscription.ahead:
        subscription.close()
        return hub.subscribe(key), f"event {after} does not belong to this stream"
    return subscription, None


async def _events(subscription: Subscription, reset_reason: str | None) -> AsyncIterator[ServerSentEvent]:
    try:
        if reset_reason is not None:
            yield ServerSentEvent(data=_json({"type": "reset", "reason": reset_reason}), event="reset", retry=RETRY_MS)
        first = True
        async for event in subscription:
            yield ServerSentEvent(
                data=_json(event.as_dict()), id=str(event.id), retry=RETRY_MS if first else None
            )
            first = False
    except SubscriberOverflow as exc:
        yield ServerSentEvent(data=_json({"type": "overflow", "reason": str(exc)}), event="overflow")
    finally:
        subscription.close()


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
