"""Chat sessions and their messages (data access only).

`list_sessions` hides the callee sessions of delegated tasks: it LEFT JOINs
`a2a_task_sessions` and keeps a session only when it has no task row or its
task row says `visible_in_sidebar = 1` (seed 000 §3.1.3).

A running chat turn keeps a draft of its answer: an assistant row with status
`streaming` whose text the engine saves about once a second, so a crash (kill -9,
power loss) does not lose what was said. The turn's end replaces the draft with the
answer's rows; a draft still there at the next start was cut off and becomes
`interrupted` (`mark_interrupted`). `list_messages` leaves drafts out: while the turn
runs, its answer is followed live from the hub.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from sqlalchemy import Table, and_, bindparam, case, delete, insert, or_, update
from sqlalchemy.orm.util import identity_key
from sqlmodel import col, func, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.chat import running_turns as running_turns_store
from core.chat.running_turns import STREAMING as STREAMING
from models import A2ATaskSession, AgentMessage, AgentSession, utcnow

TITLE_LENGTH = 60

INTERRUPTED = "interrupted"  # a draft found at start-up: the server stopped (or crashed) while it was written
INTERRUPTED_ERROR = (
    "Interrupted by a server restart: the server stopped while this answer was being written; "
    "this is what it had said. Send the message again for a full answer."
)


async def create_session(
    session: AsyncSession, *, user_id: int, agent_id: int, title: str = "New chat"
) -> AgentSession:
    """A new, empty chat session."""
    row = add_session(session, user_id=user_id, agent_id=agent_id, title=title)
    await session.commit()
    await session.refresh(row)
    return row


def add_session(session: AsyncSession, *, user_id: int, agent_id: int, title: str = "New chat") -> AgentSession:
    """A new, empty chat session in `session`'s transaction (saved by its next commit); its id is set already."""
    row = AgentSession(user_id=user_id, agent_id=agent_id, title=title)
    session.add(row)
    return row


async def get_session(session: AsyncSession, session_id: str) -> AgentSession | None:
    """The session (not deleted), whoever owns it."""
    row = session.identity_map.get(identity_key(AgentSession, session_id))  # as `session.get` would
    if row is None:
        row = (await session.exec(_CHAT_BY_ID, params={"chat_id": session_id})).first()
    return row if row is not None and row.deleted_at is None else None


async def get_user_session(session: AsyncSession, *, session_id: str, user_id: int) -> AgentSession | None:
    """The session when it exists, is not deleted and belongs to `user_id`; else None."""
    row = await get_session(session, session_id)
    return row if row is not None and row.user_id == user_id else None


async def list_sessions(
    session: AsyncSession, *, user_id: int, limit: int = 200, search: str | None = None
) -> list[AgentSession]:
    """The user's visible sessions, most recently active first.

    `search` keeps the sessions whose title or any message contains it (case-insensitive).
    """
    query = (
        select(AgentSession)
        .outerjoin(A2ATaskSession, col(A2ATaskSession.session_id) == col(AgentSession.id))
        .where(
            col(AgentSession.user_id) == user_id,
            col(AgentSession.deleted_at).is_(None),
            or_(col(A2ATaskSession.id).is_(None), col(A2ATaskSession.visible_in_sidebar) == 1),
        )
        .order_by(col(AgentSession.updated_at).desc(), col(AgentSession.id).desc())
        .limit(limit)
    )
    words = (search or "").strip().lower()
    if words:
        pattern = f"%{_escape_like(words)}%"
        in_messages = (
            select(AgentMessage.id)
            .where(
                col(AgentMessage.session_id) == AgentSession.id,
                func.lower(AgentMessage.content).like(pattern, escape="\\"),
            )
            .exists()
        )
        query = query.where(or_(func.lower(AgentSession.title).like(pattern, escape="\\"), in_messages))
    return list((await session.exec(query)).all())


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


async def rename_session(session: AsyncSession, *, session_id: str, user_id: int, title: str) -> AgentSession | None:
    """Give a user's session a new title (one line, at most `TITLE_LENGTH` characters); None when not theirs."""
    row = await get_user_session(session, session_id=session_id, user_id=user_id)
    if row is None:
        return None
    row.title = make_title(title)
    session.add(row)
    await session.commit()
    await session.refresh(row)
    return row


async def restore_session(session: AsyncSession, *, session_id: str, user_id: int) -> bool:
    """Undo `delete_session`; False when it is not theirs or not deleted."""
    row = await session.get(AgentSession, session_id)
    if row is None or row.user_id != user_id or row.deleted_at is None:
        return False
    row.deleted_at = None
    session.add(row)
    await session.commit()
    return True


async def set_session_agent(session: AsyncSession, *, session_id: str, agent_id: int) -> AgentSession | None:
    """Point a session at another agent (used while it has no messages)."""
    row = await get_session(session, session_id)
    if row is None:
        return None
    row.agent_id = agent_id
    session.add(row)
    await session.commit()
    return row


async def delete_session(session: AsyncSession, *, session_id: str, user_id: int) -> bool:
    """Soft-delete a user's session; False when it is not theirs or already gone."""
    row = await get_user_session(session, session_id=session_id, user_id=user_id)
    if row is None:
        return False
    row.deleted_at = utcnow()
    session.add(row)
    await session.commit()
    return True


async def list_messages(session: AsyncSession, *, session_id: str) -> list[AgentMessage]:
    """Every message of a session in conversation order (a running turn's draft is not one yet)."""
    return list((await session.exec(_CHATS_MESSAGES, params={"chat_id": session_id})).all())


#: The title of a chat until its first user message names it (`_title_untitled`).
UNTITLED = "New chat"


async def max_sort_order(session: AsyncSession, *, session_id: str) -> int:
    """The highest sort order used in the session (0 when empty)."""
    result = await session.exec(select(func.max(AgentMessage.sort_order)).where(AgentMessage.session_id == session_id))
    return result.one() or 0


class CountedCheck(Protocol):
    """A check whose count comes back with the chat's UPDATE in `append_messages` (no statement of its own).

    The UPDATE returns how many turns `user_id` runs (`RUNNING_TURNS`); the check is called with that count
    before the rows are inserted and raises to refuse them (the caller's transaction then writes nothing). The
    per-user limit of running turns in a cluster is one (`turn_starts.RunningTurnsLimit`).
    """

    @property
    def user_id(self) -> int:
        """Whose running turns are counted."""
        ...

    def __call__(self, count: int) -> None:
        """Raise to refuse the append."""
        ...


async def add_messages(
    session: AsyncSession, *, session_id: str, messages: list[dict[str, Any]], check: CountedCheck | None = None
) -> list[AgentMessage]:
    """Append messages (dicts of `AgentMessage` fields) after the last one and commit (`append_messages`)."""
    rows = await append_messages(session, session_id=session_id, messages=messages, check=check)
    await session.commit()  # the rows keep their values (and ids, set at flush): nothing to read back
    return rows


async def add_notes(session: AsyncSession, *, session_id: str, notes: list[dict[str, Any]]) -> list[AgentMessage]:
    """Append the notes of background tasks read past the session's position in each, and commit.

    A note with an `inject_position` is saved only when that position is beyond the highest one the
    session holds for its task (`a2a_task_id`): the chat inbox's position in a task's log is what its
    notes say, so an inject read twice (a restart, a new reader, a Redis cut) is saved once, and progress
    arriving after the task's result is not saved at all. The unique index of migration 0010 backs it.
    Returns the rows saved (none when every note was already there).
    """
    await _lock_session(session, session_id)
    tasks = {n["a2a_task_id"] for n in notes if n.get("inject_position") is not None}
    read_up_to: dict[str | None, int] = {}
    if tasks:
        rows = await session.exec(
            select(AgentMessage.a2a_task_id, func.max(AgentMessage.inject_position))
            .where(AgentMessage.session_id == session_id, col(AgentMessage.a2a_task_id).in_(tasks))
            .group_by(col(AgentMessage.a2a_task_id))
        )
        read_up_to = {task: position or 0 for task, position in rows.all()}
    fresh = []
    for note in notes:
        task, position = note.get("a2a_task_id"), note.get("inject_position")
        if position is not None:
            if position <= read_up_to.get(task, 0):
                continue
            read_up_to[task] = position
        fresh.append(note)
    if not fresh:
        return []
    return await add_messages(session, session_id=session_id, messages=fresh)


def _is_postgresql(session: AsyncSession) -> bool:
    return session.bind is not None and session.bind.dialect.name == "postgresql"


async def _lock_session(session: AsyncSession, session_id: str) -> None:
    """On PostgreSQL, lock the session's row: writers on several replicas take turns at its messages."""
    if _is_postgresql(session):
        await session.exec(select(AgentSession.id).where(AgentSession.id == session_id).with_for_update())


async def append_messages(
    session: AsyncSession, *, session_id: str, messages: list[dict[str, Any]], check: CountedCheck | None = None
) -> list[AgentMessage]:
    """Append messages (dicts of `AgentMessage` fields) after the last one, in `session`'s transaction.

    Also bumps the session's `updated_at`, and titles an untitled session after its first user message.
    On PostgreSQL the session's row is locked first, so writers on several replicas take turns at the
    highest sort order (unique per session since migration 0008; SQLite has one writer at a time anyway).
    `check` is called with its count, read by the chat's UPDATE, before the rows are written.
    The caller commits, with whatever else belongs to the same unit of work.
    """
    first_user = first_user_message(messages)
    chat = session.identity_map.get(identity_key(AgentSession, session_id))
    if chat is not None:  # loaded in this unit of work: changed there, written at its flush
        if check is not None:
            check(await running_turns_store.count_running_turns(session, user_id=check.user_id))
        await _lock_session(session, session_id)
        order = await max_sort_order(session, session_id=session_id)
        rows = [AgentMessage(session_id=session_id, sort_order=order + i, **f) for i, f in enumerate(messages, 1)]
        session.add_all(rows)
        chat.updated_at = utcnow()
        _title_untitled(chat, first_user)
        session.add(chat)
        return rows
    # Not loaded: two statements (four before, issue 41). One UPDATE bumps the time and titles an untitled chat
    # without reading it first; on PostgreSQL it also locks the chat's row, as `_lock_session` would. Then one
    # INSERT numbers the rows after the highest sort order it reads itself (its snapshot is taken after that
    # lock) and returns their ids and positions: no read of the highest position before it, no ORM flush.
    # A check's count is returned by the UPDATE (a statement that starts after the caller's own locks, so its
    # snapshot sees every start that held them before: `turn_starts.RunningTurnsLimit`).
    # Both statements are built once (`BUMP_CHAT`, `_INSERT_MESSAGES`): built and compiled at each start they
    # were most of its client CPU (issue 41).
    bump = chat_bump(session_id, first_user)
    if check is not None and _is_postgresql(session):
        counted = await session.exec(
            _BUMP_CHAT_COUNTED, params={**bump, running_turns_store.COUNTED_USER: check.user_id}
        )
        check(counted.scalar() or 0)  # no row: the INSERT fails
    else:
        await session.exec(BUMP_CHAT, params=bump)
        if check is not None:  # SQLite (whose RETURNING drops the subquery's table names): its own statement
            check(await running_turns_store.count_running_turns(session, user_id=check.user_id))
    [rows] = await _insert_after_highest(session, [(session_id, messages)])
    return rows


async def append_to_locked_chats(
    session: AsyncSession, chats: list[tuple[str, list[dict[str, Any]]]]
) -> list[list[AgentMessage]]:
    """`append_messages` for several chats at once (each chat once, none loaded), in `session`'s transaction.

    On PostgreSQL: one UPDATE run for each chat (psycopg pipelines it: one round trip), which locks their rows
    in the order of their ids (so two such units never wait for each other in a cycle), then one INSERT of
    every row. Returns each chat's rows; the caller commits.
    """
    bumps = [chat_bump(session_id, first_user_message(messages)) for session_id, messages in chats]
    await session.exec(BUMP_CHAT, params=sorted(bumps, key=lambda bump: str(bump["chat_id"])))
    return await _insert_after_highest(session, chats)


async def _insert_after_highest(
    session: AsyncSession, chats: list[tuple[str, list[dict[str, Any]]]]
) -> list[list[AgentMessage]]:
    """The chats' new rows in one INSERT, each chat's after its highest position; their ids and positions set."""
    written = [[AgentMessage(session_id=session_id, **fields) for fields in messages] for session_id, messages in chats]
    params = [  # every column as the ORM sets it
        {**{name: getattr(row, name) for name in _INSERTED}, _ROWS_CHAT: row.session_id, _ROW_OFFSET: i}
        for rows in written
        for i, row in enumerate(rows, 1)
    ]
    inserted: dict[str, list[tuple[int, int]]] = {}
    for row_id, sort_order, session_id in (await session.exec(_INSERT_MESSAGES, params=params)).all():
        inserted.setdefault(session_id, []).append((sort_order, row_id))
    for rows in written:
        for row, (sort_order, row_id) in zip(rows, sorted(inserted[rows[0].session_id]), strict=True):
            row.id, row.sort_order = row_id, sort_order
    return written


def chat_bump(session_id: str, first_user: dict[str, Any] | None) -> dict[str, Any]:
    """`BUMP_CHAT`'s parameters: the chat's time now, and the title an untitled chat takes from `first_user`."""
    title = make_title(first_user["content"]) if first_user is not None else None
    return {"chat_id": session_id, "bumped": utcnow(), "new_title": title}


def add_first_messages(session: AsyncSession, chat: AgentSession, messages: list[dict[str, Any]]) -> list[AgentMessage]:
    """The first messages of a session added in this same unit of work (`add_session`), in its transaction.

    What `append_messages` does, without its read of the highest sort order (there is none yet, and
    no other writer can see the session before the commit) and without bumping an `updated_at` that
    was set as the session was made (a second statement for the same instant). The caller commits.
    """
    rows = [AgentMessage(session_id=chat.id, sort_order=order, **fields) for order, fields in enumerate(messages, 1)]
    session.add_all(rows)
    _title_untitled(chat, first_user_message(messages))
    return rows


def first_user_message(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first of `messages` that is a user's, with text (what names an untitled chat)."""
    return next((m for m in messages if m.get("role") == "user" and m.get("content")), None)


def _title_untitled(chat: AgentSession, first_user: dict[str, Any] | None) -> None:
    """An untitled session is titled after its first user message."""
    if first_user is not None and chat.title == UNTITLED:
        chat.title = make_title(first_user["content"])


async def remove_messages_after(
    session: AsyncSession, *, session_id: str, sort_order: int, role: str | None = None
) -> int:
    """Delete a session's messages after `sort_order` (only those of `role` when given), in `session`'s transaction.

    Used when a chat is rewound to its last user message (`core.chat.rewind`); the caller commits.
    The notes of background tasks that have a position stay: they are the chat inbox's reading
    position in each task (`add_notes`), and without them the broker would deliver a result again.
    Returns how many rows went.
    """
    await _lock_session(session, session_id)
    query = delete(AgentMessage).where(
        col(AgentMessage.session_id) == session_id,
        col(AgentMessage.sort_order) > sort_order,
        col(AgentMessage.inject_position).is_(None),
    )
    if role is not None:
        query = query.where(col(AgentMessage.role) == role)
    result = await session.exec(query.execution_options(synchronize_session=False))
    return result.rowcount or 0


async def save_drafts(session: AsyncSession, drafts: Mapping[int, str]) -> None:
    """Write running turns' text so far into their drafts (message id -> text), in one transaction.

    One UPDATE run for all the drafts at once (`executemany`: one trip to the database's thread on
    SQLite, however many turns run; on PostgreSQL psycopg pipelines it, one round trip for the batch,
    issue 41); a draft that is gone (its turn has ended) is simply not found.
    One statement per draft held SQLite's one writer for a hundred trips at 100 turns, each waiting
    milliseconds for the busy event loop, while the sends of new turns queued behind it (issue 38).
    """
    if drafts:
        await session.exec(
            _SAVE_DRAFT,
            params=[{"draft_id": message_id, "draft_text": content} for message_id, content in drafts.items()],
        )
    await session.commit()


_MESSAGES: Table = AgentMessage.__table__  # type: ignore[attr-defined]  # SQLModel's table, typed loosely
_SESSIONS: Table = AgentSession.__table__  # type: ignore[attr-defined]
_SAVE_DRAFT = (
    update(_MESSAGES)
    .where(_MESSAGES.c.id == bindparam("draft_id"), _MESSAGES.c.status == STREAMING)
    .values(content=bindparam("draft_text"))
)

#: The columns `append_messages` gives each new row (its id and position come from the INSERT).
_INSERTED = tuple(name for name in AgentMessage.model_fields if name not in {"id", "sort_order"})

_NEW_TITLE = bindparam("new_title", type_=_SESSIONS.c.title.type)  # typed: PostgreSQL is asked `$n IS NOT NULL`
# The reads of every turn start, built once: a statement built at each call computes its cache key again
# (issue 41). `session.get` builds one too: `get_session` looks in the identity map itself.
_CHAT_BY_ID = select(AgentSession).where(col(AgentSession.id) == bindparam("chat_id"))
_CHATS_MESSAGES = (
    select(AgentMessage)
    .where(col(AgentMessage.session_id) == bindparam("chat_id"), col(AgentMessage.status) != STREAMING)
    .order_by(col(AgentMessage.sort_order), col(AgentMessage.id))
)

#: A chat's time bumped, its title set from `new_title` while it is untitled and one is given (`chat_bump`).
BUMP_CHAT = (
    update(_SESSIONS)
    .where(_SESSIONS.c.id == bindparam("chat_id"))
    .values(
        updated_at=bindparam("bumped"),
        title=case(
            (and_(_SESSIONS.c.title == UNTITLED, _NEW_TITLE.is_not(None)), _NEW_TITLE),
            else_=_SESSIONS.c.title,
        ),
    )
)

_BUMP_CHAT_COUNTED = BUMP_CHAT.returning(running_turns_store.RUNNING_TURNS)

_ROWS_CHAT, _ROW_OFFSET = "rows_chat_id", "row_offset"
#: New messages, each after its chat's highest position, which the INSERT reads itself; run with one set of
#: parameters per row: one multi-row statement (`insertmanyvalues`), whose rows of a chat all read the same highest
#: position. Its RETURNING is in no promised order: the chats and positions say which row is which.
_INSERT_MESSAGES = (
    insert(_MESSAGES)
    .values(
        sort_order=select(func.coalesce(func.max(_MESSAGES.c.sort_order), 0))
        .where(_MESSAGES.c.session_id == bindparam(_ROWS_CHAT))
        .scalar_subquery()
        + bindparam(_ROW_OFFSET)
    )
    .returning(_MESSAGES.c.id, _MESSAGES.c.sort_order, _MESSAGES.c.session_id)
)


async def mark_interrupted(session: AsyncSession) -> int:
    """At start-up: drafts still `streaming` were cut off by a stop or crash; keep their text as `interrupted`.

    Returns how many there were.
    """
    result = await session.exec(
        update(AgentMessage)
        .where(col(AgentMessage.status) == STREAMING)
        .values(status=INTERRUPTED, error=INTERRUPTED_ERROR)
    )
    await session.commit()
    return result.rowcount or 0


async def interrupt_draft(session: AsyncSession, *, message_id: int, content: str, error: str) -> bool:
    """End one draft whose turn's replica stopped (a cluster's reaper): keep `content`, mark it `interrupted`.

    Returns False when the draft was already replaced by an answer (nothing to do).
    """
    result = await session.exec(
        update(AgentMessage)
        .where(col(AgentMessage.id) == message_id, col(AgentMessage.status) == STREAMING)
        .values(content=content, status=INTERRUPTED, error=error)
    )
    await session.commit()
    return bool(result.rowcount)


def make_title(text: str) -> str:
    """A one-line title from the first user message."""
    line = " ".join(text.split())
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1].rstrip() + "…"
