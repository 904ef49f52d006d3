"""Commands the hub packs itself, sent together on a connection of its redis-py client's pool (issue 41).

redis-py's pipeline encodes every argument of every command in Python (`Connection.pack_command`) and reads each
reply under an asyncio timeout of its own: about 50 µs of the client's CPU per `XADD` on this machine, for a
token that costs one process (the in-memory hub) a few hundred µs in all. The owner's appends are therefore
packed here (`pack_command`, `bulk`) and their replies read under one timeout for the batch (`call_packed`), on
one of the pool's connections through redis-py's own `send_packed_command` / `read_response`, so
authentication, TLS, the database, the health check, reconnects and the retry stay redis-py's
(docs/ARCHITECTURE.md, "Cluster").
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


def bulk(arg: bytes) -> bytes:
    """One argument in RESP: `$<len>` CRLF `<arg>` CRLF."""
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


def pack_command(args: Sequence[bytes]) -> bytes:
    """One command in RESP, as Redis reads it: `*<n>` CRLF, then each argument as `bulk` packs it."""
    return b"*%d\r\n" % len(args) + b"".join([b"$%d\r\n%s\r\n" % (len(arg), arg) for arg in args])


async def call_packed(redis: Redis, packed: bytes, replies: int) -> list[Any]:
    """Send `packed` (`replies` commands, as `pack_command` packs them) in one write; their replies, in order.

    They go on a connection of `redis`'s pool. An error reply comes back as its `ResponseError` (read whole: the
    connection stays in step) in its place. The replies are read under one timeout for them all, the connection's
    `socket_timeout` (redis-py's pipeline takes one per reply, a good part of its cost). A failure of the
    connection (refused, cut, timed out) is tried once more on a fresh connection as redis-py's pipelines are (the
    client's `Retry`), then raised: the caller must be able to send the same commands twice. A connection whose
    replies were not all read (a failure, a cancel) is disconnected before it goes back to the pool, so no later
    command reads them.
    """
    pool = redis.connection_pool
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py: untyped
    try:
        answers: list[Any] = await connection.retry.call_with_retry(
            lambda: _exchange(connection, packed, replies), lambda _error: connection.disconnect()
        )
        return answers
    finally:
        await pool.release(connection)


async def _exchange(connection: AbstractConnection, packed: bytes, replies: int) -> list[Any]:
    answers: list[Any] = []
    in_step = False
    try:
        await connection.send_packed_command(packed)
        async with asyncio.timeout(connection.socket_timeout):
            for _ in range(replies):
                try:  # `math.inf`: no timeout of its own (redis-py's documented opt-out); the one above covers it
                    answers.append(await connection.read_response(timeout=math.inf))
                except ResponseError as error:  # an error reply, not a failure of the connection
                    answers.append(error)
        in_step = True
    except TimeoutError:  # the batch's timeout (asyncio's): as redis-py's own read timeout, which its Retry knows
        raise RedisTimeoutError(f"Timeout reading the replies of {replies} commands") from None
    finally:
        if not in_step and connection.is_connected:  # redis-py disconnects on most failures; this covers the rest
            await connection.disconnect(nowait=True)
    return answers
