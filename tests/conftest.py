"""Shared fixtures: isolated settings, a real database (SQLite file and PostgreSQL), services.

PostgreSQL: `TEST_POSTGRES_URL` (default postgresql://postgres@127.0.0.1:5432/test) names a server
and a maintenance database; the run creates its own database on it and drops it at the end. Without
a reachable server the PostgreSQL cases skip with the reason, except under `CI=true`, where they fail.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from core.services import Services
from core.settings import Settings

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# Settings the tests must not inherit from the developer's shell.
_APP_ENV_VARS = [
    "HOST",
    "PORT",
    "DATABASE_URL",
    "DATA_DIR",
    "REDIS_URL",
    "REDIS_HOST",
    "REDIS_PORT",
    "REDIS_DB",
    "REDIS_PASSWORD",
    "AUTH_MODE",
    "DEFAULT_MODEL",
    "DEMO_MODEL_DELAY_MS",
    "LLM_API_BASE",
    "LLM_API_KEY",
    "STORAGE_SECRET",
    "PUBLIC_BASE_URL",
    "BLACKLIST_IP",
    "TRUSTED_HOSTS",
    "OUTBOUND_ALLOW_HOSTS",
]


def unavailable(reason: str) -> None:
    """Skip (on a developer's machine) or fail (under CI) a test whose server is missing."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing server is a failure, not a skip)")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test gets its own data dir and no config file or `.env` from the working tree."""
    for name in _APP_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CONFIG_FILE", str(tmp_path / "no-config.json"))
    monkeypatch.setenv("ENV_FILE", str(tmp_path / "no.env"))
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DEMO_MODEL_DELAY_MS", "0")
    # NiceGUI's User fixture talks to the app as http://test; the app answers only to names it knows.
    monkeypatch.setenv("TRUSTED_HOSTS", "test")
    yield tmp_path


# -- PostgreSQL ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """The maintenance URL of the PostgreSQL server the tests may use."""
    return os.environ.get("TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)


def create_postgres_database(server_url: str, prefix: str = "a2a_test") -> str:
    """Create a new, empty database on the server; returns its URL.

    Raises:
        ConnectionError: the server cannot be reached.
    """
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(_psycopg(server_url), isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # any driver error means: no usable server
        raise ConnectionError(
            f"PostgreSQL at {make_url(server_url).render_as_string()} is not reachable: {exc}"
        ) from exc
    finally:
        admin.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_postgres_database(server_url: str, url: str) -> None:
    """Drop a database made by `create_postgres_database` (closing its connections first)."""
    name = make_url(url).database
    admin = create_engine(_psycopg(server_url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _psycopg(url: str) -> str:
    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_run_database(postgres_server_url: str) -> Iterator[str | None]:
    """One database for this whole test run (None when the server is unreachable)."""
    try:
        url = create_postgres_database(postgres_server_url)
    except ConnectionError:
        yield None
        return
    try:
        yield url
    finally:
        drop_postgres_database(postgres_server_url, url)


@pytest.fixture
def postgres_url(postgres_run_database: str | None, postgres_server_url: str) -> Iterator[str]:
    """The run's PostgreSQL database, emptied for this test."""
    if postgres_run_database is None:
        unavailable(f"PostgreSQL is not reachable at {postgres_server_url} (set TEST_POSTGRES_URL)")
    _truncate_all(postgres_run_database)
    yield postgres_run_database


def _truncate_all(url: str) -> None:
    engine = create_engine(_psycopg(url))
    try:
        with engine.begin() as conn:
            tables = (
                conn.execute(
                    text(
                        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename != 'alembic_version'"
                    )
                )
                .scalars()
                .all()
            )
            if tables:
                quoted = ", ".join(f'"{t}"' for t in tables)
                conn.execute(text(f"TRUNCATE {quoted} RESTART IDENTITY CASCADE"))
    finally:
        engine.dispose()


# -- the database under test, on both engines ------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated-on-demand database URL: a SQLite file, then the run's PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'app.db'}"
    return request.getfixturevalue("postgres_url")


def make_settings(tmp_path: Path, **overrides) -> Settings:
    """Settings for a test: its own data dir, no files, the demo model without delay."""
    values = {
        "data_dir": tmp_path / "data",
        "demo_model_delay_ms": 0,
        "broker_dispatch_token": "test-dispatch-token",  # tests/utils/broker.py DISPATCH_TOKEN
        **overrides,
    }
    return Settings(_env_file=None, **values)


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    """Test settings on the parametrised database."""
    return make_settings(tmp_path, database_url=database_url)


@pytest.fixture
async def services(settings: Settings) -> AsyncIterator[Services]:
    """The app's services, migrated and seeded, on the parametrised database."""
    built = Services.build(settings)
    built.prepare()
    await built.start()
    try:
        yield built
    finally:
        await built.stop()


# -- the SSE test server (tests/test_sse_harness.py), shared by the SSE and task-manager tests ----


@pytest.fixture(scope="module")
def server():
    """One SSE test server per test module."""
    from tests.test_sse_harness import sse_server

    with sse_server() as running:
        yield running


@pytest.fixture
async def client(server):
    """An HTTP client of that server."""
    import httpx

    async with httpx.AsyncClient(base_url=server.url, timeout=5) as c:
        yield c
