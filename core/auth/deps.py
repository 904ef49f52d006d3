"""Who is asking, and the app's services, as FastAPI dependencies for every router of `/api` and `/a2a`.

In single-user mode every request is the `local` user. With accounts, a request carries either the
browser's session (after logging in on `/login`) or HTTP Basic credentials (checked by
`PasswordLogin`: throttled, argon2 off the event loop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request, status
from fastapi.security import HTTPBasic, HTTPBasicCredentials

from core.auth import accounts
from core.i18n import _
from core.web.errors import ApiError
from models import User

if TYPE_CHECKING:  # the composition of services sits above every router; routes only read it
    from core.services import Services

USER_ID_KEY = "user_id"  # in app.storage.user, set by the login page

_basic = HTTPBasic(auto_error=False)


def get_services(request: Request) -> Services:
    """The app's services (set on `app.state` by `app.py`)."""
    return request.app.state.services


ServicesDep = Annotated["Services", Depends(get_services)]


async def get_current_user(
    request: Request,
    services: ServicesDep,
    credentials: Annotated[HTTPBasicCredentials | None, Depends(_basic)],
) -> User:
    """The user making the request, or 401."""
    async with services.db.read() as s:
        if not services.auth.multi_user:
            user = await accounts.get_user(s, services.auth.local_user_id or 0)
            if user is not None:
                return user
        user_id = _browser_user_id(request)
        if user_id is not None:
            user = await accounts.get_user(s, user_id)
            if user is not None:
                return user
    if credentials is not None:
        try:
            user = await services.logins.authenticate(
                credentials.username, credentials.password, address=client_address(request)
            )
        except accounts.TooManyFailedLogins as exc:
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


async def get_admin_user(user: CurrentUser, services: ServicesDep) -> User:
    """The user making the request if they may change agents (an admin, or `local` in single-user mode), else 403."""
    if not accounts.may_change_agents(user, multi_user=services.auth.multi_user):
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
