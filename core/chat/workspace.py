"""What a user's chat screen needs, in one call each (the pages' view of the data).

Pages call these instead of opening database sessions themselves, so `ui/`
holds no queries and no rules: ownership checks, default agents and the
"reattach to a running turn" decision live here.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.chat import agents as agents_store
from core.chat import sessions as sessions_store
from core.chat.engine import ChatEngine, InvalidMessageError, SessionNotFoundError
from core.db import Database
from core.i18n import _
from core.streaming.backend import StreamHubBackend
from core.streaming.hub import BufferState
from core.streaming.redis_hub import refresh
from models import Agent, AgentMessage, AgentSession


@dataclass(frozen=True, slots=True)
class SessionView:
    """An open chat: the session, its agent, its saved messages, and whether to reattach to a live turn."""

    session: AgentSession
    agent: Agent
    messages: list[AgentMessage]
    live_turn: bool


class Workspace:
    """Read and change a user's chats."""

    def __init__(
        self,
        db: Database,
        hub: StreamHubBackend,
        chat: ChatEngine,
        default_agent_slug: str = agents_store.DEFAULT_AGENT_SLUG,
    ) -> None:
        self.db = db
        self.hub = hub
        self.chat = chat
        self.default_agent_slug = default_agent_slug

    async def agents(self) -> list[Agent]:
        """Every local agent, by name."""
        async with self.db.session() as s:
            return await agents_store.list_agents(s)

    async def default_agent(self) -> Agent | None:
        """The agent a new chat starts with (the `DEFAULT_AGENT` setting), or None when it does not exist."""
        async with self.db.session() as s:
            return await agents_store.get_default_agent(s, self.default_agent_slug)

    async def sessions(self, user_id: int, search: str | None = None) -> list[AgentSession]:
        """The user's visible chats, most recent first; `search` keeps those whose title or text has it."""
        async with self.db.session() as s:
            return await sessions_store.list_sessions(s, user_id=user_id, search=search)

    async def rename(self, user_id: int, session_id: str, title: str) -> AgentSession:
        """Give a chat a new title (blank titles are refused).

        Raises:
            SessionNotFoundError: not this user's chat.
            InvalidMessageError: the title is blank.
        """
        if not title.strip():
            raise InvalidMessageError(_("A chat's title cannot be empty."))
        async with self.db.session() as s:
            row = await sessions_store.rename_session(s, session_id=session_id, user_id=user_id, title=title)
        if row is None:
            raise SessionNotFoundError(_("There is no such chat session."))
        return row

    async def delete(self, user_id: int, session_id: str) -> bool:
        """Delete a chat (its running turn is stopped first); `restore` undoes it. False when not theirs."""
        async with self.db.session() as s:
            if await sessions_store.get_user_session(s, session_id=session_id, user_id=user_id) is None:
                return False
        await self.chat.cancel(session_id)  # outside the transaction: the turn saves in its own
        async with self.db.session() as s:
            return await sessions_store.delete_session(s, session_id=session_id, user_id=user_id)

    async def restore(self, user_id: int, session_id: str) -> bool:
        """Undo `delete`."""
        async with self.db.session() as s:
            return await sessions_store.restore_session(s, session_id=session_id, user_id=user_id)

    async def open(self, user_id: int, session_id: str) -> SessionView:
        """Load a chat for display.

        `live_turn` is True when a turn is running whose answer is not saved yet: the page
        then replays it from the hub.

        Raises:
            SessionNotFoundError: not this user's chat (or deleted).
        """
        async with self.db.session() as s:
            row = await sessions_store.get_user_session(s, session_id=session_id, user_id=user_id)
            if row is None:
                raise SessionNotFoundError(_("There is no such chat session."))
            agent = await agents_store.get_agent(s, row.agent_id)
            messages = await sessions_store.list_messages(s, session_id=session_id)
        if agent is None:
            raise SessionNotFoundError(_("The agent of this chat no longer exists."))
        info = await refresh(self.hub, session_id)  # a cluster: the turn may run on another replica
        # Live while the turn's answer is not saved: nothing the agent said comes after the message it answers
        # (a background task's note may, when it was saved just as the turn began).
        live = (
            info is not None
            and info.state is BufferState.OPEN
            and not any(
                m.role == "assistant" and m.sort_order > int(info.meta.get("userSortOrder", 0)) for m in messages
            )
        )
        return SessionView(row, agent, messages, live)

    async def create(self, user_id: int, agent_slug: str) -> AgentSession:
        """A new chat with that agent.

        Raises:
            SessionNotFoundError: no such agent.
        """
        async with self.db.session() as s:
            agent = await agents_store.get_agent_by_slug(s, agent_slug)
            if agent is None or agent.id is None:
                raise SessionNotFoundError(_("There is no agent {name!r}.").format(name=agent_slug))
            return await sessions_store.create_session(s, user_id=user_id, agent_id=agent.id)

    async def change_agent(self, user_id: int, session_id: str, agent_slug: str) -> bool:
        """Switch an empty chat to another agent; False when the chat already has messages."""
        async with self.db.session() as s:
            row = await sessions_store.get_user_session(s, session_id=session_id, user_id=user_id)
            agent = await agents_store.get_agent_by_slug(s, agent_slug)
            if row is None or agent is None or agent.id is None:
                raise SessionNotFoundError(_("There is no such chat session or agent."))
            if await sessions_store.max_sort_order(s, session_id=session_id):
                return False
            await sessions_store.set_session_agent(s, session_id=session_id, agent_id=agent.id)
            return True
