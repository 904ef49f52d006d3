"""Accounts: users with argon2 password hashes, and the single-user `local` mode.

Without any user that has a password the app runs in single-user mode: every
request acts as the user `local`. That is only allowed while the server binds
to a loopback address (`Settings.is_loopback`); `app.py` refuses to start
otherwise.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from functools import cache

from pwdlib import PasswordHash
from sqlmodel import col, func, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.auth.login_throttle import LoginFailures, RedisLoginFailures
from core.auth.login_throttle import TooManyFailedLoginsError as TooManyFailedLoginsError  # callers catch it from here
from core.errors import AppError
from core.i18n import _
from models import User

LOCAL_USERNAME = "local"
USERNAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MIN_PASSWORD_LENGTH = 8

_hasher = PasswordHash.recommended()


@cache
def _dummy_hash() -> str:
    # Verified when the username is unknown, so a wrong name costs as long as a wrong password.
    return _hasher.hash("not-a-real-password")


class AccountError(AppError, ValueError):
    """A username or password that cannot be accepted; the message says why."""

    code = "account_error"


def hash_password(password: str) -> str:
    """An argon2 hash of `password`."""
    return _hasher.hash(password)


def verify_password(password: str, password_hash: str) -> bool:
    """True when `password` matches `password_hash`."""
    return _hasher.verify(password, password_hash)


async def create_user(session: AsyncSession, *, username: str, password: str, admin: bool = False) -> User:
    """Create a user with a password; the first account is an admin whatever `admin` says.

    Raises:
        AccountError: the name is malformed or taken, or the password is too short.
    """
    if not USERNAME_PATTERN.fullmatch(username):
        raise AccountError(_("a username is 1-64 letters, digits, '.', '_' or '-'"))
    if username == LOCAL_USERNAME:
        reserved = _("{name!r} is reserved for single-user mode; pick another name")
        raise AccountError(reserved.format(name=LOCAL_USERNAME))
    if len(password) < MIN_PASSWORD_LENGTH:
        raise AccountError(_("a password needs at least {count} characters").format(count=MIN_PASSWORD_LENGTH))
    existing = await session.exec(select(User).where(User.username == username))
    if existing.first() is not None:
        raise AccountError(_("the user {name!r} already exists").format(name=username))
    first = not await has_accounts(session)
    user = User(username=username, password_hash=hash_password(password), is_admin=admin or first)
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
        raise AccountError(_("a password needs at least {count} characters").format(count=MIN_PASSWORD_LENGTH))
    user = (await session.exec(select(User).where(User.username == username))).first()
    if user is None or user.password_hash is None:
        raise AccountError(_("there is no user {name!r}").format(name=username))
    user.password_hash = hash_password(password)
    session.add(user)
    await session.commit()
    return user


async def promote(session: AsyncSession, *, username: str) -> User:
    """Make an account an admin (may create, change and delete agents).

    Raises:
        AccountError: no such account.
    """
    user = (await session.exec(select(User).where(User.username == username))).first()
    if user is None or user.password_hash is None:
        raise AccountError(_("there is no user {name!r}").format(name=username))
    user.is_admin = True
    session.add(user)
    await session.commit()
    return user


def may_change_agents(user: User, *, multi_user: bool) -> bool:
    """Whether `user` may create, change or delete agents: admins, and the `local` user of single-user mode."""
    return user.is_admin or not multi_user


async def authenticate(session: AsyncSession, *, username: str, password: str) -> User | None:
    """The user when the name and password match, else None (same cost either way).

    This verifies on the calling thread: for the command line and tests. The server uses `PasswordLogin`.
    """
    user = (await session.exec(select(User).where(User.username == username))).first()
    ok = _verify_or_waste_time(password, user.password_hash if user is not None else None)
    return user if ok and user is not None and is_enabled(user) else None


def is_enabled(user: User) -> bool:
    """False once an admin disabled the account (the admin area): it logs in no more, its logins end."""
    return user.disabled_at is None


def _verify_or_waste_time(password: str, password_hash: str | None) -> bool:
    """`verify_password`; without a hash (unknown name) it checks a dummy, so both cost the same."""
    if password_hash is None:
        verify_password(password, _dummy_hash())
        return False
    return verify_password(password, password_hash)


@dataclass(slots=True)
class _Verified:
    user_id: int
    password_hash: str
    expires_at: float


class PasswordLogin:
    """Checks a username and password for the login page and HTTP Basic, without stalling the server.

    - argon2 runs in a worker thread (about 0.1 s of CPU each; argon2 releases the GIL), never on
      the event loop, so one login does not hold up every other request.
    - A verified credential is remembered for `cache_ttl_s`, keyed by an HMAC of name and password
      under a key that lives only in this process: Basic auth sends the password with every request,
      and verifying it each time would cost a core per ten requests. A changed password hash ends
      the entry at once. The account's row for a remembered credential comes from `account`
      (the server's: `AuthState.account`, the row kept per process and forgotten at each account
      change here, on another replica or from the command line), so a request with Basic
      credentials reads nothing; without `account` it is read each time.
    - Failed attempts are counted per client address and per account over `window_s`; past
      `max_failures` either count, further attempts are refused without checking the password
      (`TooManyFailedLoginsError`) until the oldest failure leaves the window. An attempt counts from
      its start, so parallel guesses are throttled like sequential ones; the same credentials sent
      in parallel share one check. A success clears the account's count, not the address's (an
      attacker's own good login does not reset its budget). The counts are `failures`: this
      process's (`LoginFailures`), or in a cluster every replica's in Redis (`RedisLoginFailures`,
      core/auth/login_throttle.py).

    Args:
        read_session: opens a read-only unit of work (`Database.read`). On SQLite a `Database.session`
            waits its turn behind every write of the process (the turns' saves): with Basic auth every
            request checks its caller, and 50 sends at once waited for one another's writes to do so.
        account: the account's row by id, for a remembered credential (default: read with `read_session`
            each time). The server passes `AuthState.account`, so a turn start (its send and its stream)
            no longer reads the caller's row twice (issue 41).
        max_failures: failures allowed per address and per account within `window_s`.
        window_s: how long a failure counts.
        cache_ttl_s: how long a verified credential is remembered.
        clock: monotonic seconds (tests pass their own).
        failures: where failures are counted (default: in this process, with the limits above).
    """

    CACHE_MAX = 1024

    def __init__(
        self,
        read_session: Callable[[], AbstractAsyncContextManager[AsyncSession]],
        *,
        max_failures: int = 10,
        window_s: float = 300.0,
        cache_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        failures: LoginFailures | RedisLoginFailures | None = None,
        account: Callable[[int], Awaitable[User | None]] | None = None,
    ) -> None:
        self._read = read_session
        self.account = account or self._read_account
        self.max_failures = max_failures
        self.window_s = window_s
        self.cache_ttl_s = cache_ttl_s
        self._clock = clock
        self._cache_key = secrets.token_bytes(32)
        self._verified: OrderedDict[bytes, _Verified] = OrderedDict()
        self._checking: dict[bytes, asyncio.Future[User | None]] = {}
        self.failures = failures or LoginFailures(max_failures=max_failures, window_s=window_s, clock=clock)

    async def authenticate(self, username: str, password: str, *, address: str) -> User | None:
        """The user when the name and password match, else None.

        Raises:
            TooManyFailedLoginsError: the address or the account has failed too often lately.
        """
        now = self._clock()
        keys = (f"address:{address}", f"account:{username}")
        token = hmac.new(self._cache_key, f"{username}\0{password}".encode(), hashlib.sha256).digest()
        cached = self._verified.get(token)
        if cached is not None and cached.expires_at > now:
            user = await self.account(cached.user_id)
            if (
                user is not None
                and user.username == username
                and user.password_hash == cached.password_hash
                and is_enabled(user)
            ):
                return user
            self._verified.pop(token, None)
        check = self._checking.get(token)
        if check is None:  # the same credentials in parallel (a script's burst) share one check
            check = asyncio.ensure_future(self._check(username, password, token, keys))
            self._checking[token] = check
            check.add_done_callback(lambda done: self._check_ended(token, done))
        return await asyncio.shield(check)

    async def _read_account(self, user_id: int) -> User | None:
        async with self._read() as s:
            return await s.get(User, user_id)

    async def _check(self, username: str, password: str, token: bytes, keys: tuple[str, str]) -> User | None:
        # Counted as a failure until it succeeds: parallel guesses are throttled as a sequence would be.
        attempt = await self.failures.begin(keys)
        async with self._read() as s:
            user = (await s.exec(select(User).where(User.username == username))).first()
        stored_hash = user.password_hash if user is not None else None
        # Outside the database session: this takes ~0.1 s of CPU.
        ok = await asyncio.to_thread(_verify_or_waste_time, password, stored_hash)
        if not ok or user is None or user.id is None or stored_hash is None:  # (a stored row has its id)
            return None
        if not is_enabled(user):  # the same answer as a wrong password: a disabled account is not told apart
            return None
        await self.failures.succeeded(attempt)
        self._verified[token] = _Verified(user.id, stored_hash, self._clock() + self.cache_ttl_s)
        while len(self._verified) > self.CACHE_MAX:
            self._verified.popitem(last=False)
        return user

    def _check_ended(self, token: bytes, done: asyncio.Future[User | None]) -> None:
        self._checking.pop(token, None)
        if not done.cancelled():
            done.exception()  # retrieved: a refusal whose callers all went away is not logged as unhandled

    async def close(self) -> None:
        """Release what the counts hold (a Redis client in a cluster)."""
        await self.failures.close()


async def has_accounts(session: AsyncSession) -> bool:
    """True when at least one user can log in with a password (multi-user mode)."""
    count = await session.exec(select(func.count()).select_from(User).where(col(User.password_hash).is_not(None)))
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
