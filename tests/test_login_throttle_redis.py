"""Failed logins counted across a cluster (core/auth/login_throttle.py `RedisLoginFailures`).

Two `PasswordLogin`s on one database and one Redis key prefix stand for two replicas. Real Redis
(TEST_REDIS_URL), a key prefix of each test's own, removed at the end.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from core.auth import accounts
from core.db import Database
from tests.conftest import unavailable
from tests.utils.broker import redis_test_url
from tests.utils.cluster import delete_prefix, redis_reachable
from tests.utils.ports import free_port

pytestmark = pytest.mark.cluster


@pytest.fixture
async def db(tmp_path: Path, database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    database.migrate()
    async with database.session() as s:
        await accounts.create_user(s, username="alice", password="alice-password")
        await accounts.create_user(s, username="bob", password="bob-password")
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    url = redis_test_url()
    if (reason := redis_reachable(url)) is not None:
        unavailable(reason)
    value = f"a2a-logins-test-{secrets.token_hex(4)}:"
    try:
        yield value
    finally:
        delete_prefix(url, value)


def replica(
    db: Database, prefix: str, *, max_failures: int = 3, window_s: float = 300.0, url: str | None = None
) -> accounts.PasswordLogin:
    """One replica's `PasswordLogin`, counting in Redis under `prefix`."""
    failures = accounts.RedisLoginFailures.from_url(
        url or redis_test_url(), prefix=prefix, max_failures=max_failures, window_s=window_s
    )
    return accounts.PasswordLogin(db.read, max_failures=max_failures, window_s=window_s, failures=failures)


@pytest.fixture
def verifications(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread of every argon2 verification."""
    threads: list[str] = []
    real = accounts.verify_password

    def recording(password: str, password_hash: str) -> bool:
        threads.append(threading.current_thread().name)
        return real(password, password_hash)

    monkeypatch.setattr(accounts, "verify_password", recording)
    return threads


async def test_failures_on_one_replica_throttle_the_other(db: Database, prefix: str, verifications) -> None:
    a, b = replica(db, prefix), replica(db, prefix)
    try:
        for _ in range(3):
            assert await a.authenticate("alice", "guess", address="10.0.0.9") is None
        checked = len(verifications)
        # The address is spent on B too: even bob's right password is refused from there, unchecked.
        with pytest.raises(accounts.TooManyFailedLoginsError) as refused:
            await b.authenticate("bob", "bob-password", address="10.0.0.9")
        assert 290 <= refused.value.retry_after_s <= 300
        # So is the account, from any address, on either replica.
        with pytest.raises(accounts.TooManyFailedLoginsError):
            await b.authenticate("alice", "alice-password", address="192.0.2.1")
        assert len(verifications) == checked
        assert (await b.authenticate("bob", "bob-password", address="192.0.2.1")).username == "bob"
    finally:
        await a.close()
        await b.close()


async def test_parallel_guesses_spread_over_two_replicas_get_the_limit_once(
    db: Database, prefix: str, verifications
) -> None:
    a, b = replica(db, prefix, max_failures=5), replica(db, prefix, max_failures=5)
    try:
        outcomes = await asyncio.gather(
            *((a if i % 2 else b).authenticate("alice", f"guess-{i}", address=f"10.0.1.{i}") for i in range(20)),
            return_exceptions=True,
        )
        assert sum(o is None for o in outcomes) == 5  # 5 in all, not 5 per replica
        assert sum(isinstance(o, accounts.TooManyFailedLoginsError) for o in outcomes) == 15
        assert len(verifications) == 5
    finally:
        await a.close()
        await b.close()


async def test_a_success_on_one_replica_clears_the_account_on_the_other(db: Database, prefix: str) -> None:
    a, b = replica(db, prefix, max_failures=2), replica(db, prefix, max_failures=2)
    try:
        assert await a.authenticate("alice", "guess", address="x") is None
        assert (await b.authenticate("alice", "alice-password", address="y")).username == "alice"
        assert await a.authenticate("alice", "guess", address="z") is None  # alice: 1 failure again, not 2
        assert (await a.authenticate("alice", "alice-password", address="w")).username == "alice"
        # The address's own budget is not reset by a success: x failed once, and y's success took back its own.
        assert await b.authenticate("bob", "guess", address="x") is None
        with pytest.raises(accounts.TooManyFailedLoginsError):
            await a.authenticate("bob", "another-guess", address="x")
    finally:
        await a.close()
        await b.close()


async def test_a_failure_counts_only_for_the_window(db: Database, prefix: str) -> None:
    a, b = replica(db, prefix, max_failures=2, window_s=3.0), replica(db, prefix, max_failures=2, window_s=3.0)
    try:
        for login in (a, b):
            assert await login.authenticate("alice", "guess", address="x") is None
        with pytest.raises(accounts.TooManyFailedLoginsError) as refused:
            await b.authenticate("alice", "alice-password", address="y")
        assert 1 <= refused.value.retry_after_s <= 3
        await asyncio.sleep(refused.value.retry_after_s + 0.1)  # the oldest failure has left the window
        assert (await a.authenticate("alice", "alice-password", address="y")).username == "alice"
        keys = [a.failures.key("address:x"), a.failures.key("account:alice")]
        client = Redis.from_url(redis_test_url())
        try:  # what no longer counts is not kept: every count expires with its window
            assert 0 < await client.pttl(keys[0]) <= 3000 or not await client.exists(keys[0])
            assert not await client.exists(keys[1])
        finally:
            await client.aclose()
    finally:
        await a.close()
        await b.close()


async def test_without_redis_each_replica_counts_its_own_and_says_so(
    db: Database, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    login = replica(db, prefix, max_failures=2, url=down)
    try:
        with caplog.at_level(logging.WARNING, logger="core.auth.login_throttle"):
            for _ in range(2):
                assert await login.authenticate("alice", "guess", address="x") is None
            with pytest.raises(accounts.TooManyFailedLoginsError):  # still throttled, by this process's counts
                await login.authenticate("alice", "alice-password", address="y")
            assert (await login.authenticate("bob", "bob-password", address="y")).username == "bob"
        warnings = [r for r in caplog.records if "counted in this process only" in r.getMessage()]
        assert len(warnings) == 1  # once per outage, not once per login
    finally:
        await login.close()
