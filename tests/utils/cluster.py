"""Two (or more) real `python app.py` replicas in cluster mode on one fresh PostgreSQL database and one Redis.

For tests/test_cluster.py and the benchmarks: `cluster_backends()` makes the run's database and Redis key
prefix (skip, or fail under CI=true, when a server is missing) and removes both at the end;
`start_replicas()` starts replicas side by side (as a deployment would) and waits until each serves.
Each replica has its own `INSTANCE_ID`, `DATA_DIR`, port and `REPLICA_URL`; they share `STORAGE_SECRET`,
`INTERNAL_TOKEN`, `DATABASE_URL` and `REDIS_URL` + `REDIS_KEY_PREFIX` (docs/ARCHITECTURE.md, "Cluster").
"""

from __future__ import annotations

import asyncio
import inspect
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from tests.utils.app_process import ROOT, AppProcess, app_process, child_env
from tests.utils.broker import redis_test_url
from tests.utils.ports import free_port

if TYPE_CHECKING:
    from core.streaming.redis_hub import RedisStreamHub

ADMIN = ("admin", "cluster-test-password-1")
COMMAND_TIMEOUT_S = 60


@dataclass(frozen=True)
class ClusterBackends:
    """Where the replicas keep their state: a database of their own and a Redis key prefix of their own."""

    database_url: str
    redis_url: str
    key_prefix: str
    storage_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    internal_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    def env(self, **extra: str) -> dict[str, str]:
        """The environment every replica shares."""
        return {
            "CLUSTER": "true",
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "REDIS_KEY_PREFIX": self.key_prefix,
            "STORAGE_SECRET": self.storage_secret,
            "INTERNAL_TOKEN": self.internal_token,
            **extra,
        }


def redis_reachable(url: str) -> str | None:
    """None when Redis answers at `url`, else why not."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        client.ping()
        return None
    except Exception as exc:
        return f"Redis is not reachable at {url} (set TEST_REDIS_URL): {exc}"
    finally:
        client.close()


@asynccontextmanager
async def two_redis_hubs(name: str, **options: Any) -> AsyncIterator[tuple[RedisStreamHub, RedisStreamHub]]:
    """Replica A's hub and replica B's (`RedisStreamHub` with `options`) on the test Redis, started, under a key
    prefix of their own that is removed at the end; without Redis the test is skipped (failed under CI).
    """
    from redis.asyncio import Redis

    from core.streaming.redis_hub import RedisStreamHub
    from tests.conftest import unavailable

    url = redis_test_url()
    if (reason := redis_reachable(url)) is not None:
        unavailable(reason)
    prefix = f"a2a-{name}-test-{secrets.token_hex(4)}:"
    hubs = [
        RedisStreamHub(Redis.from_url(url, decode_responses=True), prefix=prefix, owner=owner, **options)
        for owner in ("a", "b")
    ]
    for hub in hubs:
        await hub.start()
    try:
        yield hubs[0], hubs[1]
    finally:
        for hub in hubs:
            await hub.stop()
        delete_prefix(url, prefix)


def delete_prefix(url: str, prefix: str) -> None:
    """Remove every Redis key under `prefix` (a test run's)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=500))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    finally:
        client.close()


@contextmanager
def cluster_backends(postgres_server_url: str) -> Iterator[ClusterBackends]:
    """A fresh PostgreSQL database and Redis key prefix for one run; both removed at the end.

    Raises:
        ConnectionError: PostgreSQL or Redis is not reachable (the message says which and why).
    """
    from tests.conftest import create_postgres_database, drop_postgres_database

    redis_url = redis_test_url()
    problem = redis_reachable(redis_url)
    if problem:
        raise ConnectionError(problem)
    database_url = create_postgres_database(postgres_server_url, prefix="a2a_cluster")
    prefix = f"a2a-cluster-{secrets.token_hex(4)}:"
    try:
        yield ClusterBackends(database_url=database_url, redis_url=redis_url, key_prefix=prefix)
    finally:
        delete_prefix(redis_url, prefix)
        drop_postgres_database(postgres_server_url, database_url)


def add_account(backends: ClusterBackends, data_dir: Path, username: str = ADMIN[0], password: str = ADMIN[1]) -> None:
    """`python app.py users add NAME --admin` against the shared database (it also migrates)."""
    env = child_env(data_dir, APP_USER_PASSWORD=password, DATABASE_URL=backends.database_url)
    done = subprocess.run(
        [sys.executable, "app.py", "users", "add", username, "--admin"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise AssertionError(f"users add failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


# A replica waits on `/login`: cluster mode needs accounts, so `/` redirects there.
REPLICA_START_TIMEOUT_S = 60.0


@dataclass
class Replica:
    """One running replica: its process, URL and instance id."""

    app: AppProcess
    instance_id: str

    @property
    def url(self) -> str:
        return self.app.base_url

    def client(self, **kwargs) -> httpx.AsyncClient:
        """An HTTP client of this replica, logged in as the admin (HTTP Basic)."""
        kwargs.setdefault("timeout", 30)
        return httpx.AsyncClient(base_url=self.url, auth=ADMIN, **kwargs)


@contextmanager
def start_replicas(
    backends: ClusterBackends, base_dir: Path, count: int = 2, *, wait: bool = True, name: str = "replica", **env: str
) -> Iterator[list[Replica]]:
    """Start `count` replicas at the same time (`<name>-1`, ...); each is killed at the end if still running."""
    with ExitStack() as stack:
        replicas = []
        for n in range(count):
            port = free_port()
            instance = f"{name}-{n + 1}"
            url = f"http://127.0.0.1:{port}"
            app = stack.enter_context(
                app_process(
                    base_dir / instance / "data",
                    port=port,
                    **backends.env(INSTANCE_ID=instance, REPLICA_URL=url, PUBLIC_BASE_URL=url, **env),
                )
            )
            replicas.append(Replica(app, instance))
        if wait:
            for replica in replicas:
                replica.app.wait_until_serving(REPLICA_START_TIMEOUT_S, path="/login")
        yield replicas


async def wait_for(check, *, timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "the condition"):
    """Call `check()` (awaited when async) until it returns something truthy; returns it.

    Raises AssertionError after `timeout_s`.
    """
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:g} s")
        await asyncio.sleep(interval_s)
