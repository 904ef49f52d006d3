"""Crash safety for a session's turn: its answer is kept in a draft row while it streams.

A turn's start saves a draft assistant row (status `streaming`, `draft_fields`); `DraftSaver`
writes the text so far into it about once a second; the turn's end replaces it with the saved
answer (`core.chat.answers`). The saves of all running turns go through one
`DraftWriter`, which writes the drafts that are due together in one unit of work. A draft left
by a kill is marked `interrupted` at the next start (`ChatEngine.fail_interrupted`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from core.chat import sessions as sessions_store
from core.db import Database
from models import Agent

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
