"""Accounts: users with argon2 password hashes, and the single-user `local` mode.

Without any user that has a password the app runs in single-user mode: every
request acts as the user `local`. That is only allowed while the server binds
to a loopback address (`Settings.is_loopback`); `app.py` refuses to start
otherwise.
"""

from __future__ import annotations

import re
from functools import cache

from pwdlib import PasswordHash
from sqlmodel import func, select
from sqlmodel.ext.asyncio.session import AsyncSession

from models import User

LOCAL_USERNAME = "local"
USERNAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MIN_PASSWORD_LENGTH = 8

_hasher = PasswordHash.recommended()


@cache
def _dummy_hash() -> str:
    # Verified when the username is unknown, so a wrong name costs as long as a wrong password.
    return _hasher.hash("not-a-real-password")


class AccountError(ValueError):
    """A username or password that cannot be accepted; the message says why."""


def hash_password(password: str) -> str:
    """An argon2 hash of `password`."""
    return _hasher.hash(password)


def verify_password(password: str, password_hash: str) -> bool:
    """True when `password` matches `password_hash`."""
    return _hasher.verify(password, password_hash)


async def create_user(session: AsyncSession, *, username: str, password: str) -> User:
    """Create a user with a password.

    Raises:
        AccountError: the name is malformed or taken, or the password is too short.
    """
    if not USERNAME_PATTERN.fullmatch(username):
        raise AccountError("a username is 1-64 letters, digits, '.', '_' or '-'")
    if username == LOCAL_USERNAME:
        raise AccountError(f"{LOCAL_USERNAME!r} is reserved for single-user mode; pick another name")
    if len(password) < MIN_PASSWORD_LENGTH:
        raise AccountError(f"a password needs at least {MIN_PASSWORD_LENGTH} characters")
    existing = await session.exec(select(User).where(User.username == username))
    if existing.first() is not None:
        raise AccountError(f"the user {username!r} already exists")
    user = User(username=username, password_hash=hash_password(password))
    session.add(user)
    await session.commit()
    await session.refresh(user)
    return user


async def set_password(session: AsyncSession, *, username: str, password: str) -> User:
    """Replace a user's password.

    Raises:
        AccountError: no such user, or the password is too short.
    """
    if len(password) < MIN_PASSWORD_LENGTH:
        raise AccountError(f"a password needs at least {MIN_PASSWORD_LENGTH} characters")
    user = (await session.exec(select(User).where(User.username == username))).first()
    if user is None or user.password_hash is None:
        raise AccountError(f"there is no user {username!r}")
    user.password_hash = hash_password(password)
    session.add(user)
    await session.commit()
    return user


async def authenticate(session: AsyncSession, *, username: str, password: str) -> User | None:
    """The user when the name and password match, else None (same cost either way)."""
    user = (await session.exec(select(User).where(User.username == username))).first()
    if user is None or user.password_hash is None:
        verify_password(password, _dummy_hash())
        return None
    return user if verify_password(password, user.password_hash) else None


async def has_accounts(session: AsyncSession) -> bool:
    """True when at least one user can log in with a password (multi-user mode)."""
    count = await session.exec(select(func.count()).select_from(User).where(User.password_hash.is_not(None)))
    return count.one() > 0


async def ensure_local_user(session: AsyncSession) -> User:
    """The `local` user of single-user mode, created on first use."""
    user = (await session.exec(select(User).where(User.username == LOCAL_USERNAME))).first()
    if user is None:
        user = User(username=LOCAL_USERNAME, password_hash=None)
        session.add(user)
        await session.commit()
        await session.refresh(user)
    return user


async def get_user(session: AsyncSession, user_id: int) -> User | None:
    """The user with that id, or None."""
    return await session.get(User, user_id)


async def list_users(session: AsyncSession) -> list[User]:
    """Every user, by name."""
    return list((await session.exec(select(User).order_by(User.username))).all())
