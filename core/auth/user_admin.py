"""What an admin does to accounts in the admin area (issue 39): list, create, promote, disable, reset a password.

The rules keep the app administrable: nobody demotes or disables their own account from the browser, and
the last enabled admin stays an enabled admin (the command line, `python app.py users`, stays the way back
in). A disabled account logs in no more (`accounts.is_enabled`): the login page and HTTP Basic answer as
for a wrong password, and its browser logins end at their next request.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement
from sqlmodel import col, func, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.auth import accounts
from core.errors import AppError
from core.i18n import _
from models import User, utcnow

__all__ = [
    "AccountRuleError",
    "AccountView",
    "UnknownAccountError",
    "admin_ids",
    "create_account",
    "disabled_ids",
    "list_accounts",
    "reset_password",
    "set_admin",
    "set_disabled",
]


class UnknownAccountError(AppError, LookupError):
    """No account with that id (the `local` user of single-user mode is not an account)."""

    code = "account_not_found"


class AccountRuleError(AppError, ValueError):
    """A change that would leave the app without an enabled admin, or lock the admin out of their own account."""

    code = "account_rule"


@dataclass(frozen=True, slots=True)
class AccountView:
    """An account as the admin area shows it (never its password hash)."""

    id: int
    username: str
    admin: bool
    disabled: bool
    created_at: datetime
    disabled_at: datetime | None

    @classmethod
    def of(cls, user: User) -> AccountView:
        """The view of a stored account."""
        assert user.id is not None, "a stored account has its id"
        disabled = user.disabled_at is not None
        return cls(user.id, user.username, user.is_admin, disabled, user.created_at, user.disabled_at)

    def as_json(self) -> dict[str, object]:
        """The API's JSON of it."""
        return {
            "id": self.id,
            "username": self.username,
            "admin": self.admin,
            "disabled": self.disabled,
            "createdAt": self.created_at.isoformat(),
            "disabledAt": self.disabled_at.isoformat() if self.disabled_at else None,
        }


def _is_account() -> ColumnElement[bool]:
    """An account: a user who logs in with a password (not `local`)."""
    return col(User.password_hash).is_not(None)


async def list_accounts(session: AsyncSession) -> list[AccountView]:
    """Every account that logs in with a password, by name."""
    rows = await session.exec(select(User).where(_is_account()).order_by(User.username))
    return [AccountView.of(user) for user in rows.all()]


async def create_account(session: AsyncSession, *, username: str, password: str, admin: bool) -> AccountView:
    """A new account (the rules of `accounts.create_user`: name, free, password length).

    Raises:
        accounts.AccountError: the name is malformed or taken, or the password is too short.
    """
    return AccountView.of(await accounts.create_user(session, username=username, password=password, admin=admin))


async def _account(session: AsyncSession, user_id: int) -> User:
    user = await session.get(User, user_id)
    if user is None or user.password_hash is None:
        raise UnknownAccountError(_("There is no such account."))
    return user


async def _other_enabled_admins(session: AsyncSession, user_id: int) -> int:
    query = (
        select(func.count())
        .select_from(User)
        .where(
            _is_account(),
            col(User.is_admin).is_(True),
            col(User.disabled_at).is_(None),
            col(User.id) != user_id,
        )
    )
    return (await session.exec(query)).one()


async def set_admin(session: AsyncSession, *, actor_id: int, user_id: int, admin: bool) -> AccountView:
    """Promote an account to admin, or make an admin a plain user again.

    Raises:
        UnknownAccountError: no such account.
        AccountRuleError: the admin demotes themselves, or the last enabled admin.
    """
    user = await _account(session, user_id)
    if not admin and user.is_admin:
        if user_id == actor_id:
            raise AccountRuleError(_("You cannot take away your own admin rights; another admin can."))
        if user.disabled_at is None and not await _other_enabled_admins(session, user_id):
            raise AccountRuleError(_("This is the last enabled admin; make another account an admin first."))
    user.is_admin = admin
    session.add(user)
    await session.commit()
    return AccountView.of(user)


async def set_disabled(session: AsyncSession, *, actor_id: int, user_id: int, disabled: bool) -> AccountView:
    """Disable an account (it logs in no more, its logins end) or enable it again.

    Raises:
        UnknownAccountError: no such account.
        AccountRuleError: the admin disables themselves, or the last enabled admin.
    """
    user = await _account(session, user_id)
    if disabled and user.disabled_at is None:
        if user_id == actor_id:
            raise AccountRuleError(_("You cannot disable your own account; another admin can."))
        if user.is_admin and not await _other_enabled_admins(session, user_id):
            raise AccountRuleError(_("This is the last enabled admin; make another account an admin first."))
        user.disabled_at = utcnow()
    elif not disabled:
        user.disabled_at = None
    session.add(user)
    await session.commit()
    return AccountView.of(user)


async def reset_password(session: AsyncSession, *, user_id: int, password: str) -> AccountView:
    """Give an account a new password (its other logins by password stop working at once).

    Raises:
        UnknownAccountError: no such account.
        accounts.AccountError: the password is too short.
    """
    user = await _account(session, user_id)
    return AccountView.of(await accounts.set_password(session, username=user.username, password=password))


async def disabled_ids(session: AsyncSession) -> set[int]:
    """The ids of the disabled accounts (the pages refuse their browser logins)."""
    rows = await session.exec(select(User.id).where(col(User.disabled_at).is_not(None)))
    return {user_id for user_id in rows.all() if user_id is not None}


async def admin_ids(session: AsyncSession) -> set[int]:
    """The ids of the enabled admins (the navigation shows them the admin area)."""
    rows = await session.exec(select(User.id).where(col(User.is_admin).is_(True), col(User.disabled_at).is_(None)))
    return {user_id for user_id in rows.all() if user_id is not None}
