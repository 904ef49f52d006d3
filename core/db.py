"""The database: one async engine per process, migrations on open, short sessions.

SQLite (`./data/app.db`, WAL mode) is the embedded default; `DATABASE_URL`
selects PostgreSQL. Schema changes go only through Alembic (`models/migrations`);
`Database.open()` upgrades to head before anything else touches the tables.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, Integer, bindparam, create_engine, event, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, NullPool, StaticPool
from sqlmodel.ext.asyncio.session import AsyncSession
from sqlmodel.orm.session import Session as SyncSession

from core.sqlite_connection import OneTripConnection, async_creator

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "models" / "migrations"
# PostgreSQL advisory lock keys (one number space per database; docs/ARCHITECTURE.md, "Cluster").
MIGRATION_LOCK_KEY = 180_001  # migrations and seeding: one replica at a time
REAPER_LOCK_KEY = 180_002  # the periodic reaper of expired leases: one replica at a time
RUNNING_WORK_LOCK_KEY = 180_003  # with a user id: one user's starts of turns and tasks, one at a time (limits)


def sync_url(url: str) -> str:
    """The URL with a synchronous driver (for Alembic): pysqlite or psycopg."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        return u.set(drivername="sqlite").render_as_string(hide_password=False)
    if u.get_backend_name() == "postgresql":
        return u.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return url


def async_url(url: str) -> str:
    """The URL with an asyncio driver: aiosqlite or psycopg (v3 is async-capable)."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        return u.set(drivername="sqlite+aiosqlite").render_as_string(hide_password=False)
    if u.get_backend_name() == "postgresql":
        return u.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return url


def _is_memory_sqlite(url: str) -> bool:
    u = make_url(url)
    return u.get_backend_name() == "sqlite" and u.database in (None, "", ":memory:")


def _sqlite_pragmas(dbapi_conn: Any, _record: ConnectionPoolEntry) -> None:
    cursor = dbapi_conn.cursor()
    # WAL lets the page read while a turn writes; foreign keys are off by default in SQLite.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


def _sqlite_manual_transactions(dbapi_conn: Any, _record: ConnectionPoolEntry) -> None:
    # The driver's own implicit BEGIN is deferred; we issue ours (below).
    dbapi_conn.isolation_level = None


def _sqlite_begin_immediate(conn: Connection) -> None:
    # A deferred transaction that reads and then writes fails at once with "database is locked"
    # when another connection committed in between (WAL snapshot upgrade; busy_timeout does not
    # apply). Taking the write lock at BEGIN makes concurrent writers wait their turn instead.
    # Within this process `Database.session` already takes turns; this covers other processes
    # (the `users` CLI while the server runs), within busy_timeout.
    # A read (`Database.read`) begins deferred: in WAL mode it never takes the write lock.
    begin = "BEGIN" if conn.get_execution_options().get(_READ_ONLY) else "BEGIN IMMEDIATE"
    # Sent with the transaction's first statement: one trip to the driver's thread less.
    # The driver connection of a SQLite engine is always ours (`async_creator`).
    cast("OneTripConnection", conn.connection.driver_connection).begin_with_next_statement(begin)


#: The execution option that marks the connections of `Database.read`.
_READ_ONLY = "app_read_only"


class _ReadOnlySession(SyncSession):
    """The sessions of `Database.read`: flushing a change raises.

    The listener is on the class, registered once: one added to each session cost about 25 µs,
    and every request opens one.
    """


@event.listens_for(_ReadOnlySession, "before_flush")
def _refuse_writes(session: SyncSession, _flush_context: Any, _instances: Any) -> None:
    if session.new or session.dirty or session.deleted:
        raise RuntimeError(
            "a read (Database.read) tried to write: use Database.session for a unit of work that changes rows"
        )


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at our scripts and at `url`."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["sync_url"] = sync_url(url)
    return cfg


# The task that holds a SQLite unit of work, in its context (see `Database.session`). Child tasks
# inherit the value but are other tasks, so they simply wait their turn.
_in_sqlite_session: contextvars.ContextVar[asyncio.Task[Any] | None] = contextvars.ContextVar(
    "in_sqlite_session", default=None
)


#: Built once: a `text()` parses its SQL for parameters each time it is made (issue 41: a cluster's turn starts).
_ADVISORY_XACT_LOCK = text("SELECT pg_advisory_xact_lock(:key, :sub)").bindparams(
    bindparam("key", type_=Integer), bindparam("sub", type_=Integer)
)


class Database:
    """Owns the engine. `open()` creates the SQLite folder and runs migrations."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect = make_url(url).get_backend_name()
        self.engine: AsyncEngine = self._make_async_engine()
        # The same pool. Its connections begin deferred on SQLite (`_sqlite_begin_immediate`). On PostgreSQL
        # they are in autocommit: a read's statements each see what was committed before they ran, as they
        # would in a READ COMMITTED transaction, without its BEGIN and ROLLBACK (two round trips of three
        # for a request's check of its caller; issue 41).
        self._read_engine = (
            self.engine.execution_options(**{_READ_ONLY: True})
            if self.dialect == "sqlite"
            else self.engine.execution_options(isolation_level="AUTOCOMMIT")
            if self.dialect == "postgresql"
            else self.engine
        )
        self._turn_lock: asyncio.Lock | None = None
        self._turn_loop: asyncio.AbstractEventLoop | None = None

    def _make_async_engine(self) -> AsyncEngine:
        kwargs: dict[str, Any] = {}
        if self.dialect == "sqlite":
            # aiosqlite, with one trip to its thread per statement instead of four (core/sqlite_connection.py).
            kwargs["async_creator"] = async_creator(make_url(async_url(self.url)), {"check_same_thread": False})
            if _is_memory_sqlite(self.url):
                kwargs["poolclass"] = StaticPool  # one shared in-memory database across connections
        engine = create_async_engine(async_url(self.url), **kwargs)
        if self.dialect == "sqlite":
            event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
            event.listen(engine.sync_engine, "connect", _sqlite_manual_transactions)
            event.listen(engine.sync_engine, "begin", _sqlite_begin_immediate)
        return engine

    def _make_sync_engine(self) -> Engine:
        engine = create_engine(sync_url(self.url), poolclass=NullPool)
        if self.dialect == "sqlite":
            event.listen(engine, "connect", _sqlite_pragmas)
        return engine

    def migrate(self) -> None:
        """Upgrade the schema to the newest migration (blocking; call before serving)."""
        if self.dialect == "sqlite" and not _is_memory_sqlite(self.url):
            db_path = make_url(self.url).database
            if db_path:
                Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        if _is_memory_sqlite(self.url):
            raise ValueError("an in-memory SQLite database cannot be migrated separately; use a file")
        engine = self._make_sync_engine()
        try:
            with engine.begin() as conn:
                if self.dialect == "postgresql":
                    # Replicas started together: one upgrades, the others wait here, then find the schema at head.
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
                cfg = alembic_config(self.url)
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
        finally:
            engine.dispose()
        log.info("database ready (%s)", make_url(self.url).render_as_string(hide_password=True))

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """A short unit of work. Commit explicitly; the session closes on exit.

        On SQLite the units of work of this process take turns (FIFO, on the event loop):
        SQLite has one writer at a time, and waiting here is fair and has no timeout,
        where waiting in SQLite's busy handler is neither (100 concurrent delegations
        hit "database is locked" without it). Never open a session inside another.
        """
        if self.dialect != "sqlite":
            async with AsyncSession(self.engine, expire_on_commit=False) as session:
                yield session
            return
        me = asyncio.current_task()
        if _in_sqlite_session.get() is me:
            raise RuntimeError(
                "a database session was opened inside another one; on SQLite that would wait "
                "forever for itself: finish the outer unit of work first"
            )
        token = _in_sqlite_session.set(me)
        try:
            async with self._sqlite_turn(), AsyncSession(self.engine, expire_on_commit=False) as session:
                yield session
        finally:
            _in_sqlite_session.reset(token)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        """A read-only unit of work: no writes (flushing a change raises).

        On SQLite a consistent snapshot (one deferred transaction); on PostgreSQL each statement
        sees what was committed before it ran (autocommit: the READ COMMITTED the writes use, without
        a BEGIN and a ROLLBACK around the reads).

        On SQLite it does not take a turn (`session`): in WAL mode readers neither wait for the
        writer nor hold it up, so the checks every request makes (who is calling, do they own
        this chat) stop queueing behind the turns' writes. It never waits for a `session`, so
        it may be opened inside one (it sees what was committed, not the outer one's changes).
        """
        async with AsyncSession(
            self._read_engine, expire_on_commit=False, sync_session_class=_ReadOnlySession
        ) as session:
            yield session

    @asynccontextmanager
    async def single_statement(self) -> AsyncIterator[AsyncSession]:
        """A unit of work that writes with one statement: on PostgreSQL in autocommit, elsewhere a `session`.

        On PostgreSQL the statement is its own transaction, without the BEGIN and COMMIT round trips around
        it (issue 41); each further statement would commit on its own, so use it only where the unit's
        writes are one statement there (`answers.answer_in_place`). Commit as after a `session` (in
        autocommit nothing is left to commit).
        """
        if self.dialect != "postgresql":
            async with self.session() as session:
                yield session
            return
        # The engine of `read` (autocommit on PostgreSQL), with sessions that may write.
        async with AsyncSession(self._read_engine, expire_on_commit=False) as session:
            yield session

    def _sqlite_turn(self) -> asyncio.Lock:
        # One lock per event loop: `Services.prepare` runs on a loop of its own before serving.
        loop = asyncio.get_running_loop()
        if self._turn_lock is None or self._turn_loop is not loop:
            self._turn_lock, self._turn_loop = asyncio.Lock(), loop
        return self._turn_lock

    async def lock_for_transaction(self, session: AsyncSession, key: int, *subs: int) -> None:
        """Take PostgreSQL's advisory locks (`key`, each of `subs`, in that order) until `session`'s transaction ends.

        Several in one round trip (psycopg pipelines the statement run for each).

        Elsewhere than on PostgreSQL nothing is needed: SQLite's units of work of this process
        already take turns (`session`), and SQLite is one process.
        """
        if self.dialect == "postgresql":
            locks = [{"key": key, "sub": sub} for sub in subs]
            await session.exec(_ADVISORY_XACT_LOCK, params=locks[0] if len(locks) == 1 else locks)  # type: ignore[call-overload]

    @asynccontextmanager
    async def advisory_lock(self, key: int, *, wait: bool = True) -> AsyncIterator[bool]:
        """Hold PostgreSQL's session advisory lock `key` on a connection of its own; yields whether it is held.

        `wait=False` tries once (another replica holds it: yields False at once). Elsewhere than on
        PostgreSQL there is one process, so the lock is always held.
        """
        if self.dialect != "postgresql":
            yield True
            return
        async with self.engine.connect() as conn:
            function = "pg_advisory_lock" if wait else "pg_try_advisory_lock"
            held = (await conn.execute(text(f"SELECT {function}(:key)"), {"key": key})).scalar()
            await conn.commit()
            held = True if held is None else bool(held)  # pg_advisory_lock returns void
            try:
                yield held
            finally:
                if held:
                    await conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
                    await conn.commit()

    async def close(self) -> None:
        """Dispose of the engine's connections."""
        await self.engine.dispose()


def describe_database(url: str) -> str:
    """`SQLite /path/app.db` or `postgresql on host:port/name`: where the data is, never a password."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return f"SQLite {Path(parsed.database).resolve()}" if parsed.database else "SQLite in memory"
    where = f"{parsed.host or 'localhost'}{f':{parsed.port}' if parsed.port else ''}/{parsed.database or ''}"
    return f"{parsed.get_backend_name()} on {where}"
