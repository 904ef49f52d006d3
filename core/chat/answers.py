"""A turn's end: its answer written over its draft row, and the answers of turns that end together, together.

A turn streams into a draft row (`core.chat.drafts`); its end writes the answer over it (`answer_in_place`: no
delete, no insert, the chat's time bumped), or, when that cannot be (a note saved after the draft, an answer of
several steps), drops the draft and appends the rows (`replace_draft`).

On PostgreSQL the turns that end while an answer is on its way are written together by `AnswerWriter`, in one
statement (`answer_together`): at 100 turns ending at once, a replica's answers one by one were 6 % of its CPU
for the turns' starts and ends, against well under 1 % for one process on SQLite (issue 41,
docs/ARCHITECTURE.md "A replica at a process's cost"). An answer after a quiet spell is written at once, with
the others of that same moment.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from pydantic.fields import FieldInfo
from sqlalchemy import (
    JSON,
    Integer,
    String,
    Table,
    Text,
    bindparam,
    column,
    delete,
    exists,
    func,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.chat import sessions as sessions_store
from core.db import Database
from models import AgentMessage, AgentSession, UTCDateTime, utcnow

__all__ = ["AnswerWriter", "answer_in_place", "answer_together", "replace_draft", "save_answer"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Answer:
    """A one-row answer waiting to be written over its draft with others (`AnswerWriter`)."""

    session_id: str
    draft_id: int
    fields: dict[str, Any]
    written: asyncio.Future[None]


class AnswerWriter:
    """Writes the answers of turns that end together over their drafts, together (PostgreSQL).

    An answer that comes while none is being written is written at once (with any others queued in that same
    step of the event loop). The answers that come while a write is on its way wait for it and are written
    together next, in one statement (`answer_together`): one statement (and one round trip) per batch, however
    many turns end. Two answers of one chat (which
    one turn at a time never gives) go in separate batches. An answer the batch could not write over its
    draft (a note saved after it) drops the draft and appends its rows on its own (`replace_draft`), as
    `save_answer` does; if the batch fails, each of its answers is written again on its own, so only the
    one at fault fails. On SQLite, and for answers of several rows, `save` is `save_answer`.

    Args:
        db: the database.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self.batches = 0  # statements that wrote several answers
        self._queue: list[_Answer] = []
        self._writer: asyncio.Task[None] | None = None

    async def save(self, session_id: str, draft_id: int, rows: list[dict[str, Any]]) -> None:
        """The answer in place of its draft (as `save_answer`), written with the others that end now."""
        if len(rows) != 1 or self.db.dialect != "postgresql":
            await save_answer(self.db, session_id, draft_id, rows)
            return
        answer = _Answer(session_id, draft_id, rows[0], asyncio.get_running_loop().create_future())
        self._queue.append(answer)
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_queued(), name="save answers")
        await asyncio.shield(answer.written)  # a canceled turn leaves its answer to be written

    async def _write_queued(self) -> None:
        batch: list[_Answer] = []
        try:
            while self._queue:
                batch, self._queue = _one_per_chat(self._queue)
                await self._write(batch)
                batch = []
        finally:  # canceled (the server stops): no turn waits for an answer that will not be written
            stopped = RuntimeError("the server stopped before this answer was saved")
            for answer in [*batch, *self._queue]:
                _resolve(answer.written, stopped)
            self._queue = []
            self._writer = None

    async def _write(self, batch: list[_Answer]) -> None:
        if len(batch) == 1:
            await _settle(batch[0], save_answer(self.db, batch[0].session_id, batch[0].draft_id, [batch[0].fields]))
            return
        try:
            answered = await answer_together(self.db, [(a.session_id, a.draft_id, a.fields) for a in batch])
        except Exception:
            log.warning("could not write %d answers together; writing each on its own", len(batch), exc_info=True)
            for answer in batch:
                await _settle(answer, save_answer(self.db, answer.session_id, answer.draft_id, [answer.fields]))
            return
        self.batches += 1
        for answer in batch:
            if answer.draft_id in answered:
                _resolve(answer.written, None)
            else:
                await _settle(answer, self._replace(answer))

    async def _replace(self, answer: _Answer) -> None:
        async with self.db.session() as s:
            await replace_draft(s, session_id=answer.session_id, message_id=answer.draft_id, messages=[answer.fields])


def _one_per_chat(queue: list[_Answer]) -> tuple[list[_Answer], list[_Answer]]:
    """The next batch (the first answer of each chat, in order) and what waits for the one after."""
    batch: list[_Answer] = []
    later: list[_Answer] = []
    chats: set[str] = set()
    for answer in queue:
        (later if answer.session_id in chats else batch).append(answer)
        chats.add(answer.session_id)
    return batch, later


async def _settle(answer: _Answer, write: Awaitable[None]) -> None:
    """Await `write` and hand its outcome to whoever waits for `answer`."""
    try:
        await write
    except Exception as exc:
        _resolve(answer.written, exc)
    else:
        _resolve(answer.written, None)


def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


async def save_answer(db: Database, session_id: str, draft_id: int, rows: list[dict[str, Any]]) -> None:
    """The answer in place of its draft: one row written over it, else the draft dropped and the rows appended."""
    if len(rows) == 1:
        # On PostgreSQL one statement, committed on its own: no BEGIN and COMMIT around it (issue 41).
        async with db.single_statement() as s:
            if await answer_in_place(s, session_id=session_id, message_id=draft_id, fields=rows[0]):
                await s.commit()
                return
    async with db.session() as s:  # a note saved after the draft, or an answer of several steps
        await replace_draft(s, session_id=session_id, message_id=draft_id, messages=rows)


async def replace_draft(
    session: AsyncSession, *, session_id: str, message_id: int | None, messages: list[dict[str, Any]]
) -> list[AgentMessage]:
    """End a turn whose answer could not take its draft's place (`answer_in_place`): drop the draft, append the rows.

    In one transaction: the draft is deleted and the answer's rows go after everything saved while the
    turn ran (notes of background tasks), as they did before turns kept drafts (`add_messages`, which
    commits). Returns the rows appended.
    """
    if message_id is not None:
        await session.exec(
            delete(AgentMessage)
            .where(col(AgentMessage.id) == message_id, col(AgentMessage.status) == sessions_store.STREAMING)
            .execution_options(synchronize_session=False)  # the draft row is not loaded in this session
        )
    if messages:
        return await sessions_store.add_messages(session, session_id=session_id, messages=messages)
    await session.commit()
    return []


async def answer_in_place(session: AsyncSession, *, session_id: str, message_id: int, fields: dict[str, Any]) -> bool:
    """The answer (one row) written over its draft if that is still `streaming` and last; the chat's time bumped.

    No delete, no read of the highest position, no insert (issue 38): the row is the one an insert would have
    made, but for its id and position. On PostgreSQL one statement (the chat's UPDATE runs on what the draft's
    returns, in a data-modifying `WITH`), so it can run as its own transaction (`Database.single_statement`:
    no BEGIN and COMMIT round trips, issue 41); SQLite, which has no UPDATE in a `WITH`, runs two. The caller
    commits. False when the draft is gone or no longer last (nothing written: `replace_draft` then).

    Written against the tables (SQLAlchemy Core), not the ORM entities: an ORM-enabled UPDATE with an
    aliased entity in its WHERE adapts every column of the statement again at each execution, which
    was a sixth of a short turn's CPU (bench/bench_model_path.py, issue 38).
    """
    params = {_ANSWER_ID: message_id, _ANSWER_CHAT: session_id, "bumped": utcnow()}
    params.update({_value_name(name): value for name, value in _answered_values(fields).items()})
    if session.bind is not None and session.bind.dialect.name == "postgresql":
        result = await session.exec(_ANSWER_AND_BUMP, params=params)
        return bool(result.rowcount)  # the chat's row was bumped: its draft was answered
    result = await session.exec(_ANSWER, params=params)
    if result.rowcount != 1:
        return False
    await session.exec(_BUMP_ANSWERED_CHAT, params=params)
    return True


_MESSAGES: Table = AgentMessage.__table__  # type: ignore[attr-defined]  # SQLModel's table, typed loosely
_LATER_MESSAGES = _MESSAGES.alias("later")
_SESSIONS: Table = AgentSession.__table__  # type: ignore[attr-defined]
#: What an answer written over its draft keeps of the draft's row.
_KEPT = frozenset({"id", "session_id", "sort_order"})
#: The columns an answer writes over its draft.
_ANSWERED = tuple(name for name in AgentMessage.model_fields if name not in _KEPT)
_ANSWER_ID, _ANSWER_CHAT = "answer_id", "answer_chat_id"


def _default(field: FieldInfo) -> Callable[[], Any]:
    """What `AgentMessage(...)` sets a column it is not given to: its default (a factory's value made anew)."""
    if field.default_factory is not None:
        return cast("Callable[[], Any]", field.default_factory)
    value = None if field.is_required() else field.default  # a table model does not validate: unset is None
    return lambda: value


#: Each answered column's default.
_DEFAULTS = {name: _default(field) for name, field in AgentMessage.model_fields.items() if name in _ANSWERED}


def _answered_values(fields: dict[str, Any]) -> dict[str, Any]:
    """Every answered column as an insert would set it (`AgentMessage`'s defaults), without making the ORM object."""
    return {name: fields[name] if name in fields else _DEFAULTS[name]() for name in _ANSWERED}


def _value_name(column: str) -> str:
    return f"answer_{column}"  # a SET's parameter may not be named after its column


# Built once, with parameters: built and compiled at each turn's end they cost more CPU than the rest of
# its database work (issue 41).
_ANSWER = (
    update(_MESSAGES)
    .where(
        _MESSAGES.c.id == bindparam(_ANSWER_ID),
        _MESSAGES.c.status == sessions_store.STREAMING,
        ~exists().where(
            _LATER_MESSAGES.c.session_id == bindparam(_ANSWER_CHAT),
            _LATER_MESSAGES.c.sort_order > _MESSAGES.c.sort_order,
        ),
    )
    .values({name: bindparam(_value_name(name)) for name in _ANSWERED})
)
_BUMP_ANSWERED_CHAT = (
    update(_SESSIONS).values(updated_at=bindparam("bumped")).where(_SESSIONS.c.id == bindparam(_ANSWER_CHAT))
)
_ANSWERED_CTE = _ANSWER.returning(_MESSAGES.c.session_id).cte("answered")
#: PostgreSQL: the chat's UPDATE runs on what the draft's returns (a data-modifying `WITH`).
_ANSWER_AND_BUMP = (
    update(_SESSIONS)
    .values(updated_at=bindparam("bumped"))
    .where(_SESSIONS.c.id.in_(select(_ANSWERED_CTE.c.session_id)))
)


async def answer_together(db: Database, answers: list[tuple[str, int, dict[str, Any]]]) -> set[int]:
    """Several one-row answers `(chat id, draft id, fields)` written over their drafts in one statement (PostgreSQL).

    Each as `answer_in_place` writes it: only over a draft still `streaming` and last in its chat, with the
    chat's time bumped. The answers go as one JSON parameter, read back into rows by `jsonb_to_recordset`,
    so the statement is the same (built and compiled once) however many there are. The chats must differ.
    Returns the drafts answered; the others were left as they were (`replace_draft` then).
    """
    document = [
        {_ANSWER_ID: draft_id, _ANSWER_CHAT: chat_id, **_as_json_values(_answered_values(fields))}
        for chat_id, draft_id, fields in answers
    ]
    drafts = {chat_id: draft_id for chat_id, draft_id, _ in answers}
    async with db.single_statement() as s:
        result = await s.exec(
            _ANSWER_TOGETHER, params={"answers": json.dumps(document, separators=(",", ":")), "bumped": utcnow()}
        )
        chats = [row[0] for row in result.all()]
        await s.commit()
    return {drafts[chat_id] for chat_id in chats}


#: The answered columns whose values travel as JSON text in `answer_together`'s document (cast back in SQL).
_JSON_COLUMNS = frozenset(name for name in _ANSWERED if isinstance(_MESSAGES.c[name].type, JSON))


_AS_UTC = UTCDateTime()


def _as_json_values(values: dict[str, Any]) -> dict[str, Any]:
    """An answer's columns as `answer_together`'s document carries them: what the single statement would bind.

    A JSON column's value is its JSON text, as SQLAlchemy sends it (so a None is the JSON `null` it stores,
    not SQL NULL); a time is its ISO text, in UTC.
    """
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in _JSON_COLUMNS:
            out[name] = json.dumps(value)
        elif isinstance(value, datetime):
            out[name] = _AS_UTC.process_bind_param(value, None).isoformat()  # type: ignore[union-attr]
        else:
            out[name] = value
    return out


def _recordset_type(name: str) -> Any:
    """The type a column of `answer_together`'s document is read as (JSON as text; times with their zone)."""
    if name in _JSON_COLUMNS:
        return Text()
    kind = _MESSAGES.c[name].type
    return kind.impl if isinstance(kind, UTCDateTime) else kind


_DOCUMENT = (
    func.jsonb_to_recordset(sql_cast(bindparam("answers", type_=Text), JSONB))
    .table_valued(
        column(_ANSWER_ID, Integer),
        column(_ANSWER_CHAT, String),
        *(column(name, _recordset_type(name)) for name in _ANSWERED),
    )
    .render_derived(name="answer", with_types=True)
)
_ANSWERED_TOGETHER = (
    update(_MESSAGES)
    .where(
        _MESSAGES.c.id == _DOCUMENT.c[_ANSWER_ID],
        _MESSAGES.c.session_id == _DOCUMENT.c[_ANSWER_CHAT],
        _MESSAGES.c.status == sessions_store.STREAMING,
        ~exists().where(
            _LATER_MESSAGES.c.session_id == _MESSAGES.c.session_id,
            _LATER_MESSAGES.c.sort_order > _MESSAGES.c.sort_order,
        ),
    )
    .values(
        {name: sql_cast(_DOCUMENT.c[name], JSON) if name in _JSON_COLUMNS else _DOCUMENT.c[name] for name in _ANSWERED}
    )
    .returning(_MESSAGES.c.session_id)
    .cte("answered")
)
#: The chats whose drafts were answered, bumped; their ids come back.
_ANSWER_TOGETHER = (
    update(_SESSIONS)
    .values(updated_at=bindparam("bumped"))
    .where(_SESSIONS.c.id.in_(select(_ANSWERED_TOGETHER.c.session_id)))
    .returning(_SESSIONS.c.id)
)
