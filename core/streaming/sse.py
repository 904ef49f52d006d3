"""Every byte of Server-Sent Events the app writes: the wire, the connection engine, and the hub's SSE face.

One wire and one connection engine (`SSEResponse`, an sse-starlette
`EventSourceResponse`) serve both sources of events:

- `hub_sse_response` (here): one `StreamHub` buffer (a chat turn, `a2a_<taskId>`)
  as an SSE response;
- `SSEStream` (`core/streaming/sse_stream.py`): seed 002's stream object, whose
  events may be sent before any client attaches.

The wire, exactly::

    id: 7
    event: progress
    data: {"taskId":"t1","message":"working","progress":50,"timestamp":"2026-01-01T12:00:00.000Z"}

(a blank line ends each event; multi-line data is sent as several `data:` lines).
The first event of a connection also carries `retry: <ms>`, the reconnect delay
for the client. Keep-alive comments (`: keep-alive`) go out every `keepalive_s`
seconds (default 30). Hub events whose type is in `named` (default: the seed's
`progress`, `state` and `artifact`) are sent as named events with their payload
as data, for `EventSource.addEventListener(type, ...)`; every other hub event is
sent unnamed with data `{"type": ..., **payload}` (the UI stream protocol), for
`EventSource.onmessage`. An `error` event is never named: EventSource uses that
name for its own connection errors.

Resume: every event carries its `id:`. A client that reconnects with
`Last-Event-ID` (header, or `?lastEventId=` for clients that cannot set headers)
receives exactly the events after that id, then live ones. When the id cannot be
honoured (not a number, older than what is still buffered, newer than anything
the stream ever had, so from another stream) the client first gets a `reset`
event with the reason, then the whole buffered history: never a silent gap. A
stream that has ended with nothing left after the client's id is answered
`204 No Content`, which tells an EventSource to stop reconnecting.

Slow clients: each connection has its own bounded queue (`subscriber_queue`). A
connection that falls that far behind receives what was queued, an `overflow`
event (with the `lastEventId` it got to) and the end of the response; it may
reconnect from there. Events queued while a client is busy are sent together in
one write (what makes one connection carry tens of thousands of events/s).

Connection care: a client disconnect is noticed (sse-starlette listens for
`http.disconnect`), a write that fails or stalls past `send_timeout_s` ends the
connection, and neither ever raises into the producer. Responses carry
`Cache-Control: no-cache` and `X-Accel-Buffering: no`; Starlette's
`GZipMiddleware` (the one NiceGUI installs) leaves `text/event-stream` alone, so
nothing is held back to be compressed.

The helpers with a leading underscore that `sse_stream.py` imports (`_notice`,
`_retry_line`, `_parse_resume`, the batch limits) are internal to this package.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send

from core.aio import ReadyBatches, finish_step
from core.errors import AppError
from core.streaming.backend import HubSubscription, StreamHubBackend
from core.streaming.hub import BufferState, StreamEvent, SubscriberOverflowError, UnknownStreamError

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
RETRY_MS = 2000
KEEPALIVE_S = 30.0
SEND_TIMEOUT_S = 30.0
#: Hub event types sent as named SSE events (the seed's typed events).
SEED_EVENT_TYPES: frozenset[str] = frozenset({"progress", "state", "artifact"})
#: An endpoint's own wire shape of hub events: `(type, payload)` for one event (`hub_sse_response`).
Shape = Callable[[StreamEvent], tuple[str, dict[str, Any]]]

# One write carries at most this many queued events, or about this many bytes.
_MAX_BATCH_EVENTS = 512
_MAX_BATCH_BYTES = 64 * 1024

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_lenient_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_KEEPALIVE = ServerSentEvent(comment="keep-alive", sep="\n")

#: Why a connection or a stream ended (`SSEStream.close_reason`).
CLOSED = "closed"  # close() was called
DISCONNECT = "disconnect"  # the client went away
WRITE_ERROR = "write-error"  # a write failed or stalled past send_timeout_s
SHUTDOWN = "shutdown"  # the server is stopping
_CONNECTION_LOST = frozenset({DISCONNECT, WRITE_ERROR, SHUTDOWN})


class SSEDataError(AppError, TypeError):
    """The data of an event cannot be serialised to JSON (raised by the `send_*` call, nothing is sent)."""

    code = "sse_data_error"


def to_json(value: Any, what: str = "data") -> str:
    """Compact JSON (UTF-8 kept as is).

    Raises:
        SSEDataError: `value` cannot be serialised (an unknown type, a circular reference, NaN or infinity).
    """
    try:
        return _encoder.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SSEDataError(f"{what} is not JSON-serialisable ({type(value).__name__}): {exc}") from exc


# -- the wire ---------------------------------------------------------------------------------


def encode_event(data: str, *, event: str | None = None, id: int | str | None = None) -> bytes:
    """One SSE event: `id:`, `event:`, one `data:` line per line of `data`, a blank line."""
    if "\n" in data or "\r" in data:
        data = "\ndata: ".join(_LINE_BREAK.split(data))
    if event is None:
        head = "" if id is None else f"id: {id}\n"
    else:
        head = f"event: {event}\n" if id is None else f"id: {id}\nevent: {event}\n"
    return f"{head}data: {data}\n\n".encode()


def _notice(type_: str, **fields: Any) -> bytes:
    """A `reset` or `overflow` event: named, no id (so the client's last id stays where it was)."""
    return encode_event(_lenient_encoder.encode({"type": type_, **fields}), event=type_)


def _retry_line(retry_ms: int | None) -> bytes:
    if retry_ms is None:
        return b""
    if isinstance(retry_ms, bool) or not isinstance(retry_ms, int) or retry_ms < 0:
        raise ValueError(f"retry_ms must be a non-negative integer or None, got {retry_ms!r}")
    return f"retry: {retry_ms}\n".encode()


def last_event_id(request: Request) -> str | None:
    """The id to resume after: the `Last-Event-ID` header, else the `lastEventId` query parameter."""
    return request.headers.get("last-event-id") or request.query_params.get("lastEventId")


MAX_EVENT_ID = 2**63 - 1  # ids are counters from 1; anything beyond is not one of ours


def _parse_resume(resume_after: str | None) -> tuple[int | None, str | None]:
    """(the id to resume after, or None) and the reason it cannot be used, if so."""
    if resume_after is None or resume_after == "":
        return None, None
    try:
        after = int(resume_after)
    except ValueError:
        return None, f"Last-Event-ID {resume_after[:40]!r} is not a number"
    if not 0 <= after <= MAX_EVENT_ID:
        return None, f"Last-Event-ID {resume_after[:40]!r} is out of range"
    return after, None


def stream_not_found(detail: str = "There is no such stream.") -> JSONResponse:
    """The answer for an unknown stream key: 404 with `{"detail": ...}` (FastAPI's error shape)."""
    return JSONResponse({"detail": detail}, status_code=404)


def nothing_more() -> Response:
    """The answer for an ended stream with nothing after the client's id: 204 (EventSource stops retrying)."""
    return Response(status_code=204, headers=SSE_HEADERS)


# -- the connection engine ----------------------------------------------------------------------


class SSEResponse(EventSourceResponse):
    """sse-starlette's `EventSourceResponse` with this app's headers, keep-alive, write timeout and end hook.

    `content` yields ready-made bytes. `on_end(reason)` runs exactly once when the
    connection is over, whatever ended it (also for a HEAD request, which never
    starts the stream): `"closed"` (the content ended), `"disconnect"`,
    `"write-error"` or `"shutdown"`. A failed or timed-out write is not re-raised:
    the connection is simply over.

    The write timeout (`send_timeout_s`) is armed only when a write has to wait
    (the client reads slower than we send): a write that completes at once, the
    usual case, costs no timer. sse-starlette's own `send_timeout` would arm one
    per write.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        on_end: Callable[[str], None] | None = None,
        keepalive_s: float | None = KEEPALIVE_S,
        send_timeout_s: float | None = SEND_TIMEOUT_S,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            content,
            headers={**SSE_HEADERS, **(headers or {})},
            ping=keepalive_s or 0,
            sep="\n",
            ping_message_factory=lambda: _KEEPALIVE,
        )
        self._on_end = on_end
        self._write_timeout = send_timeout_s

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        # sse-starlette wraps every write in `anyio.move_on_after(send_timeout)`: a cancel scope,
        # with its current-task lookups, for each token even when there is no timeout. This
        # response has none there (`send_timeout` stays None; `_timed` arms its own only when a
        # write has to wait), so a write is just the write, marked when it fails as sse-starlette does.
        if self.send_timeout is not None:
            await super()._send_with_timeout(send, message)
            return
        try:
            await send(message)
        except BaseException:
            self._send_interrupted = True
            raise

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the stream (sse-starlette), then tell `on_end` why it ended."""
        reason: str | None = None
        try:
            await super().__call__(scope, receive, send if self._write_timeout is None else self._timed(send))
        except (OSError, ClientDisconnect):  # a write that failed, or waited longer than send_timeout_s
            reason = WRITE_ERROR
        except asyncio.CancelledError:
            reason = SHUTDOWN
            raise
        finally:
            if reason is None:
                if self._response_complete:  # (uvicorn reports a disconnect once a response is complete)
                    reason = CLOSED
                elif self._client_disconnected:
                    reason = DISCONNECT
                elif self._send_interrupted:
                    reason = WRITE_ERROR
                elif self._response_started and not self._response_complete:
                    reason = SHUTDOWN
                elif not self._response_started and scope.get("method", "GET").upper() != "HEAD":
                    reason = SHUTDOWN
                else:
                    reason = CLOSED
            if self._on_end is not None:
                on_end, self._on_end = self._on_end, None
                try:
                    on_end(reason)
                except Exception:
                    log.exception("SSE end hook failed")

    def _timed(self, send: Send) -> Send:
        timeout = self._write_timeout

        async def timed_send(message: Message) -> None:
            step = send(message)
            try:
                if not inspect.iscoroutine(step):  # some other awaitable: bounded as a whole
                    async with asyncio.timeout(timeout):
                        await step
                    return
                try:
                    yielded = step.send(None)
                except StopIteration:
                    return  # written without waiting: no timer needed
                async with asyncio.timeout(timeout):
                    await finish_step(step, yielded)
            except TimeoutError:
                raise SendTimeoutError(f"a write to the client waited more than {timeout} s") from None

        return timed_send


# -- the hub's SSE face -------------------------------------------------------------------------


def hub_sse_response(
    hub: StreamHubBackend,
    key: str,
    resume_after: str | None,
    *,
    named: Collection[str] = SEED_EVENT_TYPES,
    keepalive_s: float | None = KEEPALIVE_S,
    retry_ms: int | None = RETRY_MS,
    send_timeout_s: float | None = SEND_TIMEOUT_S,
    shape: Shape | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """An SSE response of the hub buffer `key`, resuming after `resume_after` (the raw header value).

    The caller has checked that the client may read the stream. An unknown key
    is answered 404 (JSON); a finished buffer with nothing after the client's id,
    204. Hub events whose type is in `named` are sent as `event: <type>` with
    their payload as data; the others unnamed, as `{"type": ..., **payload}`.
    `shape`, when given, turns each hub event into the `(type, payload)` this
    endpoint sends (an endpoint's own wire shape; ids stay the hub's); `headers`
    are added to the response's.
    """
    info = hub.get(key)
    if info is None:
        return stream_not_found()
    after, reset_reason = _parse_resume(resume_after)
    try:
        subscription = hub.subscribe(key, after=after)
        if subscription.gap or subscription.ahead:
            subscription.close()
            reset_reason = (
                f"events after {after} are no longer buffered"
                if subscription.gap
                else f"event {after} does not belong to this stream"
            )
            subscription, after = hub.subscribe(key), None
    except UnknownStreamError:
        return stream_not_found()
    start = info.first_id if after is None else after + 1
    if info.state is not BufferState.OPEN and reset_reason is None and start > info.last_id:
        subscription.close()
        return nothing_more()
    return SSEResponse(
        _hub_connection(subscription, reset_reason, frozenset(named), _retry_line(retry_ms), after or 0, shape),
        on_end=lambda _reason: subscription.close(),
        keepalive_s=keepalive_s,
        send_timeout_s=send_timeout_s,
        headers=headers,
    )


def _hub_frame(event: StreamEvent, named: frozenset[str], shape: Shape | None = None) -> bytes:
    kind, data = shape(event) if shape is not None else (event.type, event.data)
    if kind in named:
        payload: Any = data
        name: str | None = kind
    else:
        payload = {"type": kind, **data}
        name = None
    try:
        text = _encoder.encode(payload)
    except (TypeError, ValueError, RecursionError):
        log.exception(
            "hub event %d (%s) is not JSON-serialisable; sent with str() for unknown values", event.id, event.type
        )
        text = _lenient_encoder.encode(payload)
    return encode_event(text, event=name, id=event.id)


async def _hub_connection(
    subscription: HubSubscription,
    reset_reason: str | None,
    named: frozenset[str],
    prefix: bytes,
    after: int,
    shape: Shape | None = None,
) -> AsyncIterator[bytes]:
    last_id = after
    batches = ReadyBatches(subscription, _MAX_BATCH_EVENTS)
    try:
        if reset_reason is not None:
            yield prefix + _notice("reset", reason=reset_reason)
            prefix = b""
        try:
            async for events in batches:
                last_id = events[-1].id
                chunk = (
                    b"".join([_hub_frame(event, named, shape) for event in events])
                    if len(events) > 1
                    else _hub_frame(events[0], named, shape)
                )
                if prefix:
                    chunk = prefix + chunk
                    prefix = b""
                yield chunk
        except SubscriberOverflowError as exc:
            yield prefix + _notice("overflow", reason=str(exc), lastEventId=last_id)
    finally:
        batches.close()
        subscription.close()
