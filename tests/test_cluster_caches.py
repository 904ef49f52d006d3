"""What each replica keeps in memory of the accounts, the model connection and the agents is the same on every replica.

The pages read who is disabled and who is an admin from memory (`AuthState`), the API the accounts' rows it
keeps there (issue 38), and every model call reads
the model connection in force from the gateway: a change made on one replica (the admin area, or
`python app.py users` on the command line) reaches the others as a registry notice over PostgreSQL
(`core/db_events.py`, `AdminArea.follow`), and each reads the state again. Two app instances share one
PostgreSQL database here, each listening as a replica does.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from core.auth import accounts
from core.chat import agents
from core.cli import users_command
from core.db import Database
from core.db_events import RegistryEvents
from core.delegation.agent_admin import LOCAL_AGENT
from core.services import Services
from models import User
from tests.conftest import make_settings

pytestmark = pytest.mark.postgres

SECRET_KEY = "test-secret-key-the-same-on-every-replica"


async def _eventually(check: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


@pytest.fixture
async def two_replicas(tmp_path: Path, postgres_url: str) -> AsyncIterator[tuple[Services, Services, User]]:
    db = Database(postgres_url)
    db.migrate()
    async with db.session() as s:
        alice = await accounts.create_user(s, username="alice", password="alice-password-1", admin=True)
    await db.close()
    built: list[tuple[Services, RegistryEvents]] = []
    try:
        for name in ("a", "b"):
            services = Services.build(
                make_settings(tmp_path / name, database_url=postgres_url, secret_key=SECRET_KEY, instance_id=name)
            )
            services.prepare()
            await services.start()
            events = RegistryEvents(services.db, name, enabled=True)
            services.admin.follow(events)  # as Services.build wires it in cluster mode
            services.agent_admin.notify = events.notify
            events.on(LOCAL_AGENT, services.registry.changed)
            built.append((services, events))
            await events.start()
        yield built[0][0], built[1][0], alice
    finally:
        for services, events in built:
            await events.stop()
            await services.stop()


async def test_account_changes_and_a_saved_model_connection_reach_the_other_replica(
    two_replicas: tuple[Services, Services, User], tmp_path: Path, postgres_url: str
) -> None:
    a, b, alice = two_replicas
    assert a.auth.multi_user and b.auth.multi_user

    dora = await a.admin.create_account(username="dora", password="dora-password-1", admin=False)
    await a.admin.change_account(alice, dora["id"], {"admin": True})
    await _eventually(lambda: dora["id"] in b.auth.admin_ids, "B sees dora promoted on A")
    assert b.auth.is_admin(dora["id"])
    kept_on_b = await b.auth.account(b.db, dora["id"])  # the row B's API keeps for dora's requests
    assert kept_on_b is not None and kept_on_b.is_admin and dora["id"] in b.auth.accounts
    await a.admin.change_account(alice, dora["id"], {"disabled": True})
    await _eventually(lambda: dora["id"] in b.auth.disabled_ids, "B refuses dora's pages once A disabled her")
    assert not b.auth.is_admin(dora["id"])
    now_on_b = await b.auth.account(b.db, dora["id"])  # and her API calls: the kept row was forgotten
    assert now_on_b is not None and not accounts.is_enabled(now_on_b)
    await b.admin.change_account(alice, dora["id"], {"disabled": False})  # and back, from B to A
    await _eventually(lambda: dora["id"] not in a.auth.disabled_ids, "A sees dora enabled on B")

    await a.admin.model.save({"defaultModel": "openai/gpt-4o-mini", "apiKey": "sk-saved-on-a"}, user_id=alice.id)
    await _eventually(lambda: b.agent_admin.default_model == "openai/gpt-4o-mini", "B's new agents get A's model")
    assert b.llm.api_key == "sk-saved-on-a"  # the key in force on B too (sealed with the cluster's SECRET_KEY)

    # The command line changes an account while the replicas run: they are told as well.
    async with a.db.session() as s:
        erin = await accounts.create_user(s, username="erin", password="erin-password-1")
    cli_settings = make_settings(tmp_path / "cli", database_url=postgres_url, cluster=True)
    assert await asyncio.to_thread(users_command, cli_settings, argparse.Namespace(action="promote", name="erin")) == 0
    await _eventually(lambda: erin.id in a.auth.admin_ids and erin.id in b.auth.admin_ids, "both see erin promoted")


async def test_an_agent_edited_on_one_replica_is_what_the_others_next_turn_starts_with(
    two_replicas: tuple[Services, Services, User],
) -> None:
    # Turns start with the agent and its tools kept in memory (`AgentCache`, issue 41: two statements fewer per
    # turn start); an edit forgets them here at once and on the other replica at its notice.
    a, b, _ = two_replicas
    view = await a.agent_admin.get("coding-assistant")
    async with a.db.read() as r:
        agent = await agents.get_agent_by_slug(r, view.id)
    assert agent is not None and agent.id is not None
    for replica in (a, b):
        kept, tools = await replica.chat.agents.get(agent.id)
        assert kept is not None and "a new prompt" not in kept.system_prompt and tools == []

    await a.agent_admin.update(
        view.id, {"system_prompt": "a new prompt", "tools": [{"type": "agent-invoke", "config": {}}]}
    )
    kept, tools = await a.chat.agents.get(agent.id)  # here: at once
    assert kept is not None and kept.system_prompt == "a new prompt" and [t for t, _ in tools] == ["agent-invoke"]
    seen: list[str] = []

    async def b_sees_it() -> None:
        kept, _ = await b.chat.agents.get(agent.id)
        seen.append(kept.system_prompt if kept is not None else "")

    deadline = asyncio.get_running_loop().time() + 15
    while not seen or seen[-1] != "a new prompt":
        assert asyncio.get_running_loop().time() < deadline, f"B still starts turns with {seen[-1]!r}"
        await asyncio.sleep(0.05)
        await b_sees_it()

    await a.agent_admin.delete(view.id)
    await _eventually(lambda: not b.chat.agents._by_id, "B forgets the agents once A deleted one")
    kept, _ = await b.chat.agents.get(agent.id)
    assert kept is not None and kept.deleted_at is not None  # the start refuses it (AgentNotFoundError)


async def test_a_password_changed_on_one_replica_ends_a_remembered_basic_login_on_the_other(
    two_replicas: tuple[Services, Services, User],
) -> None:
    # A remembered Basic credential's account is the row each replica keeps (`AuthState.account`, issue 41: no read
    # per request); the other replica's notice forgets it, so the old password is refused there at once.
    a, b, alice = two_replicas
    await _eventually(lambda: b.auth.accounts_followed(), "B listens to the notices")
    forgotten = b.auth.accounts_generation
    dora = await a.admin.create_account(username="dora", password="dora-password-1", admin=False)
    await _eventually(lambda: b.auth.accounts_generation > forgotten, "B had A's notice of the new account")
    assert await b.logins.authenticate("dora", "dora-password-1", address="10.0.0.1") is not None
    assert await b.logins.authenticate("dora", "dora-password-1", address="10.0.0.1") is not None  # remembered
    assert dora["id"] in b.auth.accounts  # from the row B keeps, not a read

    forgotten = b.auth.accounts_generation
    await a.admin.change_account(alice, dora["id"], {"password": "dora-password-2"})
    await _eventually(lambda: b.auth.accounts_generation > forgotten, "B forgets the rows it kept at A's notice")
    assert await b.logins.authenticate("dora", "dora-password-1", address="10.0.0.1") is None
    assert await b.logins.authenticate("dora", "dora-password-2", address="10.0.0.1") is not None
