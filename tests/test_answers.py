"""The answers of turns that end together are written together (`core/chat/answers.py`, issue 41).

On PostgreSQL `AnswerWriter` writes the one-row answers that come while another is on its way in one
statement (`answer_together`). Each row is the one `answer_in_place` would have written, down to a JSON
column's `null`; an answer whose draft is no longer last drops it and goes after the note, as alone; a batch
that fails is written again one answer at a time; a writer stopped mid-batch leaves no turn waiting. On SQLite
the writer is `save_answer`, one at a time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text

from core.chat import answers
from core.chat import sessions as sessions_store
from core.chat.answers import AnswerWriter, answer_together, save_answer
from core.chat.drafts import draft_fields
from core.services import Services
from models import Agent, AgentSession, utcnow
from tests.test_chat_engine import new_chat, saved
from tests.test_running_turns_count import _agent_of
from tests.utils.statements import recorded_statements

TURNS = 20

#: Answers are written together on PostgreSQL only: these tests run there alone.
on_postgres = pytest.mark.parametrize(
    "database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)

_ANSWER_FIELDS: dict[str, Any] = {
    "role": "assistant",
    "content": "the answer",
    "model_id": "local/demo",
    "input_tokens": 12,
    "output_tokens": 34,
    "cost_usd": 0.00012,
    "tool_calls": [{"id": "c1", "name": "echo", "arguments": {"x": "ü"}}],
    "status": "complete",
    "source": "user",
}


async def _draft(services: Services, chat: str, agent: Agent) -> int:
    """A running turn in `chat`: its question and its draft; the draft's id."""
    async with services.db.session() as s:
        rows = await sessions_store.add_messages(
            s, session_id=chat, messages=[{"role": "user", "content": "q"}, draft_fields(agent)]
        )
    draft_id = rows[-1].id
    assert draft_id is not None
    return draft_id


async def _running_chats(services: Services, count: int) -> tuple[list[str], list[int]]:
    """`count` chats, each with a turn running (its question and its draft); the chats and their drafts."""
    chats = [await new_chat(services) for _ in range(count)]
    agent = await _agent_of(services, chats[0])
    return chats, [await _draft(services, chat, agent) for chat in chats]


async def _answer_each(writer: AnswerWriter, chats: list[str], drafts: list[int]) -> list[Any]:
    """Every chat's answer (`answer <i>`) saved by `writer` at once; what each save returned or raised."""
    return await asyncio.gather(
        *(
            writer.save(chat, draft, [{**_ANSWER_FIELDS, "content": f"answer {i}"}])
            for i, (chat, draft) in enumerate(zip(chats, drafts, strict=True))
        ),
        return_exceptions=True,
    )


async def _row(services: Services, message_id: int) -> dict[str, Any]:
    """A message's columns as PostgreSQL holds them (JSON as its text), but for its id, chat and position."""
    async with services.db.read() as r:
        row = (
            await r.exec(
                text(
                    "SELECT role, content, model_id, input_tokens, output_tokens, cost_usd, tool_calls::text AS calls,"
                    " tool_results::text AS results, attachments::text AS files, tool_calls IS NULL AS no_calls,"
                    " tool_results IS NULL AS no_results, status, error, source, a2a_task_id, caller_agent_id,"
                    " caller_session_id, inject_mode, inject_position, created_at"
                    " FROM agent_messages WHERE id = :id"
                ),
                params={"id": message_id},
            )
        ).one()
    return dict(row._mapping)


async def test_turns_that_end_together_save_their_answers_together(services: Services) -> None:
    """Twenty turns at once: on PostgreSQL fewer answer statements than turns; every chat has its own answer."""
    chats = [await new_chat(services) for _ in range(TURNS)]
    with recorded_statements(services.db) as statements:
        await asyncio.gather(
            *(
                services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text=f"/lorem {5 + i}")
                for i, chat in enumerate(chats)
            )
        )
        for chat in chats:
            await services.chat.wait(chat, timeout=30)
    answer_statements = [statement for _, statement in statements if "UPDATE agent_messages SET role=" in statement]

    for i, chat in enumerate(chats):
        user, answer = await saved(services, chat)
        assert (user.content, user.sort_order) == (f"/lorem {5 + i}", 1)
        assert (answer.role, answer.status, answer.sort_order) == ("assistant", "complete", 2)
        assert len(answer.content.split()) == 5 + i, answer.content
    together = [s for s in answer_statements if "jsonb_to_recordset" in s]
    if services.db.dialect == "postgresql":
        assert together and len(answer_statements) < TURNS / 2, (
            f"{len(answer_statements)} answer statements for {TURNS} turns ({len(together)} together)"
        )
    else:
        assert not together and len(answer_statements) == TURNS


@on_postgres
async def test_an_answer_written_together_is_the_row_written_alone(services: Services) -> None:
    """The same fields, once alone (`answer_in_place`) and once in a batch: the same row, JSON nulls and all."""
    chats, drafts = await _running_chats(services, 3)
    fields = {**_ANSWER_FIELDS, "created_at": utcnow()}

    await save_answer(services.db, chats[0], drafts[0], [fields])
    answered = await answer_together(services.db, [(chats[1], drafts[1], fields), (chats[2], drafts[2], fields)])

    assert answered == {drafts[1], drafts[2]}
    alone = await _row(services, drafts[0])
    assert alone["no_calls"] is False and alone["no_results"] is False and alone["results"] == "null"
    assert await _row(services, drafts[1]) == alone
    assert await _row(services, drafts[2]) == alone
    async with services.db.read() as r:
        bumped = [(await r.get(AgentSession, chat)).updated_at for chat in chats[1:]]  # type: ignore[union-attr]
    assert bumped[0] == bumped[1] and bumped[0] > fields["created_at"]


@on_postgres
async def test_an_answer_whose_draft_is_not_last_goes_after_the_note(services: Services) -> None:
    """In a batch, a chat with a note saved after its draft: the draft dropped, the answer appended after it."""
    chats, drafts = await _running_chats(services, 3)
    async with services.db.session() as s:
        await sessions_store.add_messages(s, session_id=chats[1], messages=[{"role": "system", "content": "a note"}])
    writer = AnswerWriter(services.db)

    assert await _answer_each(writer, chats, drafts) == [None, None, None]

    assert writer.batches == 1
    for i, chat in enumerate(chats):
        rows = await saved(services, chat)
        if i == 1:
            assert [(m.role, m.content) for m in rows] == [
                ("user", "q"),
                ("system", "a note"),
                ("assistant", "answer 1"),
            ]
            assert drafts[1] not in {m.id for m in rows}
        else:
            assert [(m.id, m.role, m.content, m.status) for m in rows[1:]] == [
                (drafts[i], "assistant", f"answer {i}", "complete")
            ]


@on_postgres
async def test_a_batch_that_fails_is_written_one_answer_at_a_time(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    chats, drafts = await _running_chats(services, 3)
    tried: list[int] = []

    async def fails(db: Any, batch: list[Any]) -> set[int]:
        tried.append(len(batch))
        raise RuntimeError("the batch's statement failed")

    monkeypatch.setattr(answers, "answer_together", fails)
    writer = AnswerWriter(services.db)
    assert await _answer_each(writer, chats, drafts) == [None, None, None]

    assert tried == [3] and writer.batches == 0
    for i, chat in enumerate(chats):
        assert [(m.id, m.content, m.status) for m in (await saved(services, chat))[1:]] == [
            (drafts[i], f"answer {i}", "complete")
        ]


@on_postgres
async def test_two_answers_of_one_chat_go_in_separate_batches(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One turn at a time never gives this; if it came, the second answer of a chat waits for the next batch."""
    chats, [first, other] = await _running_chats(services, 2)
    writer = AnswerWriter(services.db)
    written: list[list[tuple[str, int, dict[str, Any]]]] = []
    real = answers.answer_together

    async def recording(db: Any, batch: list[tuple[str, int, dict[str, Any]]]) -> set[int]:
        written.append(batch)
        return await real(db, batch)

    monkeypatch.setattr(answers, "answer_together", recording)
    await asyncio.gather(
        writer.save(chats[0], first, [{**_ANSWER_FIELDS, "content": "first"}]),
        writer.save(chats[1], other, [{**_ANSWER_FIELDS, "content": "other"}]),
        writer.save(chats[0], first, [{**_ANSWER_FIELDS, "content": "again"}]),
    )
    assert [[chat for chat, _, _ in batch] for batch in written] == [[chats[0], chats[1]]]
    rows = await saved(services, chats[0])
    # The second answer of the chat found its draft answered already, so it was appended after it.
    assert [(m.content, m.status) for m in rows[1:]] == [("first", "complete"), ("again", "complete")]


@on_postgres
async def test_a_writer_stopped_mid_batch_leaves_no_turn_waiting(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stops while a batch is on its way: every turn waiting for its answer is told, none hangs."""
    chats, drafts = await _running_chats(services, 3)
    on_its_way = asyncio.Event()

    async def hangs(db: Any, batch: list[Any]) -> set[int]:
        on_its_way.set()
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    monkeypatch.setattr(answers, "answer_together", hangs)
    writer = AnswerWriter(services.db)
    saves = asyncio.ensure_future(_answer_each(writer, chats, drafts))
    await asyncio.wait_for(on_its_way.wait(), 5)
    assert writer._writer is not None
    writer._writer.cancel()

    results = await asyncio.wait_for(saves, 5)
    assert [str(r) for r in results] == ["the server stopped before this answer was saved"] * 3
