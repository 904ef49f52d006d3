"""The admin area's operations (issue 39): accounts, running turns, the model connection, the server's health.

Every method here is for an admin (the routes and the page check it first); the rules of each account
change are `core.auth.user_admin`'s, the model connection's `core.admin.model_connection`'s. Each
account change is applied at once to `AuthState` (a disabled account's pages are refused at their next
request; the navigation shows the admin area to admins) in this process, and in a cluster on the other
replicas too (`follow`: a registry notice over PostgreSQL, `core/db_events.py`; each reads the accounts'
state again, and the API's kept account rows are forgotten: `AuthState.account`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sqlalchemy import text

from core.admin.model_connection import ModelConnectionAdmin
from core.auth import user_admin
from core.auth.account_mark import AccountsMark
from core.auth.deps import AuthState
from core.broker.service import Broker
from core.chat import running_turns as running_turns_store
from core.chat.engine import ChatEngine
from core.db import Database, describe_database
from core.db_events import RegistryEvents
from core.errors import AppError
from core.i18n import _
from core.settings import Settings, describe_redis
from core.streaming.redis_hub import RedisStreamHub
from models import User

log = logging.getLogger(__name__)

__all__ = ["ACCOUNTS", "AdminArea", "SingleUserModeError"]

ACCOUNTS = "accounts"  # the kind of registry notice an account change sends (core/db_events.py)


class SingleUserModeError(AppError, RuntimeError):
    """Accounts are made on the command line while the app runs without them (single-user mode)."""

    code = "single_user_mode"


class AdminArea:
    """What the admin area reads and does; see the module docstring."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        auth: AuthState,
        chat: ChatEngine,
        broker: Broker | None,
        model: ModelConnectionAdmin,
    ) -> None:
        self.db = db
        self.settings = settings
        self.chat = chat
        self.broker = broker
        self.model = model
        self._events: RegistryEvents | None = None
        self._mark: AccountsMark | None = None
        self._reloading: asyncio.Task[None] | None = None
        self.auth = auth

    @property
    def auth(self) -> AuthState:
        """The accounts' state the app serves with."""
        return self._auth

    @auth.setter
    def auth(self, auth: AuthState) -> None:
        # Replaced once the auth mode is decided (`Services.prepare`): how it learns of changes made elsewhere
        # (another replica's notices, the command line's mark) goes along.
        self._auth = auth
        events, mark = self._events, self._mark
        if events is not None:
            auth.accounts_followed = lambda: events.listening
        if mark is not None:
            auth.changed_elsewhere = mark.moved
            auth.reload_soon = self._reload_soon

    def follow(self, events: RegistryEvents) -> None:
        """In a cluster: tell the other replicas of each account change and saved model connection, apply theirs."""
        self._events = events
        self.auth = self.auth  # its accounts are kept only while the notices come in
        events.on(ACCOUNTS, self._accounts_changed_elsewhere)
        events.on_reconnect(self._reload_accounts)
        self.model.follow(events)

    def watch_command_line(self, mark: AccountsMark) -> None:
        """A single app: the command line's account changes (core/auth/account_mark.py) are seen at the next look."""
        self._mark = mark
        self.auth = self.auth

    def _reload_soon(self) -> None:
        if self._reloading is None or self._reloading.done():
            self._reloading = asyncio.get_running_loop().create_task(self._reload_logged())

    async def _reload_logged(self) -> None:
        try:
            await self._reload_accounts()
        except Exception:  # the rows are forgotten already: the API reads them afresh; only the pages' sets wait
            log.warning("could not read the accounts again after a change from the command line", exc_info=True)

    async def _accounts_changed_elsewhere(self, _user_id: str, _op: str) -> None:
        await self._reload_accounts()

    async def _accounts_changed(self, user_id: int | None, op: str) -> None:
        await self._reload_accounts()
        if self._events is not None:
            await self._events.notify(ACCOUNTS, str(user_id), op)

    async def load(self) -> None:
        """Read the accounts' state and the saved model connection (at start)."""
        async with self.db.read() as s:
            self.auth.disabled_ids = await user_admin.disabled_ids(s)
            self.auth.admin_ids = await user_admin.admin_ids(s)
        self.auth.forget_accounts()
        await self.model.load()

    # -- accounts ------------------------------------------------------------------------

    async def accounts(self) -> list[dict[str, Any]]:
        """Every account, each with how many turns it has running now (on any replica)."""
        running = await self.running_turns()
        counts: dict[int, int] = {}
        for turn in running:
            counts[turn["userId"]] = counts.get(turn["userId"], 0) + 1
        async with self.db.read() as s:
            views = await user_admin.list_accounts(s)
        return [{**view.as_json(), "runningTurns": counts.get(view.id, 0)} for view in views]

    def _require_accounts(self) -> None:
        if not self.auth.multi_user:
            raise SingleUserModeError(
                _(
                    "The app runs without accounts (single-user mode): create the first one on the command line "
                    "(python app.py users add NAME --admin), then restart the app to log in with it."
                )
            )

    async def account(self, user_id: int | None) -> User | None:
        """The user with that id (the page's actor), or None."""
        if user_id is None:
            return None
        async with self.db.read() as s:
            return await s.get(User, user_id)

    async def create_account(self, *, username: str, password: str, admin: bool) -> dict[str, Any]:
        """A new account (`accounts.AccountError` when the name or the password cannot be taken)."""
        self._require_accounts()
        async with self.db.session() as s:
            view = await user_admin.create_account(s, username=username, password=password, admin=admin)
        await self._accounts_changed(view.id, "created")
        return {**view.as_json(), "runningTurns": 0}

    async def change_account(self, actor: User, user_id: int, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply `admin` (bool), `disabled` (bool) and `password` (str) where given, in that order."""
        self._require_accounts()
        assert actor.id is not None, "a stored account has its id"
        async with self.db.session() as s:
            view = None
            if "admin" in changes:
                view = await user_admin.set_admin(s, actor_id=actor.id, user_id=user_id, admin=changes["admin"])
            if "disabled" in changes:
                view = await user_admin.set_disabled(
                    s, actor_id=actor.id, user_id=user_id, disabled=changes["disabled"]
                )
            if "password" in changes:
                view = await user_admin.reset_password(s, user_id=user_id, password=changes["password"])
            if view is None:
                view = next((v for v in await user_admin.list_accounts(s) if v.id == user_id), None)
                if view is None:
                    raise user_admin.UnknownAccountError(_("There is no such account."))
        await self._accounts_changed(user_id, "changed")
        running = sum(1 for turn in await self.running_turns() if turn["userId"] == user_id)
        return {**view.as_json(), "runningTurns": running}

    async def _reload_accounts(self) -> None:
        self.auth.forget_accounts()  # first: an API request in the meantime reads the row afresh
        async with self.db.read() as s:
            self.auth.disabled_ids = await user_admin.disabled_ids(s)
            self.auth.admin_ids = await user_admin.admin_ids(s)

    # -- running turns -------------------------------------------------------------------

    async def running_turns(self) -> list[dict[str, Any]]:
        """Every running turn, on any replica, with its user's name."""
        async with self.db.read() as s:
            turns = await running_turns_store.running_turns(s)
            names = {view.id: view.username for view in await user_admin.list_accounts(s)}
        if not self.auth.multi_user and self.auth.local_user_id is not None:
            names[self.auth.local_user_id] = "local"
        return [{**turn, "username": names.get(turn["userId"], "")} for turn in turns]

    async def stop_turn(self, session_id: str) -> bool:
        """Stop a running turn of any user (its partial answer is kept); False when that session runs none."""
        if not any(turn["sessionId"] == session_id for turn in await self.running_turns()):
            return False
        return await self.chat.cancel(session_id)

    # -- health --------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """The database (a round trip), Redis, the broker and, in a cluster, this replica: each `ok` or why not."""
        started = time.perf_counter()
        try:
            async with self.db.read() as s:
                await s.exec(text("SELECT 1"))  # type: ignore[call-overload]
            database: dict[str, Any] = {"ok": True, "ms": round((time.perf_counter() - started) * 1000, 1)}
        except Exception as exc:  # any driver error: the page says the database is down, and why
            database = {"ok": False, "error": type(exc).__name__ + ": " + str(exc)[:200]}
        database["url"] = describe_database(self.settings.database)
        broker = self.broker.health() if self.broker is not None else None
        dsn = self.settings.redis.dsn
        redis: dict[str, Any] = {"configured": bool(dsn), "url": describe_redis(dsn)}
        if broker is not None and self.settings.redis.dsn:
            redis["ok"] = broker.get("redis") != "down"
            redis["state"] = broker.get("redis")
        if isinstance(self.chat.hub, RedisStreamHub):
            started = time.perf_counter()
            try:
                await self.chat.hub.redis.ping()
                redis.update(ok=True, ms=round((time.perf_counter() - started) * 1000, 1))
            except Exception as exc:  # a cluster without its Redis: say so
                redis.update(ok=False, error=type(exc).__name__ + ": " + str(exc)[:200])
        ok = database["ok"] and redis.get("ok", True) and (broker is None or broker.get("status") == "ok")
        return {
            "status": "ok" if ok else "degraded",
            "database": database,
            "redis": redis,
            "broker": broker,
            "replica": {
                "id": self.settings.instance_id,
                "cluster": self.settings.cluster,
                "turnsRunningHere": self.chat.running_here(),
            },
        }
