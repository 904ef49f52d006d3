"""Crash safety for a session's turn: its answer is kept in a draft row while it streams.

A turn's start saves a draft assistant row (status `streaming`, `draft_fields`); `DraftSaver`
writes the text so far into it about once a second; the turn's end replaces it with the saved
answer (`save_answer`). The saves of all running turns go through one
`DraftWriter`, which writes the drafts that are due together in one unit of work. A draft left
by a kill is marked `interrupted` at the next start (`ChatEngine.fail_interrupted`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from pydantic.fields import FieldInfo
from sqlalchemy import Table, bindparam, delete, exists, update
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.chat import sessions as sessions_store
from core.db import Database
from models import Agent, AgentMessage, AgentSession, utcnow

log = logging.getLogger(__name__)


class DraftWriter:
    """Writes the drafts of every running turn that are due together, in one unit of work.

    With a hundred turns streaming, one transaction per draft per second would be a hundred
    units of work a second; on SQLite they take turns, and every other request (a page, a
    stream's ownership check) waits behind them. Here a save joins the batch that is waiting:
    a batch waits `gather_s` for more drafts, then for its turn at the database, and is
    written when that comes (one UPDATE per draft, one commit); saves that come after that go
    into the next one. So there are at most about 1 / `gather_s` draft transactions a second,
    however many turns run, and a draft is at most `gather_s` later than it would be alone.

    Args:
        db: the database.
        gather_s: how long a batch waits for more drafts before it asks for the database.
    """

    def __init__(self, db: Database, *, gather_s: float = 0.2) -> None:
        self.db = db
        self.gather_s = gather_s
        self.batches = 0
        self._waiting: tuple[dict[int, str], asyncio.Future[None]] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def save(self, message_id: int, text: str) -> asyncio.Future[None]:
        """Queue `text` for the draft `message_id`; the future ends when it is written (or failed)."""
        if self._waiting is None:
            batch: tuple[dict[int, str], asyncio.Future[None]] = ({}, asyncio.get_running_loop().create_future())
            self._waiting = batch
            task = asyncio.get_running_loop().create_task(self._write(batch), name="save drafts")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        drafts, written = self._waiting
        drafts[message_id] = text
        return written

    async def _write(self, batch: tuple[dict[int, str], asyncio.Future[None]]) -> None:
        drafts, written = batch
        try:
            await asyncio.sleep(self.gather_s)
            async with self.db.session() as s:
                if self._waiting is batch:  # from here on, saves go into the next batch
                    self._waiting = None
                await sessions_store.save_drafts(s, drafts)
            self.batches += 1
        except asyncio.CancelledError:
            written.cancel()
            raise
        except Exception as exc:
            written.set_exception(exc)
        else:
            written.set_result(None)
        finally:
            if self._waiting is batch:
                self._waiting = None


class DraftSaver:
    """Keeps a running turn's text so far in its draft row, about once per `interval_s`, never per chunk.

    `touch` runs on every streamed chunk and only reads the clock. When `interval_s` has passed
    since the last save and no save is in flight, it hands the text to the `DraftWriter` (one
    UPDATE of the one row, batched with the other turns' drafts due then) in a task of its own:
    streaming never waits on the database, and one save at most is in flight. A failed save is
    logged and retried at the next interval. `settle` waits for a save in flight, so the turn's
    final save comes after it.

    Args:
        db: the database (for a writer of its own, when none is given).
        message_id: the draft row (status `streaming`).
        text: the run's text so far (`AgentRun.text_so_far`), read only when saving.
        interval_s: the least time between two saves.
        writer: the writer shared by the engine's turns.
    """

    def __init__(
        self,
        db: Database,
        message_id: int,
        text: Callable[[], str],
        *,
        interval_s: float = 1.0,
        writer: DraftWriter | None = None,
    ) -> None:
        self.db = db
        self.message_id = message_id
        self.text = text
        self.interval_s = interval_s
        self.writer = writer or DraftWriter(db)
        self.saves = 0
        self._last = time.monotonic()
        self._saved_chars = 0
        self._in_flight: asyncio.Task[None] | None = None

    def touch(self) -> None:
        """A chunk arrived: start a save if one is due."""
        now = time.monotonic()
        if self._in_flight is not None or now - self._last < self.interval_s:
            return
        self._last = now
        text = self.text()
        if len(text) == self._saved_chars:  # the text only grows; nothing new
            return
        self._in_flight = asyncio.get_running_loop().create_task(self._save(text), name=f"save draft {self.message_id}")

    async def _save(self, text: str) -> None:
        try:
            await asyncio.shield(self.writer.save(self.message_id, text))
            self.saves += 1
            self._saved_chars = len(text)
        except Exception:
            log.warning(
                "could not save the draft answer %s; trying again in %g s",
                self.message_id,
                self.interval_s,
                exc_info=True,
            )
        finally:
            self._in_flight = None

    async def settle(self) -> None:
        """Wait for the save in flight, if any (without cancelling it when the caller is cancelled)."""
        if self._in_flight is not None:
            await asyncio.wait([self._in_flight])


def draft_fields(agent: Agent) -> dict[str, Any]:
    """The row a session turn's answer is streamed into until the turn saves it (`core.chat.sessions.STREAMING`)."""
    return {
        "role": "assistant",
        "content": "",
        "model_id": agent.model,
        "status": sessions_store.STREAMING,
        "source": "user",
    }


# -- the turn's end: its answer in place of its draft ----------------------------------------------


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
    # Every column as an insert would set it (`AgentMessage`'s defaults), without making the ORM object.
    params.update({_value_name(name): fields[name] if name in fields else _DEFAULTS[name]() for name in _ANSWERED})
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
