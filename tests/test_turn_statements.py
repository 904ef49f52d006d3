"""Database statements of a chat turn on the real model path (issue 38, item 3): none per token.

A statement counter (SQLAlchemy's `before_cursor_execute` on the app's engine) over whole turns
through LiteLLM to the scripted OpenAI-compatible server, on SQLite and PostgreSQL: a 200-token
turn runs exactly the statements of a 5-token one (the text is written at the start, by the
draft saver about once a second, and at the end; never per token), and the answer takes its
draft's place at the end (`answers.answer_in_place`, on PostgreSQL one statement of its own).
The whole start over the API (a send, its stream, its end; issue 41): tests/test_turn_start_api.py.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from core.services import Services
from tests.test_chat_engine_openai import (  # noqa: F401  (the fixtures)
    Chat,
    _litellm_imported,
    chat,
    echo_tool,
    run_turn,
    saved_messages,
    settings,
)
from tests.utils.openai_server import OpenAIServer, openai_server, text  # noqa: F401


async def _statements_of_a_turn(
    services: Services, chat: Chat, server: OpenAIServer, words: int, *, units: list[list[str]] | None = None
) -> list[str]:
    """The statements of one turn; `units` gets them again, grouped by unit of work (connection checked out)."""
    server.script(text(*[f" w{i}" for i in range(words)]))
    statements: list[str] = []
    by_connection: dict[int, list[str]] = {}

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        short = " ".join(statement.split())[:60]
        if services.db.dialect == "postgresql" and conn.connection.driver_connection.autocommit:
            short = "(autocommit) " + short  # its own transaction: no BEGIN and COMMIT round trips
        statements.append(short)
        by_connection.setdefault(id(conn), []).append(short)

    engine = services.db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        events = await run_turn(services, chat, f"say {words} words")
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert sum(1 for e in events if e.type == "text-delta") == words
    assert events[-1].type == "finish"
    if units is not None:
        units.extend(by_connection.values())
    return statements


async def test_a_200_token_turn_runs_the_statements_of_a_5_token_one(
    services: Services,
    chat: Chat,  # noqa: F811
    openai_server: OpenAIServer,  # noqa: F811
) -> None:
    await _statements_of_a_turn(services, chat, openai_server, 3)  # warm: the first turn's one-off reads
    short = await _statements_of_a_turn(services, chat, openai_server, 5)
    long = await _statements_of_a_turn(services, chat, openai_server, 200)

    assert len(long) == len(short), (short, long)
    assert sorted(long) == sorted(short)
    # The start (the chat and its history, the user's message and the draft; the agent and its tools are kept
    # by `AgentCache` since the first turn) and the end (the answer written over the draft, the chat's time):
    # 8 on SQLite, 5 on PostgreSQL, where the end is one statement (10 on both before issue 41, 12-13 before
    # issue 38).
    assert len(long) == (5 if services.db.dialect == "postgresql" else 8), long
    assert sum(1 for st in long if "DELETE" in st) == 0  # the answer took the draft's place
    if services.db.dialect == "postgresql":
        # The reads and the end run in autocommit; only the start's unit (UPDATE, INSERT) has a BEGIN and a COMMIT.
        assert [st.split(" ")[:2] for st in long] == [
            ["(autocommit)", "SELECT"],  # the chat
            ["(autocommit)", "SELECT"],  # its history
            ["UPDATE", "agent_sessions"],
            ["INSERT", "INTO"],
            ["(autocommit)", "WITH"],  # the answer over its draft, and the chat's time
        ], long
    messages = await saved_messages(services, chat)
    assert messages[-1].content == "".join(f" w{i}" for i in range(200))


async def test_a_turn_start_holds_the_writer_for_its_writes_only(
    services: Services,
    chat: Chat,  # noqa: F811
    openai_server: OpenAIServer,  # noqa: F811
) -> None:
    # On SQLite the units of work take turns, and under load each statement waits for the busy event loop
    # (2-10 ms at 100 sends at once): the start reads its chat, agent, history and tools in read-only units
    # (which never wait for the writer), so the writer is held for the highest position, the two rows and
    # the chat's time and title (one UPDATE, no read first): 4 statements, 8 before (docs/ARCHITECTURE.md,
    # "The path of a chat turn"). On PostgreSQL the UPDATE of the chat comes first and locks its row, and the
    # INSERT numbers both rows after the highest position itself: 2 statements (4 before issue 41).
    # The end's unit writes the answer over its draft and the chat's time.
    await _statements_of_a_turn(services, chat, openai_server, 3)  # warm
    units: list[list[str]] = []
    await _statements_of_a_turn(services, chat, openai_server, 5, units=units)
    [start] = [unit for unit in units if any(st.startswith("INSERT") for st in unit)]
    kinds = [st.split(" ")[0] + " " + st.split(" ")[2 if st.startswith("INSERT") else 1] for st in start]
    if services.db.dialect == "postgresql":
        assert kinds == [
            "UPDATE agent_sessions",  # the chat's time and title; its row locked till the commit
            "INSERT agent_messages",  # both rows in one INSERT, after the highest position it reads
        ], start
    else:  # the starts that come together are written together (core/chat/turn_starts.py): the same for any number
        assert kinds == [
            "SELECT agent_messages.session_id,",  # the highest position of each chat
            "INSERT agent_messages",
            "INSERT agent_messages",
            "UPDATE agent_sessions",  # run for each chat
        ], start
