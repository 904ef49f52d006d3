"""Migrations on a real SQLite file and a real PostgreSQL database (each made fresh)."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlmodel import SQLModel

import models  # noqa: F401
from core.db import Database, alembic_config, sync_url
from tests.conftest import create_postgres_database, drop_postgres_database, unavailable


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fresh_database(request: pytest.FixtureRequest, tmp_path: Path, postgres_server_url: str):
    """An empty database nobody else uses."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh' / 'app.db'}"
        return
    try:
        url = create_postgres_database(postgres_server_url, prefix="a2a_migr")
    except ConnectionError as exc:
        unavailable(str(exc))
    try:
        yield url
    finally:
        drop_postgres_database(postgres_server_url, url)


def test_upgrade_creates_the_seed_000_schema(fresh_database: str) -> None:
    Database(fresh_database).migrate()
    engine = create_engine(sync_url(fresh_database))
    try:
        schema = inspect(engine)
        assert {"users", "agents", "agent_tools", "agent_sessions", "agent_messages", "a2a_task_sessions"} <= set(
            schema.get_table_names()
        )
        message_columns = {c["name"]: c for c in schema.get_columns("agent_messages")}
        for name in (
            "source",
            "a2a_task_id",
            "caller_agent_id",
            "caller_session_id",
            "model_id",
            "input_tokens",
            "output_tokens",
            "sort_order",
            "tool_calls",
            "tool_results",
        ):
            assert name in message_columns
        assert "user" in str(message_columns["source"]["default"])
        assert "idx_agent_messages_source" in {i["name"] for i in schema.get_indexes("agent_messages")}
        caller_fk = next(
            fk for fk in schema.get_foreign_keys("agent_messages") if fk["constrained_columns"] == ["caller_agent_id"]
        )
        assert caller_fk["referred_table"] == "agents"
        assert caller_fk["options"].get("ondelete", "").upper() == "SET NULL"
        task_columns = {c["name"]: c for c in schema.get_columns("a2a_task_sessions")}
        assert "0" in str(task_columns["visible_in_sidebar"]["default"])
        assert task_columns["visible_in_sidebar"]["nullable"] is False
    finally:
        engine.dispose()


def test_schema_matches_the_models_and_downgrade_round_trips(fresh_database: str) -> None:
    db = Database(fresh_database)
    db.migrate()
    db.migrate()  # running again on an up-to-date database is a no-op
    engine = create_engine(sync_url(fresh_database))
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), SQLModel.metadata)
        assert diff == [], f"models and migrations disagree: {diff}"
        command.downgrade(alembic_config(fresh_database), "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        command.upgrade(alembic_config(fresh_database), "head")
        assert "agent_messages" in inspect(engine).get_table_names()
    finally:
        engine.dispose()


async def test_sqlite_runs_in_wal_mode_with_foreign_keys(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'wal' / 'app.db'}"
    db = Database(url)
    db.migrate()
    assert (tmp_path / "wal" / "app.db").is_file()
    try:
        async with db.engine.connect() as conn:
            assert (await conn.execute(text("PRAGMA journal_mode"))).scalar().lower() == "wal"
            assert (await conn.execute(text("PRAGMA foreign_keys"))).scalar() == 1
    finally:
        await db.close()


async def test_a_nested_sqlite_session_fails_loudly_instead_of_waiting_forever(tmp_path) -> None:
    from core.db import Database

    db = Database(f"sqlite:///{tmp_path / 'app.db'}")
    db.migrate()
    try:
        async with db.session():
            with pytest.raises(RuntimeError, match="inside another one"):
                async with db.session():
                    pass
        async with db.session():  # the turn was released
            pass
    finally:
        await db.close()


def test_an_existing_general_assistant_gets_the_dispatch_tool(fresh_database: str) -> None:
    """Migration 0004 gives a general assistant made before it the `a2a-dispatch` tool that new installs seed."""
    if fresh_database.startswith("sqlite:///"):
        Path(fresh_database.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(sync_url(fresh_database))
    try:
        command.upgrade(alembic_config(fresh_database), "0003")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO agents (slug, name, description, system_prompt, model, created_at, "
                    "updated_at) VALUES ('general-assistant', 'General', '', '', 'local/demo', "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
        command.upgrade(alembic_config(fresh_database), "head")
        with engine.connect() as conn:
            tools = (
                conn.execute(
                    text(
                        "SELECT t.tool_type FROM agent_tools t JOIN agents a ON a.id = t.agent_id "
                        "WHERE a.slug = 'general-assistant'"
                    )
                )
                .scalars()
                .all()
            )
        assert tools == ["a2a-dispatch"]
        command.downgrade(alembic_config(fresh_database), "0003")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM agent_tools")).scalar() == 0
            assert "inject_mode" not in {c["name"] for c in inspect(conn).get_columns("agent_messages")}
    finally:
        engine.dispose()
