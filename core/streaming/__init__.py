"""Streams of events: the hub's replayable buffers, their SSE face, seed 002's SSEStream and task events.

Owns: `StreamHub` (one bounded buffer per key, replay then live, resume after an id), every byte
of Server-Sent Events the app writes (`sse.py`: `SSEResponse`, `hub_sse_response`; `sse_stream.py`:
the seed's `SSEStream`), seed 002's task events on the hub (`TaskEvents`), and `BackgroundTasks`,
the owned task sets the long-lived services run their work in.

May import: the standard library, starlette and sse-starlette, and `core.aio`; nothing else of `core`, and no
models: streams carry plain dicts, so any part of the app can use them.
"""

from core.streaming.background import BackgroundTasks
from core.streaming.hub import (
    BufferInfo,
    BufferState,
    StreamBusyError,
    StreamClosedError,
    StreamEvent,
    StreamHub,
    SubscriberOverflowError,
    Subscription,
    UnknownStreamError,
)
from core.streaming.sse import SSEDataError, SSEResponse, hub_sse_response, last_event_id
from core.streaming.sse_stream import SSEStream
from core.streaming.task_manager import TaskEvents, TaskSnapshot

__all__ = [
    "BackgroundTasks",
    "BufferInfo",
    "BufferState",
    "SSEDataError",
    "SSEResponse",
    "SSEStream",
    "StreamBusyError",
    "StreamClosedError",
    "StreamEvent",
    "StreamHub",
    "SubscriberOverflowError",
    "Subscription",
    "TaskEvents",
    "TaskSnapshot",
    "UnknownStreamError",
    "hub_sse_response",
    "last_event_id",
]
