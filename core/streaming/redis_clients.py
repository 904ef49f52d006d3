"""The Redis clients of a stream hub: its commands and its followers' blocking reads, on pools of their own.

On one pool, a replica following many streams (one blocking read each) ran out of connections for its appends:
redis-py's limit is 100, and with 80 turns streaming an append failed with "Too many connections".
"""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from core.streaming.redis_scripts import COMMAND_CONNECTIONS, COMMAND_WAIT_S, MAX_FOLLOWED_STREAMS

#: How long connecting to Redis may take before a command fails (Redis out of reach: a turn's events wait).
CONNECT_TIMEOUT_S = 5.0
#: A pooled connection idle this long is checked (PING) before its next command: after an outage the pools hold
#: connections the cut closed, and without the check each would fail one command before it reconnects.
HEALTH_CHECK_S = 1


def hub_clients(url: str, *, command_connections: int = COMMAND_CONNECTIONS) -> tuple[Redis, Redis]:
    """The hub's command client and its followers' client on the Redis at `url` (`RedisStreamHub.from_url`).

    Commands share `command_connections` connections; one waits for a free connection, up to `COMMAND_WAIT_S`.
    """
    commands = Redis(
        connection_pool=BlockingConnectionPool.from_url(
            url,
            decode_responses=True,
            max_connections=command_connections,
            timeout=COMMAND_WAIT_S,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            health_check_interval=HEALTH_CHECK_S,
            # Once more on a fresh connection (a pool's own connections otherwise try once): the health check
            # reconnects a connection a cut closed. `append_at` is safe to repeat; a `create` repeated after
            # a lost answer is refused as busy, as a second send would be.
            retry=Retry(NoBackoff(), 1),
        )
    )
    readers = Redis.from_url(
        url,
        decode_responses=True,
        max_connections=MAX_FOLLOWED_STREAMS,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        health_check_interval=HEALTH_CHECK_S,
    )
    return commands, readers
