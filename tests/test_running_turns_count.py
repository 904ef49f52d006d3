"""A cluster's per-user limit of running turns, counted by the chat's UPDATE of the start (issue 41).

`turn_starts.RunningTurnsLimit` takes the user's lock, then the start's UPDATE of the chat returns the
user's running turns (their drafts) beside its own work, and the check refuses before the INSERT: the
refused start writes nothing (no message, no draft, the chat's title and time as they were). The same for
a regenerate, whose draft is appended after its last answer was removed: that removal is rolled back too.
Concurrency across replicas: tests/test_cluster.py.
"""

from __future__ import annotations

import pytest

from core.chat import rewind
from core.chat import running_turns as running_turns_store
from core.chat import sessions as sessions_store
from core.chat.drafts import draft_fields
from core.chat.errors import TooManyRunningTurnsError
from core.chat.turn_starts import RunningTurnsLimit, TurnStarts
from core.services import Services
from models import Agent, AgentSession
from tests.test_chat_engine import new_chat, saved


async def _agent_of(services: Services, chat: str) -> Agent:
    async with services.db.read() as r:
        row = await r.get(AgentSession, chat)
    assert row is not None
    agent, _tools = await services.chat.agents.get(row.agent_id)
    assert agent is not None
    return agent


async def _running(services: Services, chat: str, agent: Agent) -> None:
    """A turn running in `chat`: its question and its draft."""
    async with services.db.session() as s:
        await sessions_store.add_messages(
            s, session_id=chat, messages=[{"role": "user", "content": "q"}, draft_fields(agent)]
        )


async def test_a_start_over_the_limit_is_refused_by_the_chats_update_and_writes_nothing(services: Services) -> None:
    user = services.auth.local_user_id
    assert user is not None
    chats = [await new_chat(services) for _ in range(3)]
    agent = await _agent_of(services, chats[0])
    for chat in chats[:2]:
        await _running(services, chat, agent)
    starts = TurnStarts(services.db)
    async with services.db.read() as r:
        before = await r.get(AgentSession, chats[2])
    assert before is not None

    with pytest.raises(TooManyRunningTurnsError, match="2 answers"):
        await starts.save(
            rewind.new_message("third"), chats[2], agent, [], limit=RunningTurnsLimit(services.db, user, 2)
        )
    assert await saved(services, chats[2]) == []
    async with services.db.read() as r:
        after = await r.get(AgentSession, chats[2])
    assert after is not None and (after.title, after.updated_at) == (before.title, before.updated_at)

    turn = await starts.save(
        rewind.new_message("third"), chats[2], agent, [], limit=RunningTurnsLimit(services.db, user, 3)
    )
    assert turn.anchor.content == "third" and turn.draft.status == sessions_store.STREAMING
    async with services.db.read() as r:
        assert await running_turns_store.count_running_turns(r, user_id=user) == 3


async def test_a_regenerate_over_the_limit_keeps_the_answer_it_would_have_removed(services: Services) -> None:
    user = services.auth.local_user_id
    assert user is not None
    done, busy = await new_chat(services), await new_chat(services)
    agent = await _agent_of(services, done)
    async with services.db.session() as s:
        await sessions_store.add_messages(
            s,
            session_id=done,
            messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "an answer"}],
        )
    await _running(services, busy, agent)
    history = await saved(services, done)
    starts = TurnStarts(services.db)

    with pytest.raises(TooManyRunningTurnsError):
        await starts.save(rewind.answer_again(), done, agent, history, limit=RunningTurnsLimit(services.db, user, 1))
    assert [(m.role, m.content) for m in await saved(services, done)] == [("user", "q"), ("assistant", "an answer")]

    turn = await starts.save(rewind.answer_again(), done, agent, history, limit=RunningTurnsLimit(services.db, user, 2))
    assert turn.rewound and [m.role for m in await saved(services, done)] == ["user"]  # the draft is not listed
