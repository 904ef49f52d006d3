"""New messages of turns that start together are written together (`core/chat/turn_starts.py`, issues 38 and 41).

Twenty sends at once: fewer units of work than sends write their messages, and each chat still gets
its own question and answer in order, titled after its question. A batch that fails is written again
one start at a time, so the others are saved as if nothing happened. On SQLite and on PostgreSQL, where a
batch also holds a cluster's per-user limit of running turns: starts that come together are counted as if
they came one after the other.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlmodel import select

from core.chat import rewind, turn_starts
from core.chat.errors import TooManyRunningTurnsError
from core.chat.turn_starts import RunningTurnsLimit, TurnStarts
from core.services import Services
from models import AgentMessage, AgentSession
from tests.test_chat_engine import new_chat, saved
from tests.test_running_turns_count import _agent_of
from tests.utils.statements import recorded_statements

SENDS = 20


async def _send_all(services: Services, chats: list[str]) -> list[set[int]]:
    """Each chat sent its question at once; the units of work (connections) that inserted messages."""
    with recorded_statements(services.db) as statements:
        await asyncio.gather(
            *(
                services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text=f"question {i}")
                for i, chat in enumerate(chats)
            )
        )
    inserting = {conn for conn, statement in statements if statement.startswith("INSERT INTO agent_messages")}
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
    real = turn_starts.TurnStarts._unit
    failed: list[int] = []

    async def fails_once(self: TurnStarts, session: Any, batch: list[Any]) -> Any:
        if not failed:
            failed.append(len(batch))
            raise RuntimeError("the batch's write failed")
        return await real(self, session, batch)

    monkeypatch.setattr(turn_starts.TurnStarts, "_unit", fails_once)
    chats = [await new_chat(services) for _ in range(SENDS)]
    await _send_all(services, chats)
    assert failed  # the first batch failed, and was written again start by start
    await _each_chat_has_its_own_question_and_answer(services, chats)


async def test_starts_that_come_together_are_held_to_the_users_limit_as_if_one_by_one(services: Services) -> None:
    user = services.auth.local_user_id
    assert user is not None
    chats = [await new_chat(services) for _ in range(5)]
    agent = await _agent_of(services, chats[0])
    starts = TurnStarts(services.db)
    limit = RunningTurnsLimit(services.db, user, 3)

    outcomes = await asyncio.gather(
        *(starts.save(rewind.new_message(f"q{i}"), chat, agent, [], limit=limit) for i, chat in enumerate(chats)),
        return_exceptions=True,
    )

    refused = [chat for chat, outcome in zip(chats, outcomes, strict=True) if isinstance(outcome, BaseException)]
    assert all(isinstance(o, TooManyRunningTurnsError) for o in outcomes if isinstance(o, BaseException)), outcomes
    assert len(refused) == 2, outcomes  # three drafts, then two refusals: none counted twice, none missed
    for chat, outcome in zip(chats, outcomes, strict=True):
        async with services.db.read() as r:
            rows = (await r.exec(select(AgentMessage).where(AgentMessage.session_id == chat))).all()
        if chat in refused:
            assert rows == []  # a refused start writes nothing
            continue
        assert not isinstance(outcome, BaseException)
        written = sorted((r.sort_order, r.role, r.status, r.id) for r in rows)
        assert written == [(1, "user", "complete", outcome.anchor.id), (2, "assistant", "streaming", outcome.draft.id)]
