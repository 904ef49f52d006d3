"""The a2a-sdk's request handler over our delegations (`AgentRequestHandler`), for both bindings.

`A2AServer` (`core/a2a/server.py`) authenticates the caller and hands each JSON-RPC or HTTP+JSON request
to the SDK, which calls the methods here: a message starts a delegation (`DelegationService.
start_external_task`) or answers a task's question (issue 36); streams follow the task's hub buffer and
turn its events into A2A events (the table in `core/a2a/server.py`'s docstring); `GetTask`, `ListTasks`
and `CancelTask` read and stop the caller's own tasks; the push config methods are `PushMethods`'.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from typing import Any

from core import tracing
from core.a2a import protocol as wire
from core.a2a.agent_cards import AgentCards
from core.a2a.push import PushNotifier
from core.a2a.push_methods import PushMethods
from core.a2a.push_store import PushConfigStore
from core.a2a.task_store import TaskSessionStore, row_snapshot
from core.aio import ReadyBatches
from core.chat import attachments
from core.chat.artifacts import strip_blocks
from core.delegation.questions import TaskNotWaitingError
from core.delegation.service import DelegationRefusedError, DelegationService, TooManyDelegatedTasksError
from core.delegation.tasks import TERMINAL_STATES, WAITING_STATES, WORKING, task_stream_key
from core.delegation.tool import MAX_INPUT_CHARS
from core.streaming import events as ev
from core.streaming.backend import StreamHubBackend
from core.streaming.hub import SubscriberOverflowError, UnknownStreamError
from core.streaming.redis_hub import refresh
from models import A2ATaskSession

log = logging.getLogger(__name__)

QUESTION_POLL_S = 0.05  # how often a blocking SendMessage looks whether its task asks back
#: At most this many text deltas that were ready together go out as one status update.
MAX_DELTAS_PER_UPDATE = 256
# What a message with a contextId this caller does not have gets (-32602), also said on every card.
UNKNOWN_CONTEXT = (
    "There is no context {context_id!r} for this agent and key: send the contextId of one of your "
    "earlier tasks with this agent to continue that conversation, or none to start a new one."
)


class AgentRequestHandler(PushMethods, wire.RequestHandler):
    """The SDK's `RequestHandler` over our delegations; the agent is `context.state['agent_id']`.

    Implemented here rather than with the SDK's `DefaultRequestHandler` + an executor:
    that handler keeps its own copy of each task and saves the whole Task on every
    event, while ours already has the task (its row) and its stream (the hub buffer).

    The streams yield `AsyncGenerator[Any, None]`, wider than the SDK's union of event types: a v1.0
    stream also yields `wire.TextUpdate`s, which the app's dispatcher writes itself (divergence 4).
    """

    def __init__(
        self,
        *,
        delegation: DelegationService,
        hub: StreamHubBackend,
        store: TaskSessionStore,
        cards: AgentCards,
        push_store: PushConfigStore,
        notifier: PushNotifier,
    ) -> None:
        self.delegation = delegation
        self.hub = hub
        self.store = store
        self.cards = cards
        self.push_store = push_store
        self.notifier = notifier

    # -- sending ----------------------------------------------------------------

    async def on_message_send(self, params: Any, context: wire.ServerCallContext) -> wire.Task:
        """Start a task; answer with it when it ends (or at once with `returnImmediately`)."""
        incoming = wire.read_send_request(params, max_chars=MAX_INPUT_CHARS)
        agent_id, user_id = _caller(context)
        push = await self.send_config(params)
        answered = await self._answer(agent_id, user_id, incoming)
        if answered is not None:
            task_id = answered[0].id
        else:
            with tracing.continued(context.state.get(wire.TRACE_STATE)):  # the task's run joins the caller's trace
                task_id = (await self._start(agent_id, user_id, incoming)).id
            await self.start_pushing(push, task_id, user_id)
        if not incoming.return_immediately:
            # Until it ends, or asks back (then the caller answers with its next message in the task).
            while self.delegation.external_task_running(task_id) and self.delegation.questions.pending(task_id) is None:
                await self.delegation.wait_external_task(task_id, timeout=QUESTION_POLL_S)
        snap = await self.store.snapshot(task_id, user_id=user_id, agent_id=agent_id)
        assert snap is not None, "this caller's task, which it just started"
        return wire.to_task(snap, history_length=incoming.history_length, question=self._question(snap))

    def _question(self, snap: wire.TaskSnapshot) -> str | None:
        waiting = self.delegation.questions.pending(snap.id) if snap.state in WAITING_STATES else None
        return waiting.text if waiting is not None else None

    async def _answer(
        self, agent_id: str, user_id: int, incoming: wire.IncomingMessage
    ) -> tuple[wire.TaskSnapshot, int | None] | None:
        """A message into a task that asks back: the answer (the task goes on); None for any other message.

        Returns the task (working again) and the last event of its stream before the answer.
        """
        if incoming.task_id is None or self.delegation.questions.pending(incoming.task_id) is None:
            return None
        snap = await self.store.snapshot(incoming.task_id, user_id=user_id, agent_id=agent_id)
        if snap is None or (incoming.context_id is not None and incoming.context_id != snap.context_id):
            return None  # `_start` says what is wrong
        info = await refresh(self.hub, task_stream_key(snap.id))
        try:
            await self.delegation.questions.answer(snap.id, incoming.text)
        except TaskNotWaitingError:
            return None
        return replace(snap, state=WORKING), info.last_id if info is not None else None

    async def on_message_send_stream(self, params: Any, context: wire.ServerCallContext) -> AsyncGenerator[Any, None]:
        """Start a task and stream it: the Task, text as it is generated, the result, the end state."""
        incoming = wire.read_send_request(params, max_chars=MAX_INPUT_CHARS)
        agent_id, user_id = _caller(context)
        push = await self.send_config(params)
        answered = await self._answer(agent_id, user_id, incoming)
        if answered is not None:  # the answer to its question: the task goes on, followed from here
            snap, after = answered
        else:
            with tracing.continued(context.state.get(wire.TRACE_STATE)):  # the task's run joins the caller's trace
                snap, after = row_snapshot(await self._start(agent_id, user_id, incoming), ""), None  # as written
            await self.start_pushing(push, snap.id, user_id)
        yield wire.to_task(snap, history_length=incoming.history_length)
        async for event in self._follow(snap, context, after):
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
        return wire.to_task(snap, history_length=history_length, question=self._question(snap))

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
        question = self._question(snap)
        yield wire.to_task(snap, question=question)
        if question is not None:
            return  # it waits for the caller's answer: the stream ends, as a waiting task's stream does
        async for event in self._follow(snap, context):
            yield event

    async def _follow(
        self, snap: wire.TaskSnapshot, context: wire.ServerCallContext, after: int | None = None
    ) -> AsyncIterator[Any]:
        """The task's hub buffer as A2A events, from its first event (or after `after`), until its terminal state.

        A question back (`input-required`, `auth-required`) ends the stream too, with the question as the
        status message: the caller answers with a message into the task (`_answer`).

        Text deltas that are ready together (a replay, or a busy event loop that let several pile up)
        go out as one status update with their text joined: the same text in fewer events, so a
        loaded server spends less per token exactly when it has the least to spare. When the stream
        writes them itself (`wire.PLAIN_TEXT_UPDATES` in `context`), they are `wire.TextUpdate`s, not protobuf.
        """
        agent_id, user_id = _caller(context)
        events = wire.TaskEvents(snap.id, snap.context_id)
        text_event = events.text_update if context.state.get(wire.PLAIN_TEXT_UPDATES) else events.text
        key = task_stream_key(snap.id)
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
                        if state in WAITING_STATES:
                            yield events.state(state, error=typed.message)
                            return
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


def _caller(context: wire.ServerCallContext) -> tuple[str, int]:
    agent_id, user_id = context.state.get("agent_id"), context.state.get("user_id")
    assert agent_id and isinstance(user_id, int), "the route authenticates before dispatching"
    return agent_id, user_id
