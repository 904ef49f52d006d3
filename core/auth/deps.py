"""Who is asking, and the ground-floor services, as FastAPI dependencies for every router of `/api` and `/a2a`.

In single-user mode every request is the `local` user. With accounts, a request carries either the
browser's session (after logging in on `/login`) or HTTP Basic credentials (checked by
`PasswordLogin`: throttled, argon2 off the event loop).

A route names the few services it uses, each as its own dependency (`DatabaseDep`, `HubDep`, ...,
as the FastAPI full-stack template's `SessionDep`), never the whole composition. The services of
the packages above this one have their dependencies beside them (`core/chat/deps.py`, ...). All
of them read the one composition `app.py` sets on `app.state.services`, by attribute.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request, status
from fastapi.security import HTTPBasic, HTTPBasicCredentials
from starlette.requests import HTTPConnection

from core.auth import accounts
from core.auth.login_throttle import TooManyFailedLoginsError
from core.db import Database
from core.i18n import _
from core.settings import Settings
from core.streaming.backend import StreamHubBackend
from core.web.errors import ApiError
from models import User

USER_ID_KEY = "user_id"  # in app.storage.user, set by the login page

_basic = HTTPBasic(auto_error=False)


@dataclass(slots=True)
class AuthState:
    """Single-user (`local`, loopback only) or multi-user (log in with a password)."""

    multi_user: bool
    local_user_id: int | None
    # Kept by the admin area (loaded at start, read again at each account change of this process and, in a
    # cluster, of another replica): the pages read them on every request without a database trip.
    disabled_ids: set[int] = field(default_factory=set)
    admin_ids: set[int] = field(default_factory=set)
    # The accounts' rows as last read, for the API's `CurrentUser` (one read per account, not one per
    # request; docs/ARCHITECTURE.md "Cluster: the broker across replicas"): forgotten at each account
    # change, as the sets above are read again, so a disabled or demoted account is refused at its next
    # request. Shared, read-only rows: never added to a session.
    accounts: dict[int, User] = field(default_factory=dict)
    accounts_generation: int = 0  # counts the forgettings: a read that began before one is not kept
    # In a cluster, whether this replica is receiving the other replicas' notices (while it is not, a
    # change there would go unseen here: the rows are read at each request, as without this snapshot).
    accounts_followed: Callable[[], bool] = field(default=lambda: True)
    # A single app (no cluster): whether the command line changed an account since the last look (a file's
    # time, core/auth/account_mark.py), and what reads the sets above again then (the admin area's).
    changed_elsewhere: Callable[[], bool] = field(default=lambda: False)
    reload_soon: Callable[[], None] = field(default=lambda: None)

    def is_admin(self, user_id: int | None) -> bool:
        """Whether the page's user may open the admin area (`local` in single-user mode)."""
        if not self.multi_user:
            return user_id is not None and user_id == self.local_user_id
        self._catch_up()
        return user_id is not None and user_id in self.admin_ids and user_id not in self.disabled_ids

    def _catch_up(self) -> None:
        """An account changed from the command line: forget the rows kept and read the sets again."""
        if self.changed_elsewhere():
            self.forget_accounts()
            self.reload_soon()

    def forget_accounts(self) -> None:
        """An account changed (here or on another replica): the rows kept are read again when next asked for."""
        self.accounts = {}
        self.accounts_generation += 1

    async def account(self, db: Database, user_id: int) -> User | None:
        """The account's row: the one kept, else read (and kept unless an account changed meanwhile)."""
        self._catch_up()
        followed = self.accounts_followed()
        user = self.accounts.get(user_id) if followed else None
        if user is not None:
            return user
        generation = self.accounts_generation
        async with db.read() as s:
            user = await accounts.get_user(s, user_id)
        if user is not None and followed and generation == self.accounts_generation:
            self.accounts[user_id] = user
        return user


def get_services(connection: HTTPConnection) -> Any:
    """The app's composition of services (set on `app.state` by `app.py`); the dependencies below read it."""
    return connection.app.state.services


# The dependencies below are `async def` although they only read an attribute: FastAPI runs a plain `def`
# dependency on a worker thread for each request (tests/test_route_dependencies.py says why that mattered).


async def get_db(request: Request) -> Database:
    """The database."""
    db: Database = get_services(request).db
    return db


async def get_settings(request: Request) -> Settings:
    """The settings the app started with."""
    settings: Settings = get_services(request).settings
    return settings


async def get_hub(request: Request) -> StreamHubBackend:
    """The stream hub (turns', delegations' and tasks' event buffers)."""
    hub: StreamHubBackend = get_services(request).hub
    return hub


async def get_auth_state(request: Request) -> AuthState:
    """Single-user or multi-user mode (decided at start-up)."""
    auth: AuthState = get_services(request).auth
    return auth


async def get_logins(request: Request) -> accounts.PasswordLogin:
    """Password logins with their throttle."""
    logins: accounts.PasswordLogin = get_services(request).logins
    return logins


DatabaseDep = Annotated[Database, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
HubDep = Annotated[StreamHubBackend, Depends(get_hub)]
AuthStateDep = Annotated[AuthState, Depends(get_auth_state)]
LoginsDep = Annotated[accounts.PasswordLogin, Depends(get_logins)]


def user_id_of(user: User) -> int:
    """The signed-in user's id: `CurrentUser` is a saved row, which always has one (SQLModel types it optional)."""
    assert user.id is not None, "CurrentUser is a saved row"
    return user.id


async def get_current_user(
    request: Request,
    db: DatabaseDep,
    auth: AuthStateDep,
    logins: LoginsDep,
    credentials: Annotated[HTTPBasicCredentials | None, Depends(_basic)],
) -> User:
    """The user making the request, or 401 (the account's row as `AuthState` keeps it: no read per request)."""
    if not auth.multi_user:
        user = await auth.account(db, auth.local_user_id or 0)
        if user is not None:
            return user
    user_id = _browser_user_id(request)
    if user_id is not None:
        user = await auth.account(db, user_id)
        if user is not None and accounts.is_enabled(user):
            return user
    if credentials is not None:
        try:
            user = await logins.authenticate(
                credentials.username, credentials.password, address=client_address(request)
            )
        except TooManyFailedLoginsError as exc:
            raise ApiError(
                status.HTTP_429_TOO_MANY_REQUESTS,
                "too_many_failed_logins",
                detail=str(exc),
                headers={"Retry-After": str(exc.retry_after_s)},
            ) from exc
        if user is not None:
            return user
    raise ApiError(
        status.HTTP_401_UNAUTHORIZED,
        "login_required",
        detail=_("Log in first: use the browser session from /login, or HTTP Basic credentials."),
        headers={"WWW-Authenticate": "Basic"},
    )


def client_address(request: Request) -> str:
    """The address of the peer that sent the request (a proxy's, behind one)."""
    return request.client.host if request.client is not None else ""


def _browser_user_id(request: Request) -> int | None:
    if "session" not in request.scope:  # no SessionMiddleware (no storage secret)
        return None
    from nicegui import app  # the browser session lives in NiceGUI's per-user storage

    try:
        value = app.storage.user.get(USER_ID_KEY)
    except (RuntimeError, AssertionError, KeyError):
        return None
    return value if isinstance(value, int) else None


CurrentUser = Annotated[User, Depends(get_current_user)]


async def get_admin_user(user: CurrentUser, auth: AuthStateDep) -> User:
    """The user making the request if they may change agents (an admin, or `local` in single-user mode), else 403."""
    if not accounts.may_change_agents(user, multi_user=auth.multi_user):
        raise ApiError(
            status.HTTP_403_FORBIDDEN,
            "admin_required",
            detail=_(
                "Only admins create, change or delete agents; an admin can make you one "
                "(python app.py users promote NAME)."
            ),
        )
    return user


AdminUser = Annotated[User, Depends(get_admin_user)]


async def get_area_admin(user: CurrentUser, auth: AuthStateDep) -> User:
    """The user making the request if they may use the admin area (an admin, or `local`), else 403."""
    if not accounts.may_change_agents(user, multi_user=auth.multi_user):
        raise ApiError(
            status.HTTP_403_FORBIDDEN,
            "admin_required",
            detail=_("The admin area is for admins; an admin can make you one (python app.py users promote NAME)."),
        )
    return user


AreaAdmin = Annotated[User, Depends(get_area_admin)]
