"""On SQLite the new messages of turns that start together are written together (`core/chat/turn_starts.py`, issue 38).

Twenty sends at once: fewer units of work than sends write their messages, and each chat still gets
its own question and answer in order, titled after its question. A batch that fails is written again
one start at a time, so the others are saved as if nothing happened.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from core.chat import turn_starts
from core.services import Services
from models import AgentSession
from tests.test_chat_engine import new_chat, saved

SENDS = 20


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """SQLite only (conftest's `services` serves on it): PostgreSQL writes each start in its own unit of work."""
    return f"sqlite:///{tmp_path / 'data' / 'app.db'}"


async def _send_all(services: Services, chats: list[str]) -> list[set[int]]:
    """Each chat sent its question at once; the units of work (connections) that inserted messages."""
    inserting: set[int] = set()

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("INSERT INTO agent_messages"):
            inserting.add(id(conn))

    engine = services.db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        await asyncio.gather(
            *(
                services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text=f"question {i}")
                for i, chat in enumerate(chats)
            )
        )
    finally:
        event.remove(engine, "before_cursor_execute", record)
    for chat in chats:
        await services.chat.wait(chat, timeout=30)
    return [inserting]


async def _each_chat_has_its_own_question_and_answer(services: Services, chats: list[str]) -> None:
    for i, chat in enumerate(chats):
        user, answer = await saved(services, chat)
        assert (user.role, user.content, user.sort_order) == ("user", f"question {i}", 1)
        assert (answer.role, answer.status, answer.sort_order) == ("assistant", "complete", 2) and answer.content
    async with services.db.read() as s:
        titles = {chat: (await s.get(AgentSession, chat)).title for chat in chats}
    assert [titles[chat] for chat in chats] == [f"question {i}" for i in range(len(chats))]


async def test_sends_that_come_together_are_saved_together_each_in_its_own_chat(services: Services) -> None:
    chats = [await new_chat(services) for _ in range(SENDS)]
    [inserting] = await _send_all(services, chats)
    assert len(inserting) < SENDS / 2, f"{len(inserting)} units of work for {SENDS} sends"
    await _each_chat_has_its_own_question_and_answer(services, chats)


async def test_a_batch_that_fails_is_saved_one_start_at_a_time(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = turn_starts.append_to_chats
    failed: list[int] = []

    async def fails_once(session, chats):
        if not failed:
            failed.append(len(chats))
            raise RuntimeError("the batch's write failed")
        return await real(session, chats)

    monkeypatch.setattr(turn_starts, "append_to_chats", fails_once)
    chats = [await new_chat(services) for _ in range(SENDS)]
    await _send_all(services, chats)
    assert failed  # the first batch failed, and was written again start by start
    await _each_chat_has_its_own_question_and_answer(services, chats)
