"""The chat engine with the offline demo model, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import event
from sqlmodel import select

from core.broker.inject import RESULT_POSITION
from core.chat import agents as agents_store
from core.chat import sessions as sessions_store
from core.chat.engine import InvalidMessageError, SessionNotFoundError, TurnInProgressError
from core.chat.llm import litellm_module
from core.services import Services
from core.settings import Settings
from models import A2ATaskSession, AgentMessage, User
from tests.conftest import make_settings


async def new_chat(services: Services, slug: str = "coding-assistant") -> str:
    async with services.db.session() as s:
        agent = await agents_store.get_agent_by_slug(s, slug)
        chat = await sessions_store.create_session(s, user_id=services.auth.local_user_id, agent_id=agent.id)
    return chat.id


async def run_turn(services: Services, session_id: str, text: str) -> list:
    turn = await services.chat.start_turn(session_id=session_id, user_id=services.auth.local_user_id, text=text)
    events = [e async for e in services.hub.subscribe(turn.stream_key, after=turn.after_event_id)]
    await services.chat.wait(session_id, timeout=5)
    return events


async def saved(services: Services, session_id: str):
    async with services.db.session() as s:
        return await sessions_store.list_messages(s, session_id=session_id)


async def test_a_turn_streams_ui_events_and_saves_both_messages(services: Services) -> None:
    chat = await new_chat(services)
    events = await run_turn(services, chat, "hello there")
    types = [e.type for e in events]
    assert types[0] == "start" and types[-1] == "finish"
    deltas = [e.data["delta"] for e in events if e.type == "text-delta"]
    assert len(deltas) > 10  # token by token, not one blob
    assert events[-1].data["finishReason"] == "stop"
    assert events[-1].data["usage"]["outputTokens"] == len(deltas)

    user, assistant = await saved(services, chat)
    assert (user.role, user.content, user.source, user.sort_order) == ("user", "hello there", "user", 1)
    assert assistant.role == "assistant" and assistant.sort_order == 2
    assert assistant.content == "".join(deltas)
    assert "hello there" in assistant.content and "```python" in assistant.content  # coding agent shows code
    assert assistant.model_id == "local/demo"
    assert assistant.input_tokens > 0 and assistant.output_tokens == len(deltas)
    assert assistant.status == "complete"


async def test_the_next_turn_sees_the_history(services: Services) -> None:
    chat = await new_chat(services)
    first = await run_turn(services, chat, "one two three")
    second = await run_turn(services, chat, "four")
    # The demo model counts prompt words: the second prompt holds the first exchange too.
    assert second[-1].data["usage"]["inputTokens"] > first[-1].data["usage"]["inputTokens"] + 10
    assert [m.sort_order for m in await saved(services, chat)] == [1, 2, 3, 4]


async def test_session_title_comes_from_the_first_message(services: Services) -> None:
    chat = await new_chat(services)
    await run_turn(services, chat, "Plan   a trip\nto the sea " + "x" * 100)
    async with services.db.session() as s:
        row = await sessions_store.get_session(s, chat)
    assert row.title.startswith("Plan a trip to the sea") and row.title.endswith("…") and len(row.title) <= 60


async def test_appending_an_answer_bumps_the_session_time_without_reading_the_session(services: Services) -> None:
    chat = await new_chat(services)
    async with services.db.session() as s:
        before = (await sessions_store.get_session(s, chat)).updated_at
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        statements.append(" ".join(statement.split()))

    event.listen(services.db.engine.sync_engine, "before_cursor_execute", record)
    try:
        async with services.db.session() as s:
            [row] = await sessions_store.append_messages(
                s, session_id=chat, messages=[{"role": "assistant", "content": "hello"}]
            )
            await s.commit()
    finally:
        event.remove(services.db.engine.sync_engine, "before_cursor_execute", record)
    # PostgreSQL's row lock before an append is not a read of the row.
    assert [s for s in statements if s.startswith("SELECT agent_sessions.") and not s.endswith("FOR UPDATE")] == []
    async with services.db.session() as s:
        after = await sessions_store.get_session(s, chat)
    assert after.updated_at > before and after.title == "New chat"
    assert (
        [(m.sort_order, m.content) for m in await saved(services, chat)]
        == [(row.sort_order, "hello")]
        == [(1, "hello")]
    )


async def test_a_model_failure_keeps_the_partial_answer_and_the_question(services: Services) -> None:
    chat = await new_chat(services)
    events = await run_turn(services, chat, "/error")
    assert [e.type for e in events][-2:] == ["error", "finish"]
    assert "demo model failed" in events[-2].data["errorText"]
    assert events[-1].data["finishReason"] == "error"
    user, assistant = await saved(services, chat)
    assert user.content == "/error"
    assert assistant.status == "error" and assistant.content == "This reply will fail"
    assert "demo model failed" in assistant.error
    assert services.hub.get(chat).error


async def test_stop_cancels_the_turn_and_saves_what_was_said(tmp_path, database_url: str) -> None:
    services = Services.build(make_settings(tmp_path, database_url=database_url, demo_model_delay_ms=5))
    services.prepare()
    try:
        chat = await new_chat(services)
        turn = await services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text="/lorem 2000")
        events = []
        async for event in services.hub.subscribe(turn.stream_key, after=turn.after_event_id):
            events.append(event)
            if len(events) == 20:
                assert await services.chat.cancel(chat) is True
        assert events[-1].type == "finish" and events[-1].data["finishReason"] == "canceled"
        assert not services.chat.is_running(chat)
        _, assistant = await saved(services, chat)
        streamed = "".join(e.data["delta"] for e in events if e.type == "text-delta")
        assert assistant.status == "canceled" and assistant.content == streamed
        assert 10 < len(streamed.split()) < 2000
        assert await services.chat.cancel(chat) is False  # nothing left to stop
    finally:
        await services.stop()


async def test_a_turn_runs_to_the_end_with_nobody_watching(services: Services) -> None:
    chat = await new_chat(services)
    await services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text="/lorem 300")
    await services.chat.wait(chat, timeout=10)
    _, assistant = await saved(services, chat)
    assert len(assistant.content.split()) == 300


async def test_one_turn_at_a_time_per_session(tmp_path, database_url: str) -> None:
    services = Services.build(make_settings(tmp_path, database_url=database_url, demo_model_delay_ms=20))
    services.prepare()
    try:
        chat = await new_chat(services)
        await services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text="/lorem 50")
        with pytest.raises(TurnInProgressError):
            await services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text="again")
        await services.chat.cancel(chat)
        assert [m.content for m in await saved(services, chat) if m.role == "user"] == ["/lorem 50"]
    finally:
        await services.stop()


async def test_simultaneous_starts_claim_the_turn_before_saving_anything(services: Services) -> None:
    chat = await new_chat(services)
    results = await asyncio.gather(
        *(
            services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text=f"message {i}")
            for i in range(10)
        ),
        return_exceptions=True,
    )
    started = [r for r in results if not isinstance(r, BaseException)]
    assert len(started) == 1 and all(isinstance(r, TurnInProgressError) for r in results if r not in started)
    await services.chat.wait(chat, timeout=10)
    user, _ = await saved(services, chat)
    assert user.id == started[0].user_message_id
    assert [m.role for m in await saved(services, chat)] == ["user", "assistant"]


async def test_a_refused_start_gives_the_turn_back(services: Services) -> None:
    with pytest.raises(SessionNotFoundError):
        await services.chat.start_turn(session_id="as_unknown", user_id=services.auth.local_user_id, text="hi")
    assert not services.chat.is_running("as_unknown")
    chat = await new_chat(services)
    await run_turn(services, chat, "hello")  # the claim of the ended turn is gone too
    assert not services.chat.is_running(chat)
    await run_turn(services, chat, "again")
    assert [m.role for m in await saved(services, chat)] == ["user", "assistant"] * 2


@pytest.mark.parametrize("text", ["", "   \n "])
async def test_empty_messages_are_refused(services: Services, text: str) -> None:
    chat = await new_chat(services)
    with pytest.raises(InvalidMessageError, match="empty"):
        await services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text=text)
    assert await saved(services, chat) == []


async def test_over_long_messages_are_refused_with_the_limit(services: Services) -> None:
    chat = await new_chat(services)
    limit = services.settings.max_message_chars
    with pytest.raises(InvalidMessageError, match=f"{limit:,}"):
        await services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text="x" * (limit + 1))


async def test_a_session_of_someone_else_is_not_found(services: Services) -> None:
    chat = await new_chat(services)
    async with services.db.session() as s:
        other = User(username="mallory", password_hash=None)
        s.add(other)
        await s.commit()
        await s.refresh(other)
    with pytest.raises(SessionNotFoundError):
        await services.chat.start_turn(session_id=chat, user_id=other.id, text="hi")
    with pytest.raises(SessionNotFoundError):
        await services.chat.start_turn(session_id="as_unknown", user_id=services.auth.local_user_id, text="hi")


async def test_turn_timeout_fails_the_turn_with_a_reason(tmp_path, database_url: str) -> None:
    settings: Settings = make_settings(tmp_path, database_url=database_url, demo_model_delay_ms=20, turn_timeout_s=0.3)
    services = Services.build(settings)
    services.prepare()
    try:
        chat = await new_chat(services)
        events = await run_turn(services, chat, "/lorem 500")
        assert events[-2].type == "error" and "longer than 0.3 s" in events[-2].data["errorText"]
        _, assistant = await saved(services, chat)
        assert assistant.status == "error" and assistant.content
    finally:
        await services.stop()


async def test_shutdown_saves_running_turns(tmp_path, database_url: str) -> None:
    services = Services.build(make_settings(tmp_path, database_url=database_url, demo_model_delay_ms=10))
    services.prepare()
    chat = await new_chat(services)
    await services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text="/lorem 1000")
    await asyncio.sleep(0.3)
    await services.chat.shutdown()
    async with services.db.session() as s:
        messages = await sessions_store.list_messages(s, session_id=chat)
    await services.stop()
    assert messages[-1].status == "canceled" and messages[-1].content


async def drafts_of(services: Services, session_id: str) -> list[AgentMessage]:
    """The session's rows still `streaming` (which `list_messages` leaves out)."""
    async with services.db.session() as s:
        query = select(AgentMessage).where(
            AgentMessage.session_id == session_id, AgentMessage.status == sessions_store.STREAMING
        )
        return list((await s.exec(query)).all())


async def test_a_running_turn_saves_its_text_about_once_a_second_not_per_chunk(
    tmp_path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    litellm_module()  # imported once per process (seconds): not inside the measured stream
    services = Services.build(make_settings(tmp_path, database_url=database_url, demo_model_delay_ms=20))
    services.prepare()
    writes: list[tuple[float, str]] = []
    save_drafts = sessions_store.save_drafts

    async def counted(session, drafts: dict[int, str]) -> None:
        writes.extend((time.monotonic(), content) for content in drafts.values())
        await save_drafts(session, drafts)

    monkeypatch.setattr(sessions_store, "save_drafts", counted)
    try:
        chat = await new_chat(services)
        started = time.monotonic()
        turn = await services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text="/lorem 3000")
        [draft] = await drafts_of(services, chat)  # saved with the question, empty until the first flush
        assert draft.role == "assistant" and draft.content == "" and draft.model_id == "local/demo"
        streamed, canceled, first_delta = [], False, None
        async for event in services.hub.subscribe(turn.stream_key, after=turn.after_event_id):
            if event.type == "text-delta":
                streamed.append(event.data["delta"])
                first_delta = first_delta or time.monotonic()
            if not canceled and first_delta and time.monotonic() - first_delta > 3.2:  # ~3 s of streaming
                canceled = True
                [draft] = await drafts_of(services, chat)
                assert draft.content and "".join(streamed).startswith(draft.content)
                # While it runs, the answer is followed live from the hub: only the question is listed.
                assert [m.role for m in await saved(services, chat)] == ["user"]
                assert await services.chat.cancel(chat)
        assert len(streamed) > 100
        assert 2 <= len(writes) <= 4, [round(t - started, 2) for t, _ in writes]
        assert all(b - a >= 0.95 for (a, _), (b, _) in zip(writes, writes[1:], strict=False))
        assert writes[0][0] - started >= 0.95
        assert all(len(a) < len(b) for (_, a), (_, b) in zip(writes, writes[1:], strict=False))
        # The end replaces the draft with the answer, as before drafts.
        assert await drafts_of(services, chat) == []
        user, answer = await saved(services, chat)
        assert (answer.status, answer.sort_order, answer.content) == ("canceled", 2, "".join(streamed))
    finally:
        await services.stop()


async def test_the_drafts_of_turns_running_together_are_written_together(
    tmp_path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight turns streaming at once: their drafts go in shared transactions, each still about once a second."""
    litellm_module()
    services = Services.build(make_settings(tmp_path, database_url=database_url, demo_model_delay_ms=20))
    services.prepare()
    batches: list[dict[int, str]] = []
    statements: list[list[str]] = []  # of each batch
    save_drafts = sessions_store.save_drafts

    async def counted(session, drafts: dict[int, str]) -> None:
        batches.append(dict(drafts))
        statements.append([])

        def record(conn, cursor, statement: str, *args) -> None:
            statements[-1].append(statement.split()[0])

        event.listen(services.db.engine.sync_engine, "before_cursor_execute", record)
        try:
            await save_drafts(session, drafts)
        finally:
            event.remove(services.db.engine.sync_engine, "before_cursor_execute", record)

    monkeypatch.setattr(sessions_store, "save_drafts", counted)
    try:
        chats = [await new_chat(services) for _ in range(8)]
        for chat in chats:
            await services.chat.start_turn(session_id=chat, user_id=services.auth.local_user_id, text="/lorem 3000")
        await asyncio.sleep(2.6)
        drafts = {chat: (await drafts_of(services, chat))[0] for chat in chats}
        for chat in chats:
            await services.chat.cancel(chat)
    finally:
        await services.stop()

    written = sum(len(batch) for batch in batches)
    assert all(draft.content for draft in drafts.values())  # every turn's text so far is saved
    assert 8 <= written <= 8 * 3  # about once a second each
    assert len(batches) < written / 2, [sorted(b) for b in batches]  # not one transaction per draft
    assert {draft.id for draft in drafts.values()} == {i for batch in batches for i in batch}
    # However many drafts a batch holds, one UPDATE writes them (run for each, in one trip to the database).
    assert all(kinds == ["UPDATE"] for kinds in statements), statements


async def test_a_draft_left_by_a_crash_is_kept_as_interrupted_at_the_next_start(tmp_path, database_url: str) -> None:
    settings = make_settings(tmp_path, database_url=database_url)
    crashed = Services.build(settings)
    crashed.prepare()
    chat = await new_chat(crashed)
    async with crashed.db.session() as s:  # what a kill -9 leaves: the question and the draft saved so far
        await sessions_store.add_messages(
            s,
            session_id=chat,
            messages=[
                {"role": "user", "content": "/lorem 3000"},
                {"role": "assistant", "content": "lorem ipsum dolor", "status": sessions_store.STREAMING},
            ],
        )
    await crashed.db.close()

    restarted = Services.build(settings)
    restarted.prepare()
    try:
        user, answer = await saved(restarted, chat)
        assert (answer.role, answer.status, answer.content) == ("assistant", "interrupted", "lorem ipsum dolor")
        assert "interrupted by a server restart" in answer.error.lower()
        assert await drafts_of(restarted, chat) == []
        # The chat goes on: the next turn sees what was said and is saved after it.
        await run_turn(restarted, chat, "go on")
        assert [m.status for m in await saved(restarted, chat)] == ["complete", "interrupted", "complete", "complete"]
    finally:
        await restarted.stop()


async def test_list_sessions_hides_delegated_task_sessions(services: Services) -> None:
    visible = await new_chat(services)
    hidden = await new_chat(services, "coding-assistant")
    shown_task = await new_chat(services, "coding-assistant")
    async with services.db.session() as s:
        s.add(A2ATaskSession(session_id=hidden, callee_agent_slug="coding-assistant", state="completed"))
        s.add(
            A2ATaskSession(
                session_id=shown_task, callee_agent_slug="coding-assistant", state="completed", visible_in_sidebar=1
            )
        )
        await s.commit()
        listed = [row.id for row in await sessions_store.list_sessions(s, user_id=services.auth.local_user_id)]
    assert hidden not in listed
    assert set(listed) == {visible, shown_task}


async def test_list_sessions_is_newest_first_and_per_user(services: Services) -> None:
    first = await new_chat(services)
    second = await new_chat(services)
    await run_turn(services, first, "bump")  # activity moves a session to the top
    async with services.db.session() as s:
        listed = [r.id for r in await sessions_store.list_sessions(s, user_id=services.auth.local_user_id)]
        assert await sessions_store.list_sessions(s, user_id=services.auth.local_user_id + 1000) == []
    assert listed == [first, second]


def test_tool_families_expand_per_agent_and_never_replace_plain_tools() -> None:
    from dataclasses import dataclass

    from core.chat.tools import ToolRegistry

    @dataclass
    class Named:
        name: str
        tool_type: str = "plain"
        description: str = ""
        parameters: dict | None = None

        async def execute(self, arguments, config, ctx):  # pragma: no cover - not called
            raise AssertionError

    class Family:
        tool_type = "family"

        def tools_for(self, agent_id, agent_slug):
            return [Named("plain_tool", "family"), Named(f"for_{agent_slug}", "family")]

    registry = ToolRegistry()
    registry.register(Named("plain_tool"))
    registry.register_family(Family())
    with pytest.raises(ValueError, match="already registered"):
        registry.register_family(Family())
    rows = [("family", {"k": 1}), ("plain", {}), ("unknown", {})]
    bound = registry.bind(rows, agent_id=7, agent_slug="alice")
    assert set(bound) == {"plain_tool", "for_alice"}
    assert bound["plain_tool"].tool.tool_type == "plain" and bound["for_alice"].config == {"k": 1}
    assert set(registry.bind(rows, agent_id=8, agent_slug="bob")) == {"plain_tool", "for_bob"}
    assert registry.types() == ["family", "plain"]


async def test_an_announcement_is_a_turn_about_the_notes_the_history_ends_with(services: Services) -> None:
    chat = await new_chat(services, "general-assistant")
    await run_turn(services, chat, "hello")
    watched = []
    unwatch = services.chat.watch(chat, watched.append)
    [note] = await services.chat.save_notes(
        chat, [{"content": "[Weather] Sunny, 22 °C.", "inject_mode": "auto", "a2a_task_id": "t1"}]
    )
    assert (note.role, note.source, note.inject_mode) == ("system", "user", "auto")
    turn = await services.chat.start_announcement(chat)
    with pytest.raises(TurnInProgressError):
        await services.chat.start_announcement(chat)
    events = [e async for e in services.hub.subscribe(turn.stream_key, after=turn.after_event_id)]
    await services.chat.wait(chat, timeout=5)
    text = "".join(e.data["delta"] for e in events if e.type == "text-delta")
    assert text == "Result from **Weather**:\n\n> Sunny, 22 °C."
    assert turn.user_message_id == note.id
    assert [(c.messages, c.turn) for c in watched] == [([note], None), ([], turn)]
    unwatch()
    rows = await saved(services, chat)
    assert [r.role for r in rows] == ["user", "assistant", "system", "assistant"]
    assert rows[-1].content == text
    with pytest.raises(SessionNotFoundError):
        await services.chat.save_notes("as_missing", [{"content": "x", "inject_mode": "delay"}])


async def test_notes_are_saved_past_the_sessions_position_in_their_task_only(services: Services) -> None:
    """The chat inbox's position in a task is its notes' positions: a note read twice is saved once."""
    chat = await new_chat(services, "general-assistant")
    watched = []
    unwatch = services.chat.watch(chat, watched.append)

    def note(task: str, position: int, text: str, mode: str = "delay") -> dict:
        return {"content": text, "inject_mode": mode, "a2a_task_id": task, "inject_position": position}

    first = await services.chat.save_notes(chat, [note("t1", 2, "step 2"), note("t2", 1, "other task")])
    assert [n.content for n in first] == ["step 2", "other task"]
    again = await services.chat.save_notes(
        chat, [note("t1", 2, "step 2, read again"), note("t1", 1, "an older step"), note("t1", 5, "step 5")]
    )
    assert [n.content for n in again] == ["step 5"]  # the same and older positions are behind the session's
    assert await services.chat.save_notes(chat, [note("t1", 5, "step 5")]) == []
    result = note("t1", RESULT_POSITION, "done", "auto")
    assert [n.content for n in await services.chat.save_notes(chat, [result, note("t1", 6, "late step")])] == ["done"]
    assert await services.chat.save_notes(chat, [note("t1", RESULT_POSITION, "done, sent twice", "auto")]) == []
    unwatch()
    assert [len(c.messages) for c in watched] == [2, 1, 1]  # pages hear of what is saved, never of nothing
    rows = await saved(services, chat)
    assert [(r.a2a_task_id, r.inject_position) for r in rows] == [
        ("t1", 2),
        ("t2", 1),
        ("t1", 5),
        ("t1", RESULT_POSITION),
    ]
