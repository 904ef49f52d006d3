"""Running turns, on any replica: their drafts (`streaming` rows) counted and listed (data access only).

A running chat turn keeps a draft of its answer (`core.chat.sessions`); a user's running turns are their chats'
drafts, which a cluster counts for its per-user limit (`core.chat.turn_starts.RunningTurnsLimit`) and the admin
area lists.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, bindparam, literal_column
from sqlalchemy.sql.elements import ColumnClause
from sqlmodel import col, func, select
from sqlmodel.ext.asyncio.session import AsyncSession

from models import Agent, AgentMessage, AgentSession

STREAMING = "streaming"  # the status of a running turn's draft answer
# Written into the statement, not bound: the planner then knows the partial index of drafts
# (`idx_agent_messages_streaming`, migration 0009) covers the query.
_STREAMING_LITERAL: ColumnClause[Any] = literal_column(f"'{STREAMING}'")

_MESSAGES: Table = AgentMessage.__table__  # type: ignore[attr-defined]  # SQLModel's table, typed loosely
_SESSIONS: Table = AgentSession.__table__  # type: ignore[attr-defined]

#: The parameter of `RUNNING_TURNS`: whose running turns it counts.
COUNTED_USER = "counted_user_id"
# Aliased: inside the chat's UPDATE an `agent_sessions` here would stand for the row being updated.
_RUNNING, _USERS_CHATS = _MESSAGES.alias("running"), _SESSIONS.alias("users_chats")
#: How many turns the user `counted_user_id` runs, on any replica: their chats' drafts.
RUNNING_TURNS = (
    select(func.count())
    .select_from(_RUNNING.join(_USERS_CHATS, _USERS_CHATS.c.id == _RUNNING.c.session_id))
    .where(_RUNNING.c.status == _STREAMING_LITERAL, _USERS_CHATS.c.user_id == bindparam(COUNTED_USER))
    .scalar_subquery()
)
_COUNT_RUNNING_TURNS = select(RUNNING_TURNS)
_COUNTED_USERS = "counted_user_ids"
_RUNNING_TURNS_BY_USER = (
    select(_USERS_CHATS.c.user_id, func.count())
    .select_from(_RUNNING.join(_USERS_CHATS, _USERS_CHATS.c.id == _RUNNING.c.session_id))
    .where(
        _RUNNING.c.status == _STREAMING_LITERAL, _USERS_CHATS.c.user_id.in_(bindparam(_COUNTED_USERS, expanding=True))
    )
    .group_by(_USERS_CHATS.c.user_id)
)


async def count_users_running_turns(session: AsyncSession, *, user_ids: list[int]) -> dict[int, int]:
    """`count_running_turns` of several users in one statement (a user who runs none is left out)."""
    counted = await session.exec(_RUNNING_TURNS_BY_USER, params={_COUNTED_USERS: user_ids})
    return {user_id: count for user_id, count in counted.all()}


async def count_running_turns(session: AsyncSession, *, user_id: int) -> int:
    """How many turns of `user_id`'s chats are running, on any replica: their drafts (`streaming`)."""
    count: int = (await session.exec(_COUNT_RUNNING_TURNS, params={COUNTED_USER: user_id})).one()
    return count


async def running_turns(session: AsyncSession) -> list[dict[str, Any]]:
    """Every running turn, on any replica (its draft), oldest first: the admin area's list.

    Each: `sessionId`, `userId`, `title`, `agentId` (the agent's id, its slug) and `startedAt` (the draft's time).
    Turns of delegated tasks (the callee's side) are listed too: their session is the task's.
    """
    query = (
        select(AgentSession, col(Agent.slug), col(AgentMessage.created_at))
        .join(AgentMessage, col(AgentMessage.session_id) == col(AgentSession.id))
        .join(Agent, col(Agent.id) == col(AgentSession.agent_id))
        .where(col(AgentMessage.status) == _STREAMING_LITERAL)
        .order_by(col(AgentMessage.id))
    )
    return [
        {"sessionId": row.id, "userId": row.user_id, "title": row.title, "agentId": slug, "startedAt": at.isoformat()}
        for row, slug, at in (await session.exec(query)).all()
    ]


async def sessions_answering_with(session: AsyncSession, *, agent_id: int) -> list[str]:
    """The chats whose turn runs on the agent `agent_id` (on any replica: their drafts), oldest first."""
    query = (
        select(AgentSession.id)
        .join(AgentMessage, col(AgentMessage.session_id) == col(AgentSession.id))
        .where(col(AgentMessage.status) == _STREAMING_LITERAL, col(AgentSession.agent_id) == agent_id)
        .order_by(col(AgentMessage.id))
    )
    return list(dict.fromkeys((await session.exec(query)).all()))
