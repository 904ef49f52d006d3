"""The chat engine: the turns of a session, one at a time, streaming UI events into the hub.

A turn saves the user's message, then runs the agent (`core.chat.run.AgentRunner`:
call the model, streaming `text-delta` events, run the tools it asked for
(`tool-input-available`, `tool-output-available`), feed the results back, until
the model answers without tools or `max_steps` is reached). It ends with `finish`
(after `error` when something failed), and the assistant messages of the turn are
saved in one transaction before `finish` is sent.

A turn runs as a background task owned by the engine, not by a page: closing
the page does not stop it, and a page that comes back reattaches to the hub
buffer (`stream_key == session_id`). `cancel()` stops it; the partial text is
saved with `status='canceled'`.

One turn at a time per session: `start_turn` claims the session's turn in one
step (a check and a set with no await between them) before it writes anything,
so a refused send saves nothing. The claim is released when the turn ends, or
when starting it fails. The claims are `core.chat.turns.TurnClaims`'.

A user's turn starts the same way whether it answers a new message (`start_turn`), answers the
last one again (`regenerate`) or an edited last message (`resend`): only what it saves under the
claim differs (`core.chat.rewind`), so the last two are refused while a turn runs, like a send.

A crash must not lose the answer: the turn's start saves a draft assistant row
(status `streaming`, see `core.chat.sessions`), `DraftSaver` (`core.chat.drafts`) writes the text so far
into it about once a second while the model streams, and the turn's end replaces
it with the saved answer. A draft left by a kill is marked `interrupted` at the
next start (`fail_interrupted`, called by `Services.prepare`).

Events follow the Vercel AI SDK UI stream protocol that seed 000 uses:
`start`, `text-delta` {id, delta}, `tool-input-available` {toolCallId, toolName,
input}, `tool-output-available` {toolCallId, output, metadata}, `error`
{errorText}, `finish` {finishReason, usage}.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from core.chat import agents as agents_store
from core.chat import attachments, rewind
from core.chat import sessions as sessions_store
from core.chat.answers import AnswerWriter
from core.chat.drafts import DraftSaver, DraftWriter, draft_fields
from core.chat.errors import (
    RUNNING_LIMIT_RETRY_AFTER_S,
    AgentNotFoundError,
    ChatError,
    InvalidMessageError,
    MessageNotFoundError,
    NothingToAnswerAgainError,
    NotLastMessageError,
    SessionNotFoundError,
    TooManyRunningTurnsError,
    TurnInProgressError,
)
from core.chat.llm import LLMGateway
from core.chat.run import AgentRun, AgentRunner, TurnOutcome, build_model_messages
from core.chat.tools import BoundTool, ToolContext, ToolRegistry
from core.chat.turn_starts import RunningTurnsLimit, TurnStarts
from core.chat.turns import SessionChange, SessionWatchers, TurnClaim, TurnClaims, TurnStarted
from core.db import Database
from core.i18n import _, current_language, format_number, set_language
from core.streaming import events as ev
from core.streaming.backend import StreamHubBackend
from core.streaming.background import BackgroundTasks
from core.streaming.hub import BufferInfo, BufferState, StreamBusyError
from core.streaming.redis_hub import RedisStreamHub
from models import Agent, AgentMessage

log = logging.getLogger(__name__)

__all__ = [
    "RUNNING_LIMIT_RETRY_AFTER_S",
    "AgentNotFoundError",
    "AgentRun",
    "ChatEngine",
    "ChatError",
    "InvalidMessageError",
    "MessageNotFoundError",
    "NotLastMessageError",
    "NothingToAnswerAgainError",
    "SessionChange",
    "SessionNotFoundError",
    "TooManyRunningTurnsError",
    "TurnInProgressError",
    "TurnOutcome",
    "TurnStarted",
]


class ChatEngine:
    """Runs turns. Built once in `app.py`; pages and routes call it.

    Over 300 lines on purpose: a session's turn from its start to its saved answer, on this
    replica or stopped from another (cancel, orphans), is one life cycle over one set of claims;
    what stands alone is elsewhere (the claims `core.chat.turns`, the run `core.chat.run`, drafts
    `core.chat.drafts`, the events `core.streaming.events`).

    Args:
        db: the database.
        hub: where turn events go.
        llm: the model gateway.
        tools: the tool registry.
        max_steps: model calls per turn (bounds the tool loop).
        turn_timeout_s: longest a turn may run before it is failed.
        max_message_chars: longest user message accepted.
        draft_interval_s: how often a running turn's text so far is saved (crash safety).
        open_secret: reads an agent's sealed API key back (see `AgentRunner`).
        max_running_turns_per_user: the most turns one user may have running at once; None: no limit
            (single-user mode, where the one user is the person at the machine; set by `Services.prepare`).
    """

    def __init__(
        self,
        db: Database,
        hub: StreamHubBackend,
        llm: LLMGateway,
        tools: ToolRegistry,
        *,
        max_steps: int = 8,
        turn_timeout_s: float = 600.0,
        max_message_chars: int = 20_000,
        draft_interval_s: float = 1.0,
        open_secret: Callable[[str], str] | None = None,
        max_running_turns_per_user: int | None = None,
    ) -> None:
        self.db = db
        self.max_running_turns_per_user = max_running_turns_per_user
        self.hub = hub
        self.llm = llm
        self.tools = tools
        self.max_steps = max_steps
        self.turn_timeout_s = turn_timeout_s
        self.max_message_chars = max_message_chars
        self.draft_interval_s = draft_interval_s
        self.runner = AgentRunner(hub, llm, max_steps=max_steps, turn_timeout_s=turn_timeout_s, open_secret=open_secret)
        self.runner.prepare_messages = partial(attachments.prepare_for_agent, db)  # attached files (issue 36)
        self._tasks = BackgroundTasks()
        self._drafts = DraftWriter(db)
        self._answers = AnswerWriter(db)
        self.agents = agents_store.AgentCache(db)  # the agents and tools turns start with (`AgentCache.forget`)
        self._starts = TurnStarts(db)  # on SQLite, new messages of turns that start together are written together
        self._turns = TurnClaims(hub, shared=isinstance(hub, RedisStreamHub))
        self._watchers = SessionWatchers()
        # A cluster (docs/ARCHITECTURE.md, "Cluster"): the session's turn is also claimed in the shared hub (its
        # buffer opened before anything is saved), so a send on any replica sees it; a stop from any replica
        # reaches the replica that runs it.
        self._shared = isinstance(hub, RedisStreamHub)
        self._announced: dict[str, int] = {}  # a cluster: turns of other replicas told to watchers (first id)
        if isinstance(hub, RedisStreamHub):
            hub.on_cancel(self._cancel_here)
            hub.on_change(self._on_shared_change)

    # -- turns of a user's session ---------------------------------------------------

    def validate_text(self, text: str) -> str:
        """The message as it will be sent, or InvalidMessageError saying what is wrong."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidMessageError(_("The message is empty; type something first."))
        if len(text) > self.max_message_chars:
            raise InvalidMessageError(
                _("The message is {length} characters long; the limit is {limit}.").format(
                    length=format_number(len(text)), limit=format_number(self.max_message_chars)
                )
            )
        return text.strip()

    async def start_turn(
        self, *, session_id: str, user_id: int, text: str, files: list[dict[str, Any]] | None = None
    ) -> TurnStarted:
        """Save the user's message and start answering it in the background.

        Raises:
            InvalidMessageError: empty or too long.
            SessionNotFoundError: no such session for this user.
            TurnInProgressError: the session is already answering.
            TooManyRunningTurnsError: the user has `max_running_turns_per_user` turns running.
        """
        message = rewind.new_message(self.validate_text(text), files or [])  # files: refs (`attachments.owned_refs`)
        return await self._start_users_turn(session_id, user_id, message)

    async def regenerate(self, *, session_id: str, user_id: int) -> TurnStarted:
        """Answer the user's last message again: its last answer is removed (`core.chat.rewind.answer_again`).

        Raises what `start_turn` raises (but for the text's checks), and NothingToAnswerAgainError when the
        chat holds no message of the user.
        """
        return await self._start_users_turn(session_id, user_id, rewind.answer_again())

    async def resend(self, *, session_id: str, user_id: int, message_id: int, text: str) -> TurnStarted:
        """Edit the user's last message and answer it anew; what followed it is removed (`rewind.edit_last_message`).

        Raises what `start_turn` raises, MessageNotFoundError when the chat holds no such message of the
        user, and NotLastMessageError when it is not their last.
        """
        prepare = rewind.edit_last_message(message_id, self.validate_text(text))
        return await self._start_users_turn(session_id, user_id, prepare)

    async def _start_users_turn(self, session_id: str, user_id: int, prepare: rewind.PrepareTurn) -> TurnStarted:
        """Claim the user's chat's turn, save what `prepare` saves with its draft, and run the turn."""
        claim: TurnClaim | None = None
        limit = self.max_running_turns_per_user
        try:
            # What the turn reads is read before its unit of work, which only writes: on SQLite the units of
            # work take turns, and under load each statement waits milliseconds for the event loop to come
            # back to it, so with 100 sends at once the starts queued behind each other's reads
            # (docs/ARCHITECTURE.md, "The path of a chat turn").
            async with self.db.read() as r:
                # Whose chat it is comes before whether it is busy: someone else's busy chat is "not
                # found", never "still answering" (and the API's route need not read the row first).
                chat = await sessions_store.get_user_session(r, session_id=session_id, user_id=user_id)
            if chat is None:
                raise SessionNotFoundError(_("There is no such chat session."))
            claim = await self._turns.claim_shared(
                session_id,
                _("This chat is still answering; wait for it or press Stop."),
                user_id=user_id,
                limit=limit,
            )
            agent, tool_rows = await self.agents.get(chat.agent_id)  # kept until an agent changes
            if agent is None or agent.deleted_at is not None:
                raise AgentNotFoundError(
                    _(
                        "The agent of this chat was deleted; its messages stay readable. "
                        "Start a new chat with another agent."
                    )
                )
            assert agent.id is not None  # a row read from the database
            # After the claim: a turn that just ended saved its answer before it gave the chat back.
            async with self.db.read() as r:
                history = await sessions_store.list_messages(r, session_id=session_id)
            # A cluster counts the user's turns on every replica in the start's transaction (one process: the claims).
            counted = RunningTurnsLimit(self.db, user_id, limit) if limit is not None and self._shared else None
            turn = await self._starts.save(prepare, session_id, agent, history, limit=counted)  # saved and committed
            return await self._launch(claim, session_id, user_id, agent, tool_rows, turn)
        finally:
            if claim is not None:
                await self._turns.release_unlaunched(session_id, claim)

    async def start_announcement(self, session_id: str) -> TurnStarted:
        """Start a turn without a user message: the agent speaks about what the history ends with.

        Used for the results of background tasks (seed 003 `auto` injects, saved as system
        messages by `core.broker.inbox`): the agent announces them as soon as no turn is running.

        Raises:
            SessionNotFoundError: no such session, or it has no messages to speak about.
            TurnInProgressError: the session is answering; announce after that turn.
        """
        claim = await self._turns.claim_shared(session_id, _("This chat is still answering; announce after that turn."))
        try:
            async with self.db.session() as s:
                chat = await sessions_store.get_session(s, session_id)
                agent = await agents_store.get_agent(s, chat.agent_id) if chat is not None else None
                if chat is None or agent is None or agent.deleted_at is not None:
                    raise SessionNotFoundError(_("There is no such chat session (or its agent was deleted)."))
                claim.user_id = chat.user_id  # counted as the user's, never refused: it tells what already ran
                assert agent.id is not None  # a row read from the database
                history = await sessions_store.list_messages(s, session_id=session_id)
                tool_rows = await agents_store.agent_tool_rows(s, agent.id)
                if not history:
                    raise SessionNotFoundError(_("The chat has nothing to announce."))
                [draft] = await sessions_store.add_messages(s, session_id=session_id, messages=[draft_fields(agent)])
            turn = rewind.PreparedTurn(history, history[-1], draft)
            return await self._launch(claim, session_id, chat.user_id, agent, tool_rows, turn)
        finally:
            await self._turns.release_unlaunched(session_id, claim)

    async def _launch(
        self,
        claim: TurnClaim,
        session_id: str,
        user_id: int,
        agent: Agent,
        tool_rows: list[tuple[str, dict[str, Any]]],
        turn: rewind.PreparedTurn,
    ) -> TurnStarted:
        """Open the session's turn buffer and run the agent on the turn's history, answering its anchor."""
        anchor, draft_id = turn.anchor, turn.draft.id
        # Rows read from or written to the database have their ids.
        assert draft_id is not None and anchor.id is not None
        meta: dict[str, Any] = {
            "userSortOrder": anchor.sort_order,
            "userMessageId": anchor.id,
            "agentSlug": agent.slug,
            "draftId": draft_id,
            "userId": user_id,  # whose chat: its stream route need not read the chat again (`chat_router`)
        }
        if turn.rewound:
            meta["rewound"] = True
        try:
            if claim.shared:  # opened by the claim
                await self.hub.update_meta(session_id, **meta)
                info = self.hub.get(session_id)
            else:
                info = await self.hub.create(session_id, meta=meta)
        except StreamBusyError as exc:  # not expected under the claim: only turns write under the session's key
            raise TurnInProgressError(_("This chat is still answering; wait for it or press Stop.")) from exc
        if info is None:  # not expected: the claim opened the buffer, and an open buffer is not evicted
            raise TurnInProgressError(_("This chat is still answering; wait for it or press Stop."))
        ctx = ToolContext(
            user_id=user_id, agent_id=agent.id, agent_slug=agent.slug, session_id=session_id, chain=(agent.slug,)
        )
        tools = self.tools.bind(tool_rows, agent_id=agent.id, agent_slug=agent.slug)
        # The turn runs in a task of its own (which copies this context): it keeps the language of whoever
        # started it, a page or a request, for the texts it writes (notes of its background tasks too).
        set_language(current_language())
        task = claim.task = self._tasks.spawn(
            self._run_session_turn(session_id, agent, build_model_messages(agent, turn.history), tools, ctx, draft_id),
            name=f"turn {session_id}",
        )
        task.add_done_callback(lambda _: self._turns.release(session_id, claim))
        started = TurnStarted(session_id, anchor.id, session_id, info.last_id)
        shown = [anchor] if anchor.role == "user" and not turn.rewound else []
        self._notify(SessionChange(session_id, messages=shown, turn=started, rewound=turn.rewound))
        return started

    async def save_notes(self, session_id: str, notes: list[dict[str, Any]]) -> list[AgentMessage]:
        """Append system messages (`content`, `inject_mode`, `a2a_task_id`, `inject_position`) without a reply.

        A note whose position in its task the session already holds is skipped (`sessions.add_notes`);
        returns the rows saved. Pages watching the session are told (`watch`). Raises SessionNotFoundError
        when it is gone.
        """
        async with self.db.session() as s:
            if await sessions_store.get_session(s, session_id) is None:
                raise SessionNotFoundError(_("There is no such chat session."))
            rows = await sessions_store.add_notes(
                s, session_id=session_id, notes=[{"role": "system", "source": "user", **note} for note in notes]
            )
        if rows:
            self._notify(SessionChange(session_id, messages=rows))
        return rows

    def watch(self, session_id: str, listener: Callable[[SessionChange], None]) -> Callable[[], None]:
        """Call `listener` for each change of the session (turns started, notes saved); returns the unwatch."""
        return self._watchers.add(session_id, listener)

    def _notify(self, change: SessionChange) -> None:
        self._watchers.notify(change)

    def running_here(self) -> int:
        """How many turns this process runs now (the metrics' level)."""
        return len(self._turns)

    def is_running(self, session_id: str) -> bool:
        """True from the moment a turn of that session is claimed until it ends (in a cluster: on any replica)."""
        if session_id in self._turns:
            return True
        info = self.hub.get(session_id) if self._shared else None
        return info is not None and info.state is BufferState.OPEN

    async def cancel(self, session_id: str) -> bool:
        """Stop the session's running turn (its partial answer is saved); False when none runs.

        In a cluster a turn running on another replica is asked to stop there; this waits for its end too.
        """
        claim = self._turns.get(session_id)
        if claim is None and isinstance(self.hub, RedisStreamHub):
            return await self.hub.request_cancel(session_id)
        if claim is None or claim.task is None or claim.task.done():
            return False
        claim.task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(claim.ended.wait(), timeout=10)
        return True

    async def _on_shared_change(self, info: BufferInfo) -> None:
        """A cluster: a turn another replica started in a session watched here is told to the watchers, once."""
        if info.state is not BufferState.OPEN:
            self._announced.pop(info.key, None)
            return
        message_id = info.meta.get("userMessageId")
        if (
            info.key not in self._watchers
            or "draftId" not in info.meta
            or self._announced.get(info.key) == info.first_id
        ):
            return
        self._announced[info.key] = info.first_id
        rows: list[AgentMessage] = []
        rewound = info.meta.get("rewound") is True
        if isinstance(message_id, int) and not rewound:
            async with self.db.session() as s:
                row = await s.get(AgentMessage, message_id)
            if row is not None and row.role == "user":
                rows = [row]
        started = TurnStarted(info.key, message_id if isinstance(message_id, int) else 0, info.key, info.first_id - 1)
        self._notify(SessionChange(info.key, messages=rows, turn=started, rewound=rewound))

    async def _cancel_here(self, key: str) -> bool:
        """A cluster's stop for `key`: cancel the turn when it runs in this process (the caller waits elsewhere)."""
        claim = self._turns.get(key)
        if claim is None or claim.task is None or claim.task.done():
            return False
        claim.task.cancel()
        return True

    async def end_orphan(self, session_id: str) -> None:
        """A cluster's reaper took over this session's turn (its replica's lease expired): save and end it.

        The draft keeps what the turn streamed (the text in the shared stream, which is newer than the
        draft's last save) and is marked `interrupted`; the stream gets `error` and `finish`.
        """
        if not isinstance(self.hub, RedisStreamHub):
            return
        events = await self.hub.events(session_id)
        info = self.hub.get(session_id)
        draft_id = info.meta.get("draftId") if info is not None else None
        deltas = [ev.from_stream(e.type, e.data) for e in events if e.type == ev.TextDelta.kind]
        text = "".join(d.delta for d in deltas if isinstance(d, ev.TextDelta))
        error = (
            "Interrupted: the server running this answer stopped while it was being written; what it had said is kept."
        )
        if isinstance(draft_id, int):
            try:
                async with self.db.session() as s:
                    await sessions_store.interrupt_draft(s, message_id=draft_id, content=text, error=error)
            except Exception:
                log.exception("could not save the interrupted answer of session %s", session_id)
        await ev.publish(self.hub, session_id, ev.Error(error))
        await ev.publish(self.hub, session_id, ev.Finish("error"))
        await self.hub.finish(session_id, error=error)

    async def wait(self, session_id: str, timeout: float | None = None) -> None:
        """Wait until the session's running turn (if any) ends."""
        claim = self._turns.get(session_id)
        if claim is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(claim.ended.wait(), timeout=timeout)

    async def shutdown(self) -> None:
        """Cancel every running turn, letting each save what it has."""
        await self._tasks.shutdown()

    async def fail_interrupted(self) -> int:
        """At start-up: answers still being written were cut off by a stop or crash; keep them as `interrupted`.

        Returns how many there were.
        """
        async with self.db.session() as s:
            return await sessions_store.mark_interrupted(s)

    async def _run_session_turn(
        self,
        session_id: str,
        agent: Agent,
        messages: list[dict[str, Any]],
        tools: dict[str, BoundTool],
        ctx: ToolContext,
        draft_id: int,
    ) -> None:
        run = AgentRun(agent=agent, messages=messages, fields={"source": "user"})
        draft = DraftSaver(self.db, draft_id, run.text_so_far, interval_s=self.draft_interval_s, writer=self._drafts)
        run.on_text = draft.touch
        try:
            await self.runner.run(stream_key=session_id, run=run, tools=tools, ctx=ctx)
        finally:
            # Runs on cancel too: what was said so far is kept, then the stream ends.
            await draft.settle()
            await self._save_and_finish(session_id, session_id, run.outcome, draft_id)

    async def _save_and_finish(
        self, session_id: str, stream_key: str, outcome: TurnOutcome | None, draft_id: int
    ) -> None:
        """Save the turn's answer in place of its draft, then end its stream.

        When the answer cannot be saved, the draft keeps the text saved last; the next start marks it
        `interrupted`.
        """
        try:
            await self._answers.save(session_id, draft_id, outcome.rows if outcome is not None else [])
        except Exception:
            log.exception("could not save the answer of session %s", session_id)
            await ev.publish(self.hub, stream_key, ev.Error(_("The answer could not be saved.")))
        finally:
            finish = (
                ev.Finish(outcome.finish_reason, outcome.input_tokens, outcome.output_tokens, outcome.cost_usd)
                if outcome
                else ev.Finish("error")
            )
            await ev.publish(self.hub, stream_key, finish)
            await self.hub.finish(stream_key, error=outcome.error if outcome and outcome.status == "error" else None)
            # The answer is saved and its stream closed: the session takes a new message from here on, so a
            # client that sends one as soon as it reads `finish` is not told the chat is still answering. (The
            # hub's append and finish never suspend, so no reader runs between `finish` and this release.)
            claim = self._turns.get(session_id)
            if claim is not None and claim.task is asyncio.current_task():
                self._turns.release(session_id, claim)
