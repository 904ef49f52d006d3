"""The API's `CurrentUser` without a database read per request (issue 38): `AuthState` keeps the accounts' rows.

A browser's request names its account by id (its login session); the row is read once and kept until an
account changes. Each change the admin area makes (disabling, promoting, a new password) is seen at the
account's next request: disabled is refused (401), promoted may change agents. The rows kept are shared
between requests, never re-read while nothing changed. The same across replicas: tests/test_cluster_caches.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from core import cli
from core.auth import accounts, deps
from core.auth.account_mark import AccountsMark
from core.auth.deps import AdminUser, CurrentUser, user_id_of
from core.services import Services
from core.web.errors import install_error_handlers
from models import User
from tests.conftest import make_settings


@pytest.fixture
async def api(tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple]:
    """An app with a route for any user and one for admins; the browser's login is `signed_in[0]`."""
    services = Services.build(make_settings(tmp_path, database_url=database_url))
    services.db.migrate()
    async with services.db.session() as s:
        alice = await accounts.create_user(s, username="alice", password="alice-password-1", admin=True)
        dora = await accounts.create_user(s, username="dora", password="dora-password-1")
    services.prepare()
    await services.start()
    assert services.auth.multi_user
    signed_in: list[int | None] = [dora.id]
    monkeypatch.setattr(deps, "_browser_user_id", lambda _request: signed_in[0])  # the browser session's login

    app = FastAPI()
    app.state.services = services
    install_error_handlers(app)

    @app.get("/api/me")
    async def me(user: CurrentUser) -> dict[str, object]:
        return {"id": user_id_of(user), "admin": user.is_admin}

    @app.get("/api/admin-only")
    async def admin_only(user: AdminUser) -> dict[str, object]:
        return {"id": user_id_of(user)}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        yield client, services, alice, dora, signed_in
    await services.stop()


async def test_the_account_is_read_once_and_each_admin_change_is_seen_at_the_next_request(api) -> None:
    client, services, alice, dora, _signed_in = api
    reads = 0
    real_get_user = accounts.get_user

    async def counting_get_user(session, user_id: int) -> User | None:
        nonlocal reads
        reads += 1
        return await real_get_user(session, user_id)

    accounts.get_user = counting_get_user  # type: ignore[assignment]
    try:
        for _ in range(3):
            assert (await client.get("/api/me")).json() == {"id": dora.id, "admin": False}
        assert reads == 1  # read once, then kept
        assert (await client.get("/api/admin-only")).status_code == 403

        await services.admin.change_account(alice, dora.id, {"admin": True})
        assert (await client.get("/api/admin-only")).status_code == 200  # promoted: at the next request
        assert (await client.get("/api/me")).json()["admin"] is True

        await services.admin.change_account(alice, dora.id, {"disabled": True})
        refused = await client.get("/api/me")
        assert refused.status_code == 401 and refused.json()["code"] == "login_required"

        await services.admin.change_account(alice, dora.id, {"disabled": False, "password": "dora-password-2"})
        assert (await client.get("/api/me")).status_code == 200
        assert reads == 4  # one read after each change, none between
    finally:
        accounts.get_user = real_get_user  # type: ignore[assignment]


async def test_a_read_begun_before_an_account_change_is_not_kept(api) -> None:
    _client, services, alice, dora, _signed_in = api
    auth = services.auth
    real_get_user = accounts.get_user

    async def get_user_then_disable(session, user_id: int) -> User | None:
        row = await real_get_user(session, user_id)  # read while dora was still enabled
        accounts.get_user = real_get_user  # type: ignore[assignment]
        await services.admin.change_account(alice, dora.id, {"disabled": True})
        return row

    accounts.get_user = get_user_then_disable  # type: ignore[assignment]
    try:
        stale = await auth.account(services.db, dora.id)
    finally:
        accounts.get_user = real_get_user  # type: ignore[assignment]
    assert stale is not None and accounts.is_enabled(stale)
    assert dora.id not in auth.accounts  # not kept: the next request reads the disabled row
    fresh = await auth.account(services.db, dora.id)
    assert fresh is not None and not accounts.is_enabled(fresh)


async def test_while_notices_are_not_received_every_request_reads_the_account(api) -> None:
    client, services, _alice, dora, _signed_in = api
    services.auth.accounts_followed = lambda: False  # a cluster replica whose listening connection dropped
    assert (await client.get("/api/me")).status_code == 200
    assert dora.id not in services.auth.accounts
    async with services.db.session() as s:  # changed elsewhere, no notice received
        row = await s.get(User, dora.id)
        assert row is not None
        row.disabled_at = row.created_at
        s.add(row)
        await s.commit()
    assert (await client.get("/api/me")).status_code == 401


async def test_a_promotion_from_the_command_line_is_seen_by_the_running_app_at_the_next_request(api) -> None:
    """`python app.py users promote NAME`, the advice of the 403, works without a restart of a single app."""
    client, services, _alice, dora, _signed_in = api
    assert (await client.get("/api/admin-only")).status_code == 403
    assert not services.auth.is_admin(dora.id)
    assert dora.id in services.auth.accounts  # kept: nothing tells the app but the command line's mark

    args = cli.parse_args(["users", "promote", "dora"])
    assert await asyncio.to_thread(cli.run_command, services.settings, args) == 0  # another "process"'s change

    assert (await client.get("/api/admin-only")).status_code == 200
    assert (await client.get("/api/me")).json() == {"id": dora.id, "admin": True}
    await services.admin._reloading  # the pages' set of admins, read again beside the request
    assert services.auth.is_admin(dora.id)


async def test_the_mark_moves_once_per_change_even_within_the_clock_tick(tmp_path: Path) -> None:
    mark, writer = AccountsMark(tmp_path), AccountsMark(tmp_path)
    assert not mark.moved()  # no file yet: nothing changed
    writer.touch()
    assert mark.moved() and not mark.moved()  # seen once
    writer.touch()
    writer.touch()
    assert mark.moved() and not mark.moved()


async def test_the_auth_state_the_start_decides_on_keeps_the_hooks_of_the_admin_area(api) -> None:
    """`Services.prepare` replaces the `AuthState` after `follow` and the mark were wired in `Services.build`."""
    _client, services, _alice, dora, _signed_in = api

    class Notices:  # a cluster's registry notices, whose listening connection is down
        listening = False

        def on(self, *_args: object) -> None: ...

        def on_reconnect(self, *_args: object) -> None: ...

        async def notify(self, *_args: object) -> None: ...

    services.admin.follow(Notices())  # type: ignore[arg-type]
    services.admin.auth = deps.AuthState(multi_user=True, local_user_id=None)  # as `prepare` does
    auth = services.admin.auth
    assert not auth.accounts_followed()  # not kept while notices may be missed: read at each request
    await auth.account(services.db, dora.id)
    assert dora.id not in auth.accounts
    AccountsMark(services.settings.data_dir).touch()
    assert auth.changed_elsewhere()  # and the command line's mark is still watched
