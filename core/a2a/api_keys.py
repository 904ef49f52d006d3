"""API keys: how A2A clients outside the app authenticate on `POST /a2a/agents/{id}`.

A key is shown once, when it is created; the database keeps only its SHA-256.
A plain hash is enough here, unlike passwords (argon2 in `core/auth/accounts.py`):
a key is 32 random bytes, so there is nothing to guess that a slow hash would
protect, and every JSON-RPC request verifies one, which argon2 would make cost
tens of milliseconds.

A key acts for the user who created it: tasks started with it belong to that
user (they appear in that user's audit view), and `GetTask`/`CancelTask` see
only that user's tasks. Revoking a key takes effect on the next request.

Single-user mode (no accounts, loopback only) does not waive keys: the JSON-RPC
endpoint is the one surface meant for other programs, and a loopback address is
still reachable by every local process and by any browser page (DNS rebinding),
so a key is required there too. Keys made in that mode belong to the `local` user.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.errors import AppError
from models import ApiKey, utcnow

if TYPE_CHECKING:
    from core.db import Database

KEY_PREFIX = "a2ak_"
SHOWN_PREFIX_CHARS = 12
MAX_NAME_CHARS = 100
# `last_used_at` is written at most this often per key, so a busy client does not cost a write per request.
LAST_USED_RESOLUTION = timedelta(seconds=60)


class ApiKeyError(AppError, ValueError):
    """A key definition that cannot be accepted; the message says why."""

    code = "api_key_error"


def hash_key(key: str) -> str:
    """The stored form of a key: its SHA-256 in hex."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


async def create_key(session: AsyncSession, *, user_id: int, name: str) -> tuple[ApiKey, str]:
    """Create a key for `user_id`; returns the row and the key itself (its only appearance).

    Raises:
        ApiKeyError: the name is empty or too long.
    """
    name = name.strip()
    if not name:
        raise ApiKeyError("give the key a name, such as the program that will use it")
    if len(name) > MAX_NAME_CHARS:
        raise ApiKeyError(f"a key name has at most {MAX_NAME_CHARS} characters")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(user_id=user_id, name=name, prefix=key[:SHOWN_PREFIX_CHARS], key_hash=hash_key(key))
    session.add(row)
    await session.commit()
    await session.refresh(row)
    return row, key


async def list_keys(session: AsyncSession, *, user_id: int) -> list[ApiKey]:
    """The user's keys, revoked ones included, newest first."""
    query = (
        select(ApiKey).where(ApiKey.user_id == user_id).order_by(col(ApiKey.created_at).desc(), col(ApiKey.id).desc())
    )
    return list((await session.exec(query)).all())


async def revoke_key(session: AsyncSession, *, user_id: int, key_id: int) -> bool:
    """Revoke one of the user's keys; False when the user has no such key (or it was revoked already)."""
    row = await session.get(ApiKey, key_id)
    if row is None or row.user_id != user_id or row.revoked_at is not None:
        return False
    row.revoked_at = utcnow()
    session.add(row)
    await session.commit()
    return True


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, or None (absent, another scheme, empty)."""
    scheme, _, token = (authorization or "").partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


async def authenticate_key(session: AsyncSession, key: str) -> ApiKey | None:
    """The live key row for a presented key, or None (unknown, malformed or revoked); notes its use when due."""
    row = await _live_key(session, key)
    if row is not None and _use_worth_noting(row):
        row.last_used_at = utcnow()
        session.add(row)
        await session.commit()
    return row


async def authenticate(db: Database, key: str) -> ApiKey | None:
    """`authenticate_key` for a request: a read, and a write only when the key's last use is worth noting.

    Every JSON-RPC call presents a key; read in `Database.read`, the check does not queue behind
    the turns' writes on SQLite. `last_used_at` is written at most once a `LAST_USED_RESOLUTION`.
    """
    async with db.read() as s:
        row = await _live_key(s, key)
    if row is None or not _use_worth_noting(row):
        return row
    async with db.session() as s:
        return await authenticate_key(s, key)


async def _live_key(session: AsyncSession, key: str) -> ApiKey | None:
    if not key.startswith(KEY_PREFIX) or len(key) > 200:
        return None
    row = (await session.exec(select(ApiKey).where(ApiKey.key_hash == hash_key(key)))).first()
    return None if row is None or row.revoked_at is not None else row


class ApiKeys:
    """Users' API keys as the page and the REST API manage them: each call is its own transaction.

    Pages and routes hold this, not the database: they say what to do with a user's keys, and
    the session each step needs is opened here.
    """

    def __init__(self, db: Database) -> None:
        """Keys in `db`."""
        self.db = db

    async def list_keys(self, *, user_id: int) -> list[ApiKey]:
        """The user's keys, revoked ones included, newest first."""
        async with self.db.session() as s:
            return await list_keys(s, user_id=user_id)

    async def create_key(self, *, user_id: int, name: str) -> tuple[ApiKey, str]:
        """Create a key for `user_id`; returns the row and the key itself (its only appearance).

        Raises:
            ApiKeyError: the name is empty or too long.
        """
        async with self.db.session() as s:
            return await create_key(s, user_id=user_id, name=name)

    async def revoke_key(self, *, user_id: int, key_id: int) -> bool:
        """Revoke one of the user's keys; False when the user has no such key (or it was revoked already)."""
        async with self.db.session() as s:
            return await revoke_key(s, user_id=user_id, key_id=key_id)

    async def authenticate(self, key: str) -> ApiKey | None:
        """The live key row for a presented key, or None; see the module's `authenticate`."""
        return await authenticate(self.db, key)


def _use_worth_noting(row: ApiKey) -> bool:
    return row.last_used_at is None or utcnow() - row.last_used_at >= LAST_USED_RESOLUTION
