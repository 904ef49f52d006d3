"""Password checks that do not stall the server: off the event loop, remembered briefly, throttled on failure."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx
import pytest

from core.auth import accounts
from core.db import Database
from core.routes import api_router
from core.services import Services
from tests.conftest import make_settings
from tests.utils.live_server import live_server, services_app


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def db(tmp_path: Path, database_url: str):
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
def verifications(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread of every argon2 verification."""
    threads: list[str] = []
    real = accounts.verify_password

    def recording(password: str, password_hash: str) -> bool:
        threads.append(threading.current_thread().name)
        return real(password, password_hash)

    monkeypatch.setattr(accounts, "verify_password", recording)
    return threads


async def test_argon2_runs_in_a_worker_thread_not_on_the_event_loop(db: Database, verifications: list[str]) -> None:
    login = accounts.PasswordLogin(db.read)
    loop_thread = threading.current_thread().name
    results = await asyncio.gather(
        login.authenticate("alice", "alice-password", address="10.0.0.1"),
        login.authenticate("alice", "wrong-password", address="10.0.0.1"),
        login.authenticate("nobody", "whatever-pass", address="10.0.0.1"),
    )
    assert [u.username if u else None for u in results] == ["alice", None, None]
    assert len(verifications) == 3 and loop_thread not in verifications


async def test_a_verified_credential_is_remembered_until_it_changes_or_expires(
    db: Database, verifications: list[str]
) -> None:
    clock = FakeClock()
    login = accounts.PasswordLogin(db.read, cache_ttl_s=60, clock=clock)
    assert (await login.authenticate("alice", "alice-password", address="a")).username == "alice"
    assert (await login.authenticate("alice", "alice-password", address="b")).username == "alice"
    assert len(verifications) == 1  # the second came from memory
    assert await login.authenticate("alice", "alice-pass", address="a") is None  # another password: checked
    assert len(verifications) == 2

    async with db.session() as s:
        await accounts.set_password(s, username="alice", password="new-alice-password")
    assert await login.authenticate("alice", "alice-password", address="a") is None  # the old one, at once
    assert (await login.authenticate("alice", "new-alice-password", address="a")).username == "alice"
    checked = len(verifications)
    clock.now += 61
    assert (await login.authenticate("alice", "new-alice-password", address="a")).username == "alice"
    assert len(verifications) == checked + 1  # expired: checked again


async def test_failures_are_throttled_per_address_and_per_account(db: Database, verifications: list[str]) -> None:
    clock = FakeClock()
    login = accounts.PasswordLogin(db.read, max_failures=3, window_s=300, clock=clock)
    for _ in range(3):
        assert await login.authenticate("alice", "guess", address="10.0.0.9") is None
        clock.now += 10
    checked = len(verifications)
    # The address is spent: even bob's right password is refused from there, without a check.
    with pytest.raises(accounts.TooManyFailedLoginsError) as refused:
        await login.authenticate("bob", "bob-password", address="10.0.0.9")
    assert refused.value.retry_after_s == 300 - 30 and "try again in 270 s" in str(refused.value)
    assert len(verifications) == checked
    # So is the account, from any address (a spray from many addresses at one account).
    with pytest.raises(accounts.TooManyFailedLoginsError):
        await login.authenticate("alice", "alice-password", address="192.0.2.1")
    assert (await login.authenticate("bob", "bob-password", address="192.0.2.1")).username == "bob"
    # When the oldest failure leaves the window, one more attempt is allowed.
    clock.now = 1000.0 + 300 + 1
    assert (await login.authenticate("alice", "alice-password", address="192.0.2.1")).username == "alice"


async def test_a_success_clears_the_account_but_not_the_address(db: Database) -> None:
    clock = FakeClock()
    login = accounts.PasswordLogin(db.read, max_failures=2, window_s=300, clock=clock)
    assert await login.authenticate("alice", "guess", address="x") is None
    assert (await login.authenticate("bob", "bob-password", address="x")).username == "bob"
    assert await login.authenticate("alice", "guess", address="y") is None  # alice: 2 failures, x: 1, y: 1
    with pytest.raises(accounts.TooManyFailedLoginsError):
        await login.authenticate("alice", "alice-password", address="z")
    assert await login.authenticate("bob", "guess", address="x") is None  # x: 2 failures now
    with pytest.raises(accounts.TooManyFailedLoginsError):  # bob's own good login did not reset x's budget
        await login.authenticate("bob", "another-guess", address="x")
    # A credential verified before is still taken from there: its holder has proved they know it.
    assert (await login.authenticate("bob", "bob-password", address="x")).username == "bob"


async def test_parallel_guesses_are_throttled_like_sequential_ones(db: Database, verifications: list[str]) -> None:
    login = accounts.PasswordLogin(db.read, max_failures=5, window_s=300, clock=FakeClock())
    outcomes = await asyncio.gather(
        *(login.authenticate("alice", f"guess-{i}", address="10.0.0.7") for i in range(20)), return_exceptions=True
    )
    assert sum(o is None for o in outcomes) == 5
    assert sum(isinstance(o, accounts.TooManyFailedLoginsError) for o in outcomes) == 15
    assert len(verifications) == 5


async def test_the_same_credentials_in_parallel_share_one_check(db: Database, verifications: list[str]) -> None:
    login = accounts.PasswordLogin(db.read, max_failures=2, window_s=300, clock=FakeClock())
    users = await asyncio.gather(
        *(login.authenticate("alice", "alice-password", address="10.0.0.8") for _ in range(50))
    )
    assert {u.username for u in users} == {"alice"} and len(verifications) == 1


async def test_a_spray_of_names_does_not_grow_memory_without_bound(db: Database, monkeypatch) -> None:
    clock = FakeClock()
    login = accounts.PasswordLogin(db.read, max_failures=3, window_s=60, clock=clock)
    monkeypatch.setattr(accounts.LoginFailures, "FAILURES_MAX", 50)
    monkeypatch.setattr(accounts, "_verify_or_waste_time", lambda password, password_hash: False)
    for i in range(200):
        await login.authenticate(f"name-{i}", "guess", address=f"10.1.{i // 250}.{i % 250}")
        clock.now += 1
    assert len(login.failures) <= 50
    # The newest counts are kept: the last name is still throttled after its failures.
    assert login.failures.counts("account:name-199") == 1


async def test_basic_auth_answers_429_with_retry_after(tmp_path: Path) -> None:
    seed = Database(make_settings(tmp_path).database)
    seed.migrate()
    async with seed.session() as s:
        await accounts.create_user(s, username="alice", password="alice-password")
    await seed.close()
    services = Services.build(make_settings(tmp_path, login_max_failures=2))
    services.prepare()
    with live_server(services_app(services, api_router())) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            for _ in range(2):
                assert (await client.get("/api/sessions", auth=("alice", "guess"))).status_code == 401
            refused = await client.get("/api/sessions", auth=("alice", "alice-password"))
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
            assert "Too many failed logins" in refused.json()["detail"]


async def test_the_app_checks_passwords_without_waiting_for_the_writes_of_running_turns(tmp_path: Path) -> None:
    # On SQLite a unit of work (`Database.session`) waits for every other one of the process. Basic
    # auth checks the caller of every request: 50 sends at once each waited behind the others' saves.
    seed = Database(make_settings(tmp_path).database)
    seed.migrate()
    async with seed.session() as s:
        await accounts.create_user(s, username="alice", password="alice-password")
    await seed.close()
    services = Services.build(make_settings(tmp_path))
    services.prepare()
    assert services.db.dialect == "sqlite"
    writing, done = asyncio.Event(), asyncio.Event()

    async def a_long_write() -> None:  # a turn's save that takes its time
        async with services.db.session():
            writing.set()
            await done.wait()

    writer = asyncio.create_task(a_long_write())
    try:
        await writing.wait()
        for _ in range(2):  # checked, then remembered: neither waits for the write
            user = await asyncio.wait_for(services.logins.authenticate("alice", "alice-password", address="a"), 5)
            assert user is not None and user.username == "alice"
    finally:
        done.set()
        await writer
        await services.db.close()
