"""API keys for A2A callers (`core/a2a/api_keys.py`) and migration 0003, on a real database."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect, text

from core.a2a import api_keys
from core.auth import accounts
from core.db import alembic_config, sync_url
from core.services import Services
from models import ApiKey


async def test_keys_are_stored_hashed_and_act_only_for_their_user(services: Services) -> None:
    async with services.db.session() as s:
        alice = await accounts.create_user(s, username="alice", password="alice-password")
        bob = await accounts.create_user(s, username="bob", password="bob-password")
        row, key = await api_keys.create_key(s, user_id=alice.id, name="  ci bot ")
        assert (row.name, row.prefix) == ("ci bot", key[: api_keys.SHOWN_PREFIX_CHARS])
        stored = await s.get(ApiKey, row.id)
        assert key not in {stored.key_hash, stored.prefix} and stored.key_hash == api_keys.hash_key(key)

        found = await api_keys.authenticate_key(s, key)
        assert found is not None and found.user_id == alice.id and found.last_used_at is not None
        assert await api_keys.authenticate_key(s, key + "x") is None
        assert await api_keys.authenticate_key(s, "Bearer " + key) is None

        assert [k.id for k in await api_keys.list_keys(s, user_id=alice.id)] == [row.id]
        assert await api_keys.list_keys(s, user_id=bob.id) == []
        assert await api_keys.revoke_key(s, user_id=bob.id, key_id=row.id) is False  # not bob's key
        assert await api_keys.authenticate_key(s, key) is not None
        assert await api_keys.revoke_key(s, user_id=alice.id, key_id=row.id) is True
        assert await api_keys.revoke_key(s, user_id=alice.id, key_id=row.id) is False  # already revoked
        assert await api_keys.authenticate_key(s, key) is None


async def test_a_key_needs_a_name(services: Services) -> None:
    async with services.db.session() as s:
        for name in ("", "   ", "x" * (api_keys.MAX_NAME_CHARS + 1)):
            with pytest.raises(api_keys.ApiKeyError):
                await api_keys.create_key(s, user_id=services.auth.local_user_id, name=name)


def test_migration_0003_adds_its_tables_to_a_0002_database_and_downgrades(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm' / 'app.db'}"
    (tmp_path / "m").mkdir()
    command.upgrade(alembic_config(url), "0002")
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO users (username, created_at) VALUES ('old', '2026-01-01 00:00:00')"))
        command.upgrade(alembic_config(url), "head")
        schema = inspect(engine)
        assert {"api_keys", "a2a_remote_agents"} <= set(schema.get_table_names())
        assert any(c["column_names"] == ["key_hash"] for c in schema.get_unique_constraints("api_keys"))
        with engine.connect() as conn:
            assert conn.execute(text("SELECT username FROM users")).scalars().all() == ["old"]
        command.downgrade(alembic_config(url), "0002")
        assert not {"api_keys", "a2a_remote_agents"} & set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
