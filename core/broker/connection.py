"""One remote agent dialed in over the `/a2a` WebSocket (seed 003 `AgentConnection`).

The connection is a JSON-RPC client on a line transport: every request gets the
next integer id, and responses are routed back by id, so any number of tasks
stream over one socket at once. A task is a `message/stream` request whose id
receives many responses (Task, status-update, artifact-update) until one is
final; a later response for that id is dropped as unknown.

`AgentConnection` is also the registry's `RemoteAgent` (kind 'ws'): `stream()`
is what delegation from the app's chat calls, and cancelling its iteration
sends `tasks/cancel` to the agent.

Transport-free on purpose: the route feeds frames in with `feed()` and gives a
`send` coroutine for lines out, so this module never sees Starlette.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from core import tracing
from core.broker import wire
from core.broker.auth import Identity
from core.delegation.registry import Asker, RemoteAgentError, RemoteEvent
from core.errors import AppError
from core.i18n import _
from core.settings import Settings
from core.web.logtext import loggable

log = logging.getLogger(__name__)

MAX_QUEUED_EVENTS = 10_000  # per task: a consumer this far behind is failed, the agent is not blocked


class TaskIdleError(AppError):
    """No event for `task_idle_timeout`; the agent is presumed stuck.

    Not a TimeoutError on purpose: callers with their own deadlines (`asyncio.timeout`)
    must be able to tell the two apart.
    """

    code = "task_idle"


class RpcError(RemoteAgentError):
    """The agent answered a request with a JSON-RPC error."""

    code: int  # type: ignore[assignment]  # JSON-RPC's error number here, not AppError's string code

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"error {code}: {message}")
        self.code = code


@dataclass(slots=True)
class ConnectionStats:
    """Counters shared by every connection (the broker's `/a2a/stats`)."""

    lines_in: int = 0
    lines_malformed: int = 0
    lines_oversized: int = 0
    unknown_responses: int = 0
    agent_requests: int = 0
    bad_events: int = 0
    events_in: int = 0


_CLOSED = object()
_OVERFLOW = object()


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[wire.Incoming] | None = None
    queue: asyncio.Queue[Any] | None = None
    late_cancel: bool = False  # stream given up before the agent named its task: cancel on first sight


class AgentConnection:
    """A connected remote agent: its identity, card and the requests in flight."""

    kind = "ws"

    def __init__(
        self,
        identity: Identity,
        *,
        send: Callable[[str], Awaitable[None]],
        settings: Settings,
        stats: ConnectionStats | None = None,
        remote_addr: str | None = None,
    ) -> None:
        self.id = identity.a2a_id
        self.binding = identity.agent_id
        self.card_url = identity.card_url
        self.remote_addr = remote_addr
        self.name = identity.a2a_id
        self.description = ""
        self.agent_card: wire.AgentCard | None = None
        self.tool: dict[str, Any] | None = None
        self.connected_at = time.time()
        self.settings = settings
        self.stats = stats or ConnectionStats()
        self.v1 = False  # answer `message/stream` with "method not found" and we switch to v1.0 names
        self.closed: str | None = None
        self._send = send
        self._send_lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._side_tasks: set[asyncio.Task[Any]] = set()

    # -- identity ------------------------------------------------------------------------------

    def set_card(self, card: wire.AgentCard) -> None:
        """Adopt the agent's card: its name and description, and the tool built from it."""
        self.agent_card = card
        self.name, self.description = card.name, card.description
        self.v1 = card.v1
        self.tool = wire.tool_definition(self.id, card)

    def visible_to(self, agent_id: Any) -> bool:
        """Bound agents serve only their chat agent; unbound (global) agents serve everyone."""
        return self.binding is None or (agent_id is not None and str(agent_id) == self.binding)

    def card(self) -> dict[str, Any]:
        """What the registry shows (RemoteAgent protocol)."""
        skills = [s.as_dict() for s in self.agent_card.skills] if self.agent_card else []
        return {"name": self.name, "description": self.description, "skills": skills}

    # -- lines in --------------------------------------------------------------------------------

    async def feed(self, frame: str) -> None:
        """Handle one frame from the agent: each line is a response to route, or an error to report."""
        limit = self.settings.broker_max_line_bytes
        for line in wire.split_lines(frame):
            self.stats.lines_in += 1
            if len(line) * 4 > limit and len(line.encode("utf-8")) > limit:
                self.stats.lines_oversized += 1
                log.warning("%s: dropped a line of %d bytes (limit %d)", self.id, len(line.encode("utf-8")), limit)
                await self._reply(
                    wire.error_response(
                        wire.INVALID_REQUEST, f"line too long: {len(line.encode('utf-8'))} bytes, the limit is {limit}"
                    )
                )
                continue
            try:
                message = wire.decode(line)
            except wire.RpcLineError as exc:
                self.stats.lines_malformed += 1
                log.warning("%s: dropped a bad line (%s): %s", self.id, loggable(exc), loggable(line))
                await self._reply(wire.error_response(exc.code, str(exc), exc.id))
                continue
            if message.kind == "response":
                self._route(message)
            else:
                self.stats.agent_requests += 1
                if message.kind == "request":
                    await self._reply(
                        wire.error_response(
                            wire.METHOD_NOT_FOUND, f"the broker serves no methods (got {message.method!r})", message.id
                        )
                    )

    def _route(self, message: wire.Incoming) -> None:
        key = message.id
        if isinstance(key, str) and key.isdigit():
            key = int(key)
        pending = self._pending.get(key) if isinstance(key, int) and not isinstance(key, bool) else None
        if pending is None:
            self.stats.unknown_responses += 1
            log.debug("%s: dropped a response for unknown or finished id %s", self.id, loggable(repr(message.id), 80))
            return
        if pending.future is not None:
            del self._pending[key]
            if not pending.future.done():
                pending.future.set_result(message)
        elif pending.late_cancel:
            task_id = _task_id_of(message)
            if task_id is not None:
                del self._pending[key]
                self._spawn_cancel(task_id)
        else:
            assert pending.queue is not None
            if pending.queue.qsize() >= MAX_QUEUED_EVENTS:
                del self._pending[key]
                pending.queue.put_nowait(_OVERFLOW)
                return
            pending.queue.put_nowait(message)

    # -- lines out -------------------------------------------------------------------------------

    async def _send_line(self, message: dict[str, Any]) -> None:
        if self.closed is not None:
            raise ConnectionError(f"{self.name} is disconnected ({self.closed})")
        async with self._send_lock:
            await self._send(wire.encode(message))

    async def _reply(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # a peer that is going away cannot be told off
            await self._send_line(message)

    async def request(self, method: str, params: dict[str, Any], *, timeout_s: float) -> Any:
        """One request, one response.

        Raises:
            RpcError: the agent answered with an error.
            TimeoutError: no answer within `timeout_s`.
            ConnectionError: the agent disconnected.
        """
        rpc_id = next(self._ids)
        future: asyncio.Future[wire.Incoming] = asyncio.get_running_loop().create_future()
        self._pending[rpc_id] = _Pending(future=future)
        try:
            await self._send_line(wire.request(rpc_id, method, params))
            async with asyncio.timeout(timeout_s):
                message = await future
        finally:
            self._pending.pop(rpc_id, None)
        if message.error is not None:
            raise RpcError(message.error["code"], str(message.error.get("message", "")))
        return message.result

    async def fetch_card(self, *, timeout_s: float) -> wire.AgentCard:
        """Ask the agent for its card, trying the v0.3 and v1.0 method names in turn.

        Raises:
            wire.WireError: the card lacks required fields. RpcError, TimeoutError, ConnectionError: as `request`.
        """
        for i, method in enumerate(wire.CARD_METHODS):
            try:
                return wire.parse_card(await self.request(method, {}, timeout_s=timeout_s))
            except RpcError as exc:
                if exc.code != wire.METHOD_NOT_FOUND or i == len(wire.CARD_METHODS) - 1:
                    raise
        raise AssertionError("unreachable")

    # -- tasks -------------------------------------------------------------------------------------

    def open_task(self, text: str, *, task_id: str, context_id: str | None = None) -> TaskStream:
        """A new task for the agent; iterate `events()` to send it and read its events."""
        return TaskStream(self, text, task_id=task_id, context_id=context_id)

    async def stream(
        self, text: str, *, task_id: str, context_id: str | None = None, ask: Asker | None = None
    ) -> AsyncIterator[RemoteEvent]:
        """Run a task for the registry (RemoteAgent protocol): plain events until the final one.

        An agent that asks back (`input-required`, `auth-required`) is answered through `ask`
        (issue 36): the answer goes into its task (its taskId and contextId) and its stream is
        read on. Without `ask`, the question ends the task as its answer.
        """
        answer = wire.Answer()
        task = self.open_task(text, task_id=task_id, context_id=context_id)
        while True:
            asked: wire.WireEvent | None = None
            async for event in self._relay(task, answer, asking=ask is not None):
                if isinstance(event, wire.WireEvent):
                    asked = event
                else:
                    yield event
            if asked is None or ask is None:
                return
            remote_task, remote_context = task.remote_task_id, task.remote_context_id or context_id
            try:
                reply = await ask(asked.state or "input-required", asked.text)
            except asyncio.CancelledError:
                if remote_task is not None and self.closed is None:
                    self._spawn_cancel(remote_task)  # it waits for an answer that will not come
                raise
            task = TaskStream(self, reply, task_id=task_id, context_id=remote_context, continues=remote_task)

    async def _relay(
        self, task: TaskStream, answer: wire.Answer, *, asking: bool
    ) -> AsyncIterator[RemoteEvent | wire.WireEvent]:
        """One request's events as `RemoteEvent`s; a question back (when `asking`) as its `WireEvent`, last."""
        async with contextlib.aclosing(task.events()) as events:
            try:
                async for event in events:
                    if asking and event.final and event.state in wire.INTERRUPTED_STATES:
                        yield event
                        return
                    failed = event.state in {"failed", "rejected"}
                    if event.kind == "artifact":
                        answer.add_artifact(event)
                    yield RemoteEvent(
                        text=wire.answer_piece(event),
                        state="failed" if failed else event.state,
                        final=event.final,
                        error=(event.text or f"{self.name} reported that the task failed") if failed else None,
                        answer=(answer.text(event) or None) if event.final and not failed else None,
                    )
            except TaskIdleError as exc:
                raise RemoteAgentError(str(exc)) from exc

    def _spawn_cancel(self, task_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self._cancel_remote(task_id), name=f"cancel {task_id}")
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def _cancel_remote(self, task_id: str) -> None:
        method = wire.CANCEL_METHOD_V10 if self.v1 else wire.CANCEL_METHOD_V03
        try:
            await self.request(method, {"id": task_id}, timeout_s=self.settings.request_timeout / 1000)
        except (RpcError, TimeoutError, ConnectionError) as exc:
            log.info("%s: tasks/cancel for %s: %s", self.id, task_id, loggable(exc))

    def _register_stream(self) -> tuple[int, asyncio.Queue[Any]]:
        rpc_id = next(self._ids)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._pending[rpc_id] = _Pending(queue=queue)
        return rpc_id, queue

    def _unregister(self, rpc_id: int | None, *, late_cancel: bool = False) -> None:
        if rpc_id is None:
            return
        pending = self._pending.pop(rpc_id, None)
        if late_cancel and pending is not None and self.closed is None:
            # The agent has not named its task yet: cancel it when it does, if it does soon.
            self._pending[rpc_id] = _Pending(late_cancel=True)
            asyncio.get_running_loop().call_later(self.settings.request_timeout / 1000, self._drop_late, rpc_id)

    def _drop_late(self, rpc_id: int) -> None:
        pending = self._pending.get(rpc_id)
        if pending is not None and pending.late_cancel:
            del self._pending[rpc_id]

    @property
    def in_flight(self) -> int:
        """Requests and streams waiting for the agent."""
        return len(self._pending)

    # -- end ---------------------------------------------------------------------------------------

    def close(self, reason: str) -> None:
        """The socket is gone: fail every request and stream in flight."""
        if self.closed is not None:
            return
        self.closed = reason
        pending, self._pending = self._pending, {}
        for item in pending.values():
            if item.future is not None and not item.future.done():
                item.future.set_exception(ConnectionError(f"{self.name} disconnected ({reason})"))
            elif item.queue is not None:
                item.queue.put_nowait(_CLOSED)
        for task in list(self._side_tasks):
            task.cancel()


def _task_id_of(message: wire.Incoming) -> str | None:
    if message.error is not None:
        return None
    try:
        return wire.parse_stream_result(message.result).task_id
    except wire.WireError:
        return None


@dataclass(slots=True)
class TaskStream:
    """One `message/stream` task on a connection."""

    conn: AgentConnection
    text: str
    task_id: str
    context_id: str | None = None
    remote_task_id: str | None = None
    continues: str | None = None  # the agent's task this message goes on with (an answer to its question)
    remote_context_id: str | None = None
    events_seen: int = 0
    done: bool = False
    _rpc_id: int | None = field(default=None, repr=False)
    _queue: asyncio.Queue[Any] | None = field(default=None, repr=False)

    async def _send(self) -> None:
        self._rpc_id, self._queue = self.conn._register_stream()
        await self.conn._send_line(
            wire.stream_request(
                self._rpc_id,
                self.text,
                message_id=str(uuid.uuid4()),  # seed 003: "messageId": "<uuid>"
                context_id=self.context_id,
                v1=self.conn.v1,
                task_id=self.continues,
                metadata=tracing.carrier() or None,  # `traceparent`, for an agent that continues the trace
            )
        )

    async def _next(self) -> Any:
        assert self._queue is not None
        if not self._queue.empty():
            return self._queue.get_nowait()
        idle_s = self.conn.settings.task_idle_timeout / 1000
        try:
            return await asyncio.wait_for(self._queue.get(), idle_s)
        except TimeoutError:
            raise TaskIdleError(
                _("{name} sent no progress for {seconds} s").format(name=self.conn.name, seconds=f"{idle_s:g}")
            ) from None

    async def events(self) -> AsyncGenerator[wire.WireEvent, None]:
        """Send the task, then yield its events; the last one is final.

        Raises:
            TaskIdleError: no event within `task_idle_timeout`.
            ConnectionError: the agent disconnected.
            RpcError / RemoteAgentError: the agent answered with an error, or its events could not be kept up with.
        """
        conn = self.conn
        try:
            await self._send()
            while True:
                item = await self._next()
                if item is _CLOSED:
                    self.done = True
                    raise ConnectionError(f"{conn.name} disconnected ({conn.closed})")
                if item is _OVERFLOW:
                    self._rpc_id = None
                    raise RemoteAgentError(f"{conn.name} sent more than {MAX_QUEUED_EVENTS} events ahead of the relay")
                if item.error is not None:
                    code = item.error["code"]
                    if code == wire.METHOD_NOT_FOUND and not self.events_seen and not conn.v1:
                        log.info("%s does not know message/stream; switching to A2A 1.0 method names", conn.id)
                        conn._unregister(self._rpc_id)
                        conn.v1 = True
                        await self._send()
                        continue
                    self.done = True
                    conn._unregister(self._rpc_id)
                    raise RpcError(code, str(item.error.get("message", "")))
                try:
                    event = wire.parse_stream_result(item.result)
                except wire.WireError as exc:
                    conn.stats.bad_events += 1
                    log.warning("%s: dropped a bad event of task %s: %s", conn.id, self.task_id, loggable(exc))
                    continue
                conn.stats.events_in += 1
                self.events_seen += 1
                if event.task_id:
                    self.remote_task_id = event.task_id
                if event.context_id:
                    self.remote_context_id = event.context_id
                if event.final:
                    self.done = True
                    conn._unregister(self._rpc_id)  # before yielding: the consumer may never resume us
                yield event
                if event.final:
                    return
        finally:
            if not self.done:
                # Given up early (cancelled, idle, consumer gone): tell the agent, without waiting for it.
                self.done = True
                if conn.closed is None:
                    if self.remote_task_id is not None:
                        conn._unregister(self._rpc_id)
                        conn._spawn_cancel(self.remote_task_id)
                    else:
                        conn._unregister(self._rpc_id, late_cancel=True)
