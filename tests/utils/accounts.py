"""Accounts for tests that start a live server with logins (alice, the first account, is the admin)."""

from __future__ import annotations

from pathlib import Path

from core.auth import accounts
from core.services import Services
from tests.conftest import make_settings
from tests.utils.sync import run_sync

ALICE, BOB = ("alice", "alice-password"), ("bob", "bob-password")


def seed_accounts(tmp_path: Path, database_url: str, pairs: tuple[tuple[str, str], ...] = (ALICE, BOB)) -> None:
    """Migrate the database and create these accounts in order, before the server under test is built."""
    seed = Services.build(make_settings(tmp_path, database_url=database_url))
    seed.db.migrate()

    async def create_users() -> None:
        async with seed.db.session() as s:
            for username, password in pairs:
                await accounts.create_user(s, username=username, password=password)
        await seed.db.close()

    run_sync(create_users())
