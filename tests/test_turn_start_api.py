"""The database statements of a whole turn start over the API (issue 41): a send, its stream, its end.

With HTTP Basic, as `bench/bench_cluster.py --cost` sends them, on a live server: the caller's account
comes from `AuthState` (no read per request, forgotten at each account change), the stream route of
the turn the caller just started trusts the turn's buffer for whose chat it is (no read of the chat),
and the answer takes its draft's place in one statement (on PostgreSQL in autocommit: no BEGIN and
COMMIT). In a cluster (PostgreSQL and Redis, the per-user limit of running turns) the start's unit of
work is the user's lock, the chat's UPDATE that also counts the user's running turns, and the INSERT:
with its BEGIN and COMMIT (each a statement and a round trip of its own, as `bench/_pg_wire.py` counts
them) 8 statements in 8 round trips, where there were 15 in 16. Someone else's chat still looks like no chat.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from core.services import Services
from tests.conftest import make_settings, unavailable
from tests.utils.a2a_live import build_a2a_app
from tests.utils.accounts import ALICE, BOB, seed_accounts
from tests.utils.broker import redis_test_url
from tests.utils.cluster import delete_prefix, redis_reachable
from tests.utils.live_server import live_server
from tests.utils.ports import free_port


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement the app ran, and whether psycopg began a transaction for it (a BEGIN round trip first)."""

    text: str
    began: bool

    @property
    def kind(self) -> str:
        words = self.text.split()
        return f"{words[0]} {words[2] if words[0] in ('INSERT', 'DELETE') else words[1]}"


class Recorder:
    """The statements of the app's engine while `recording` (SQLAlchemy's `before_cursor_execute`)."""

    def __init__(self, services: Services) -> None:
        self.engine = services.db.engine.sync_engine
        self.postgres = services.db.dialect == "postgresql"
        self.statements: list[Statement] = []

    def _record(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        began = False
        if self.postgres:  # psycopg sends BEGIN before a statement outside autocommit when no transaction is open
            import psycopg

            driver = conn.connection.driver_connection
            began = not driver.autocommit and driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        self.statements.append(Statement(" ".join(statement.split()), began))

    def __enter__(self) -> list[Statement]:
        self.statements = []
        event.listen(self.engine, "before_cursor_execute", self._record)
        return self.statements

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._record)


def _server(services: Services) -> Iterator[str]:
    services.prepare()
    assert services.auth.multi_user
    with live_server(build_a2a_app(services)) as url:
        yield url


async def _new_chat(client: httpx.AsyncClient) -> str:
    created = await client.post("/api/sessions", json={"agentId": "general-assistant"})
    assert created.status_code == 201, created.text
    return created.json()["id"]


async def _turn_start(client: httpx.AsyncClient, session_id: str) -> str:
    """A send of one token's answer, and its stream read to its end (the turn's end is saved before `finish`)."""
    sent = await client.post(f"/api/sessions/{session_id}/messages", json={"content": "/lorem 1"})
    assert sent.status_code == 202, sent.text
    async with client.stream("GET", sent.json()["streamUrl"]) as stream:
        assert stream.status_code == 200
        body = "".join([chunk async for chunk in stream.aiter_text()])
    assert '"finish"' in body, body
    return body


async def _start_and_count(url: str, recorder: Recorder) -> list[Statement]:
    async with httpx.AsyncClient(base_url=url, auth=ALICE, timeout=30) as alice:
        await _turn_start(alice, await _new_chat(alice))  # warm: the account and the agent are read once
        session_id = await _new_chat(alice)
        with recorder as statements:
            await _turn_start(alice, session_id)
        # The turn's end was saved before `finish` was sent; a draft save of a 1-token turn does not come.
        return list(statements)


@pytest.fixture
def one_process(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Services]]:
    """One process with accounts (alice, bob) on the parametrised database."""
    seed_accounts(tmp_path, database_url)
    services = Services.build(make_settings(tmp_path, database_url=database_url))
    for url in _server(services):
        yield url, services


async def test_a_turn_start_reads_neither_the_caller_nor_the_chat_twice(one_process) -> None:
    url, services = one_process
    statements = await _start_and_count(url, Recorder(services))
    kinds = [st.kind for st in statements]
    assert not [k for k in kinds if "users" in k], kinds  # the caller's row is kept (`AuthState.account`)
    assert kinds.count("SELECT agent_sessions.id,") == 1, kinds  # the send's ownership check, not the stream's
    if services.db.dialect == "postgresql":
        assert kinds == [
            "SELECT agent_sessions.id,",  # the chat (autocommit)
            "SELECT agent_messages.id,",  # its history (autocommit)
            "UPDATE agent_sessions",  # the start's unit: the chat's time and title, its row locked
            "INSERT agent_messages",  # the user's message and the draft
            "WITH answered",  # the end: the answer over its draft and the chat's time, one statement
        ], kinds
        assert [st.began for st in statements] == [False, False, True, False, False]  # one BEGIN (and COMMIT)
    else:
        assert len(kinds) == 8, kinds  # the start's batched unit is 4 (tests/test_turn_statements.py), the end 2


async def test_a_stream_of_someone_elses_chat_still_looks_like_no_chat(one_process) -> None:
    url, _services = one_process
    async with (
        httpx.AsyncClient(base_url=url, auth=ALICE, timeout=30) as alice,
        httpx.AsyncClient(base_url=url, auth=BOB, timeout=30) as bob,
    ):
        session_id = await _new_chat(alice)
        await _turn_start(alice, session_id)  # its buffer names alice
        refused = await bob.get(f"/api/sessions/{session_id}/stream")
        unknown = await bob.get("/api/sessions/as_000000000000000000000000/stream")
        assert refused.status_code == unknown.status_code == 404
        assert refused.json() == unknown.json()
        again = await alice.get(f"/api/sessions/{session_id}/stream")  # the owner replays the finished turn
        assert again.status_code == 200 and '"finish"' in again.text


async def test_a_password_changed_in_the_admin_area_ends_a_remembered_basic_login(one_process) -> None:
    url, services = one_process
    async with httpx.AsyncClient(base_url=url, auth=BOB, timeout=30) as bob:
        assert (await bob.get("/api/sessions")).status_code == 200  # verified, then remembered
        async with httpx.AsyncClient(base_url=url, auth=ALICE, timeout=30) as alice:
            accounts = (await alice.get("/api/admin/users")).json()
            bob_id = next(a["id"] for a in accounts if a["username"] == BOB[0])
            changed = await alice.patch(f"/api/admin/users/{bob_id}", json={"password": "bob-password-2"})
            assert changed.status_code == 200, changed.text
        refused = await bob.get("/api/sessions")  # the kept row was forgotten: the old password is refused at once
        assert refused.status_code == 401, refused.text


@pytest.mark.postgres
async def test_a_cluster_turn_start_is_eight_statements_in_eight_round_trips(tmp_path: Path, postgres_url: str) -> None:
    redis_url = redis_test_url()
    if problem := redis_reachable(redis_url):
        unavailable(problem)
    prefix = f"a2a-test-{secrets.token_hex(4)}:"
    seed_accounts(tmp_path, postgres_url)
    settings = make_settings(
        tmp_path,
        database_url=postgres_url,
        cluster=True,
        instance_id="statements",
        redis={"url": redis_url, "key_prefix": prefix},
        replica_url=f"http://127.0.0.1:{free_port()}",
        internal_token="t",
        storage_secret="s",
        max_running_turns_per_user=5,
    )
    services = Services.build(settings)
    try:
        for url in _server(services):
            statements = await _start_and_count(url, Recorder(services))
    finally:
        delete_prefix(redis_url, prefix)
    kinds = [st.kind for st in statements]
    assert kinds == [
        "SELECT agent_sessions.id,",  # the chat (autocommit)
        "SELECT agent_messages.id,",  # its history (autocommit)
        "SELECT pg_advisory_xact_lock(%(key)s::INTEGER,",  # the start's unit: the user's starts one at a time
        "UPDATE agent_sessions",  # the chat's time and title, and the user's running turns counted
        "INSERT agent_messages",  # the user's message and the draft
        "WITH answered",  # the end, in autocommit
    ], kinds
    assert "count(*)" in statements[3].text and "RETURNING" in statements[3].text
    began = sum(st.began for st in statements)
    assert began == 1 and statements[2].began  # one transaction: its BEGIN and COMMIT are 2 round trips more
    assert len(statements) + 2 * began == 8  # 15 before issue 41 (the caller twice, the chat twice, a count, ...)
