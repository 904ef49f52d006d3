"""Crash safety for a session's turn: its answer is kept in a draft row while it streams.

A turn's start saves a draft assistant row (status `streaming`, `draft_fields`); `DraftSaver`
writes the text so far into it about once a second; the turn's end replaces it with the saved
answer (`core.chat.sessions.replace_draft`). A draft left by a kill is marked `interrupted` at
the next start (`ChatEngine.fail_interrupted`).
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


class DraftSaver:
    """Keeps a running turn's text so far in its draft row, about once per `interval_s`, never per chunk.

    `touch` runs on every streamed chunk and only reads the clock. When `interval_s` has passed
    since the last save and no save is in flight, it starts one (one UPDATE of the one row) in a
    task of its own: streaming never waits on the database, and one save at most is in flight.
    A failed save is logged and retried at the next interval. `settle` waits for a save in flight,
    so the turn's final save comes after it.

    Args:
        db: the database.
        message_id: the draft row (status `streaming`).
        text: the run's text so far (`AgentRun.text_so_far`), read only when saving.
        interval_s: the least time between two saves.
    """

    def __init__(self, db: Database, message_id: int, text: Callable[[], str], *, interval_s: float = 1.0) -> None:
        self.db = db
        self.message_id = message_id
        self.text = text
        self.interval_s = interval_s
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
        self._in_flight = asyncio.get_running_loop().create_task(
            self._save(text), name=f"save draft {self.message_id}")

    async def _save(self, text: str) -> None:
        try:
            async with self.db.session() as s:
                await sessions_store.save_draft(s, message_id=self.message_id, content=text)
            self.saves += 1
            self._saved_chars = len(text)
        except Exception:
            log.warning("could not save the draft answer %s; trying again in %g s", self.message_id,
                        self.interval_s, exc_info=True)
        finally:
            self._in_flight = None

    async def settle(self) -> None:
        """Wait for the save in flight, if any (without cancelling it when the caller is cancelled)."""
        if self._in_flight is not None:
            await asyncio.wait([self._in_flight])


def draft_fields(agent: Agent) -> dict[str, Any]:
    """The row a session turn's answer is streamed into until the turn saves it (`core.chat.sessions.STREAMING`)."""
    return {"role": "assistant", "content": "", "model_id": agent.model, "status": sessions_store.STREAMING,
            "source": "user"}
