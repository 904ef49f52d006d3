"""Standard A2A for every agent in the registry: cards and JSON-RPC at `/a2a/agents/{id}`.

Here, about 410 lines: `A2AServer` (the endpoint) and `AgentRequestHandler` (the SDK's request
handler over our delegations), which change together when the SDK does. The other a2a-sdk server
interfaces of this endpoint are beside it: the cards (`core/a2a/agent_cards.py`) and the task store
over `a2a_task_sessions` (`core/a2a/task_store.py`); the wire is the package `core/a2a/protocol/`.

    GET  /a2a/agents/{id}/.well-known/agent-card.json   public card (v1.0; v0.3 with `A2A-Version: 0.3`)
    GET  /.well-known/agent-card.json                    the same for the default agent (`DEFAULT_AGENT`)
    POST /a2a/agents/{id}                                JSON-RPC: v1.0 (A2A-Version: 1.0) and v0.3

Local agents (database) and remote ones (`AgentRegistry`) are looked up by id
on every request, so an agent added at run time is served at once.

A call from outside is a delegation like any other (`DelegationService.
start_external_task`): a row of `a2a_task_sessions` owned by the API key's
user, a hidden session with `source='a2a'` messages, the hub buffer
`a2a_<taskId>`, the audit view. Those rows are the task store
(`TaskSessionStore`, `core/a2a/task_store.py`): `GetTask` reads them, so it answers after a restart; a
stream (`SendStreamingMessage`, `SubscribeToTask`) follows the task's hub
buffer and turns its events into A2A events:

    text-delta {delta}        → status update WORKING carrying the delta as an agent message
    state {completed}         → artifact `result` with the full saved answer, then status COMPLETED
    state {failed|canceled}   → status FAILED / CANCELED with the error as its message

Who may call: every JSON-RPC request needs an API key (`core/a2a/api_keys.py`, also
in single-user mode); without one the answer is HTTP 401. A key sees only its
user's tasks; another user's task id is answered as unknown (-32001), so ids
cannot be probed. Only tasks started over A2A can be canceled over A2A; a
delegation started by a chat is stopped from that chat.

Bad input gets the spec's codes from the SDK's dispatcher (-32700 parse,
-32600 request, -32601 method, -32602 params, -32009 version, -32001 task not
found, -32002 not cancelable, -32004 unsupported, -32005 content type) with a
message that says what to change; a key whose user has too many tasks running
gets the app's -32029 (`wire.TooManyRunningTasksError`, try again later). Bodies over `MAX_BODY_BYTES` are refused
before they are read to the end.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Message

from core.a2a import api_keys
from core.a2a import protocol as wire
from core.a2a.agent_cards import AgentCards
from core.a2a.task_store import TaskSessionStore, row_snapshot
from core.aio import ReadyBatches
from core.chat import attachments
from core.chat.artifacts import strip_blocks
from core.delegation.service import DelegationRefusedError, DelegationService, TooManyDelegatedTasksError
from core.delegation.tasks import TERMINAL_STATES, WORKING, task_stream_key
from core.delegation.tool import MAX_INPUT_CHARS
from core.settings import Settings
from core.streaming import events as ev
from core.streaming.backend import StreamHubBackend
from core.streaming.hub import SubscriberOverflowError, UnknownStreamError
from core.streaming.redis_hub import refresh
from core.web.input_limits import read_capped
from models import A2ATaskSession

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1_048_576
#: At most this many text deltas that were ready together go out as one status update.
MAX_DELTAS_PER_UPDATE = 256
# What a message with a contextId this caller does not have gets (-32602), also said on every card.
UNKNOWN_CONTEXT = (
    "There is no context {context_id!r} for this agent and key: send the contextId of one of your "
    "earlier tasks with this agent to continue that conversation, or none to start a new one."
)


class A2AServer:
    """The two routes' work: cards, key check, body limit, then the SDK's JSON-RPC dispatcher.

    Args:
        services: the app's services (db, hub, registry, delegation, settings, api_keys).
    """

    def __init__(self, services: Any) -> None:
        self.db = services.db
        self.api_keys: api_keys.ApiKeys = services.api_keys
        self.settings: Settings = services.settings
        self.cards = AgentCards(services.db, services.registry, services.settings)
        self.store = TaskSessionStore(services.db)
        self.handler = AgentRequestHandler(
            delegation=services.delegation,
            hub=services.hub,
            store=self.store,
            cards=self.cards,
        )
        self.dispatcher = wire.create_dispatcher(self.handler)

    async def card_response(self, agent_id: str, request: Request) -> Response:
        """The agent's public card (no key needed), with a weak ETag.

        A v1.0 card unless the client asks for v0.3 (`A2A-Version: 0.3`, as a header or a query
        parameter): one document cannot be both (`protocol.card_json`).
        """
        spec = await self.cards.spec(agent_id)
        if spec is None:
            return JSONResponse({"detail": f"There is no agent {agent_id!r}."}, status_code=404)
        version = request.headers.get(wire.VERSION_HEADER) or request.query_params.get(wire.VERSION_HEADER)
        body = wire.card_json(wire.build_card(spec), version=version)
        etag = 'W/"' + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32] + '"'
        headers = {"ETag": etag, "Vary": wire.VERSION_HEADER}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return JSONResponse(body, headers=headers)

    async def root_card_response(self, request: Request) -> Response:
        """The card at the server root (`/.well-known/agent-card.json`): the default agent's (`DEFAULT_AGENT`)."""
        return await self.card_response(self.settings.default_agent, request)

    async def rpc_response(self, agent_id: str, request: Request) -> Response:
        """Check the key and the body, then hand the request to the dispatcher."""
        user_id = await self._authenticate(request)
        if user_id is None:
            return JSONResponse(
                wire.invalid_request_body(
                    "Unauthorized: send an API key of this app as 'Authorization: Bearer <key>' "
                    f"(create one at {self.settings.base_url}/api-keys)."
                ),
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="a2a"'},
            )
        if not await self.cards.exists(agent_id):
            return JSONResponse(
                wire.invalid_request_body(f"There is no agent {agent_id!r} on this server."), status_code=404
            )
        body = await _read_body(request, MAX_BODY_BYTES)
        if body is None:
            return JSONResponse(
                wire.invalid_request_body(f"Payload too large: the request body is over {MAX_BODY_BYTES:,} bytes.")
            )
        refusal = wire.check_rpc_body(body, self.dispatcher, request.headers.get(wire.VERSION_HEADER))
        if refusal is not None:  # what the SDK would answer with -32603 and a traceback in the log
            return JSONResponse(refusal)
        request.state.a2a_user_id = user_id
        return wire.coalesce_sse(await self.dispatcher.handle_requests(_with_body(request, body)))

    async def _authenticate(self, request: Request) -> int | None:
        token = api_keys.bearer_token(request.headers.get("authorization"))
        if token is None:
            return None
        key = await self.api_keys.authenticate(token)
        return key.user_id if key is not None else None


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is known to exceed `limit` (Content-Length, or while reading)."""
    return await read_capped(request.stream(), limit, request.headers.get("content-length"))


def _with_body(request: Request, body: bytes) -> Request:
    """The same request, its body already read (the dispatcher reads it again)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await request.receive()

    return Request(request.scope, receive)


# -- the request handler -------------------------------------------------------------------


class AgentRequestHandler(wire.RequestHandler):
    """The SDK's `RequestHandler` over our delegations; the agent is `context.state['agent_id']`.

    Implemented here rather than with the SDK's `DefaultRequestHandler` + an executor:
    that handler keeps its own copy of each task and saves the whole Task on every
    event, while ours already has the task (its row) and its stream (the hub buffer).

    The streams yield `AsyncGenerator[Any, None]`, wider than the SDK's union of event types: a v1.0
    stream also yields `wire.TextUpdate`s, which the app's dispatcher writes itself (divergence 4).
    """

    def __init__(
        self, *, delegation: DelegationService, hub: StreamHubBackend, store: TaskSessionStore, cards: AgentCards
    ) -> None:
        self.delegation = delegation
        self.hub = hub
        self.store = store
        self.cards = cards

    # -- sending ----------------------------------------------------------------

    async def on_message_send(self, params: Any, context: wire.ServerCallContext) -> wire.Task:
        """Start a task; answer with it when it ends (or at once with `returnImmediately`)."""
        incoming = wire.read_send_request(params, max_chars=MAX_INPUT_CHARS)
        agent_id, user_id = _caller(context)
        task = await self._start(agent_id, user_id, incoming)
        if incoming.return_immediately:
            return wire.to_task(row_snapshot(task, ""), history_length=incoming.history_length)
        await self.delegation.wait_external_task(task.id)
        snap = await self.store.snapshot(task.id, user_id=user_id, agent_id=agent_id)
        assert snap is not None, "this caller's task, which it just started"
        return wire.to_task(snap, history_length=incoming.history_length)

    async def on_message_send_stream(self, params: Any, context: wire.ServerCallContext) -> AsyncGenerator[Any, None]:
        """Start a task and stream it: the Task, text as it is generated, the result, the end state."""
        incoming = wire.read_send_request(params, max_chars=MAX_INPUT_CHARS)
        agent_id, user_id = _caller(context)
        snap = row_snapshot(await self._start(agent_id, user_id, incoming), "")  # as written: nothing to read back
        yield wire.to_task(snap, history_length=incoming.history_length)
        async for event in self._follow(snap, context):
            yield event

    async def _store_files(self, files: tuple[Any, ...], user_id: int) -> list[dict[str, Any]]:
        """Store a message's file parts for the key's user (checked as uploads are); the refs its task carries."""
        settings, refs = self.cards.settings, []
        for file in files:
            try:
                name, mime = attachments.check_upload(
                    file.name,
                    file.mime,
                    len(file.data),
                    max_bytes=settings.upload_max_bytes,
                    allowed=settings.upload_allowed_types,
                )
            except attachments.AttachmentError as exc:
                raise wire.ContentTypeNotSupportedError(message=exc.message) from None
            row = await attachments.save(
                self.delegation.db, user_id=user_id, session_id=None, name=name, mime=mime, data=file.data
            )
            refs.append(attachments.ref_of(row))
        return refs

    async def _start(self, agent_id: str, user_id: int, incoming: wire.IncomingMessage) -> A2ATaskSession:
        """Start the task a message asks for: a new context, or the next task in one of the caller's (§3.4).

        Returns the task's row as it started (`submitted`).
        """
        if incoming.task_id is not None:
            snap = await self.store.snapshot(incoming.task_id, user_id=user_id, agent_id=agent_id)
            if snap is None:
                raise wire.TaskNotFoundError(message=f"There is no task {incoming.task_id!r} for this agent and key.")
            if incoming.context_id is not None and incoming.context_id != snap.context_id:
                raise wire.InvalidParamsError(
                    message=f"Task {snap.id} belongs to context {snap.context_id!r}, not {incoming.context_id!r}: "
                    "send the task's own contextId, or none."
                )
            raise wire.UnsupportedOperationError(
                message=f"Task {incoming.task_id} is {wire.state_name(snap.state)}; this agent does not take "
                "follow-up messages in a task. Send the message without taskId to start a new task "
                f"(with contextId {snap.context_id!r} to continue the same conversation)."
            )
        if incoming.context_id is not None:
            running = await self.store.context_running_task(incoming.context_id, user_id=user_id, agent_id=agent_id)
            if running is None:
                raise wire.InvalidParamsError(message=UNKNOWN_CONTEXT.format(context_id=incoming.context_id[:80]))
            if running:
                raise wire.UnsupportedOperationError(
                    message=f"Task {running} of context {incoming.context_id!r} is still running: wait for its end "
                    "(SubscribeToTask) or cancel it before sending the next message in this context."
                )
        files = await self._store_files(incoming.files, user_id)
        try:
            return await self.delegation.start_external_task(
                agent_id,
                incoming.text,
                user_id=user_id,
                session_id=incoming.context_id,
                message_id=incoming.message_id or None,
                files=files,
            )
        except (
            TooManyDelegatedTasksError
        ) as exc:  # -32029: try again later (docs/ARCHITECTURE.md, "Running work per user")
            raise wire.TooManyRunningTasksError(
                message=str(exc), data={"code": exc.code, "retryAfterSeconds": exc.retry_after_s}
            ) from exc
        except DelegationRefusedError as exc:
            raise wire.InvalidParamsError(message=str(exc)) from exc

    # -- reading and following --------------------------------------------------

    async def on_get_task(self, params: Any, context: wire.ServerCallContext) -> wire.Task | None:
        """The task from the database (answers after a restart too)."""
        history_length = wire.read_history_length(params)
        agent_id, user_id = _caller(context)
        snap = await self.store.snapshot(params.id, user_id=user_id, agent_id=agent_id)
        if snap is None:
            raise wire.TaskNotFoundError(message=f"There is no task {params.id!r} for this agent and key.")
        return wire.to_task(snap, history_length=history_length)

    async def on_list_tasks(self, params: Any, context: wire.ServerCallContext) -> wire.ListTasksResponse:
        """This key's tasks for this agent, newest first."""
        return await self.store.list(params, context)

    async def on_subscribe_to_task(self, params: Any, context: wire.ServerCallContext) -> AsyncGenerator[Any, None]:
        """Follow a running task: its Task, then everything it streamed so far and from now on."""
        agent_id, user_id = _caller(context)
        snap = await self.store.snapshot(params.id, user_id=user_id, agent_id=agent_id)
        if snap is None:
            raise wire.TaskNotFoundError(message=f"There is no task {params.id!r} for this agent and key.")
        if snap.state in TERMINAL_STATES:
            raise wire.UnsupportedOperationError(
                message=f"Task {snap.id} is in terminal state: {wire.state_name(snap.state)}; "
                "there is nothing more to stream. Read it with GetTask."
            )
        if await refresh(self.hub, task_stream_key(snap.id)) is None:
            raise wire.UnsupportedOperationError(
                message=f"Task {snap.id} is not running on this server any more (it was interrupted, "
                "for example by a restart); read what it has with GetTask."
            )
        yield wire.to_task(snap)
        async for event in self._follow(snap, context):
            yield event

    async def _follow(self, snap: wire.TaskSnapshot, context: wire.ServerCallContext) -> AsyncIterator[Any]:
        """The task's hub buffer as A2A events, from its first event, until its terminal state.

        Text deltas that are ready together (a replay, or a busy event loop that let several pile up)
        go out as one status update with their text joined: the same text in fewer events, so a
        loaded server spends less per token exactly when it has the least to spare. When the stream
        writes them itself (`wire.PLAIN_TEXT_UPDATES` in `context`), they are `wire.TextUpdate`s, not protobuf.
        """
        agent_id, user_id = _caller(context)
        events = wire.TaskEvents(snap.id, snap.context_id)
        text_event = events.text_update if context.state.get(wire.PLAIN_TEXT_UPDATES) else events.text
        key = task_stream_key(snap.id)
        after: int | None = None
        said_working = False
        while True:
            try:
                subscription = self.hub.subscribe(key, after)
            except UnknownStreamError:
                break  # evicted (long finished): the ending comes from the database
            batches = ReadyBatches(subscription, MAX_DELTAS_PER_UPDATE)
            try:
                async for batch in batches:
                    text: list[str] = []
                    for event in batch:
                        after = event.id
                        try:
                            typed = ev.from_stream(event.type, event.data)
                        except ev.EventFormatError:
                            continue  # a kind this reader does not follow
                        if isinstance(typed, ev.TextDelta):  # a whole artifact block goes as a part at the end
                            delta = strip_blocks(typed.delta) if "```artifact-" in typed.delta else typed.delta
                            if delta:
                                text.append(delta)
                            continue
                        if not isinstance(typed, ev.TaskState):
                            continue
                        if text:
                            yield text_event("".join(text))
                            text = []
                        state = typed.state
                        if state in TERMINAL_STATES:
                            async for ending in self._ending(events, user_id=user_id, agent_id=agent_id):
                                yield ending
                            return
                        if state == WORKING and not said_working:
                            said_working = True
                            yield events.state(WORKING)
                    if text:
                        yield text_event("".join(text))
                break
            except SubscriberOverflowError:
                continue  # this client read too slowly; pick up after the last event it got
            finally:
                batches.close()
                subscription.close()
        async for ending in self._ending(events, user_id=user_id, agent_id=agent_id):
            yield ending

    async def _ending(self, events: wire.TaskEvents, *, user_id: int, agent_id: str) -> AsyncIterator[Any]:
        # The saved answer, not the deltas seen: complete even when the client joined late.
        snap = await self.store.snapshot(events.task_id, user_id=user_id, agent_id=agent_id)
        if snap is None:
            return
        if snap.state == "completed" and snap.output:
            yield events.result(snap.output)
        yield events.state(snap.state, error=snap.error, when=snap.updated_at)

    # -- canceling ----------------------------------------------------------------

    async def on_cancel_task(self, params: Any, context: wire.ServerCallContext) -> wire.Task | None:
        """Stop a running task started over A2A; answers with the canceled task."""
        agent_id, user_id = _caller(context)
        snap = await self.store.snapshot(params.id, user_id=user_id, agent_id=agent_id)
        if snap is None:
            raise wire.TaskNotFoundError(message=f"There is no task {params.id!r} for this agent and key.")
        if snap.state in TERMINAL_STATES:
            raise wire.TaskNotCancelableError(
                message=f"Task {snap.id} is already {wire.state_name(snap.state)}; only running tasks can be canceled."
            )
        if not await self.delegation.cancel_external_task(snap.id):
            raise wire.TaskNotCancelableError(
                message=f"Task {snap.id} was not started over A2A on this server (a chat's delegation, or "
                "interrupted by a restart); stop it from the chat that started it."
            )
        snap = await self.store.snapshot(snap.id, user_id=user_id, agent_id=agent_id)
        assert snap is not None, "this caller's task, read just before"
        return wire.to_task(snap)

    # -- the rest -------------------------------------------------------------------

    async def on_get_extended_agent_card(self, params: Any, context: wire.ServerCallContext) -> Any:
        """The card with what only key holders see (e.g. whether the agent delegates further)."""
        agent_id, _ = _caller(context)
        spec = await self.cards.spec(agent_id)
        if spec is None:
            raise wire.InvalidParamsError(message=f"There is no agent {agent_id!r}.")
        return wire.build_card(spec, extended=True)

    async def on_create_task_push_notification_config(self, params: Any, context: wire.ServerCallContext) -> Any:
        """Not offered (the card says `pushNotifications: false`)."""
        raise wire.PushNotificationNotSupportedError(message=_NO_PUSH)

    async def on_get_task_push_notification_config(self, params: Any, context: wire.ServerCallContext) -> Any:
        """Not offered."""
        raise wire.PushNotificationNotSupportedError(message=_NO_PUSH)

    async def on_list_task_push_notification_configs(self, params: Any, context: wire.ServerCallContext) -> Any:
        """Not offered."""
        raise wire.PushNotificationNotSupportedError(message=_NO_PUSH)

    async def on_delete_task_push_notification_config(self, params: Any, context: wire.ServerCallContext) -> None:
        """Not offered."""
        raise wire.PushNotificationNotSupportedError(message=_NO_PUSH)


_NO_PUSH = "Push notifications are not offered; follow a task with SubscribeToTask or poll it with GetTask."


def _caller(context: wire.ServerCallContext) -> tuple[str, int]:
    agent_id, user_id = context.state.get("agent_id"), context.state.get("user_id")
    assert agent_id and isinstance(user_id, int), "the route authenticates before dispatching"
    return agent_id, user_id
