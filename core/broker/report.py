"""The broker's health and counters (`GET /a2a/health`, `GET /a2a/stats`)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any, Protocol

from sqlalchemy import text

from core.broker.cluster import DirectoryEntry
from core.broker.connection import AgentConnection, ConnectionStats
from core.broker.inject import InjectPublisher
from core.broker.relay import TaskRelay
from core.broker.reload import ConfigReloader
from core.broker.replicas import BrokerCluster
from core.broker.sockets import AgentSockets
from core.db import Database
from core.streaming.backend import StreamHubBackend
from core.streaming.redis_hub import RedisStreamHub


class Reported(Protocol):
    """What the figures are read from: the `Broker`'s parts (a protocol, so this module does not import it)."""

    injects: InjectPublisher
    relay: TaskRelay
    sockets: AgentSockets
    cluster: BrokerCluster | None
    reloader: ConfigReloader
    conn_stats: ConnectionStats
    started_at: float
    tasks_dispatched: int
    tasks_no_agent: int

    def agents(self) -> list[AgentConnection | DirectoryEntry]:
        """The agents online, here and on the other replicas."""
        ...


def health(self: Reported) -> dict[str, Any]:
    """`GET /a2a/health`: ok, or degraded while Redis is configured but down."""
    redis_state = self.injects.state
    return {
        "status": "degraded" if redis_state == "down" else "ok",
        "redis": redis_state,
        "outbox": self.injects.outbox_size,
        "redisError": self.injects.last_error,
        "agentsOnline": len(self.agents()),
        **({"replica": self.cluster.replica_id, "agentsHere": len(self.sockets.connections)} if self.cluster else {}),
        "tasksRunning": len(self.relay.tasks),
        "uptimeS": round(time.time() - self.started_at, 1),
        "config": {
            "watching": self.reloader.watching,
            "lastReloadAt": self.reloader.last_reload_at,
            "lastError": self.reloader.last_error,
        },
    }


#: How long `/a2a/health` waits for each dependency to answer.
DEPENDENCY_TIMEOUT_S = 2.0


async def dependencies(self: Reported, db: Database, hub: StreamHubBackend) -> dict[str, dict[str, Any]]:
    """`GET /a2a/health`'s `dependencies`: the database and Redis, each `ok`, `required`, and why not.

    The database is always required; Redis is required in a cluster (its streams and leases live there: a round
    trip to it is made), and optional otherwise (the return path's state; injects wait in the outbox).
    docs/ARCHITECTURE.md, "Cluster", "Redis out of reach".
    """
    database: dict[str, Any] = {"required": True}
    try:
        async with asyncio.timeout(DEPENDENCY_TIMEOUT_S), db.read() as s:
            await s.exec(text("SELECT 1"))  # type: ignore[call-overload]
        database["ok"] = True
    except Exception as exc:  # any driver error, or no answer in time
        database.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:200])
    redis: dict[str, Any]
    if isinstance(hub, RedisStreamHub):
        redis = {"required": True, "configured": True, "heldEvents": hub.held_events()}
        try:
            async with asyncio.timeout(DEPENDENCY_TIMEOUT_S):
                await hub.redis.ping()
            redis["ok"] = True
        except Exception as exc:  # refused, cut, or no answer in time
            redis.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:200])
    else:
        state = self.injects.state
        redis = {"required": False, "configured": state != "disabled", "ok": state != "down"}
        if state == "down":
            redis["error"] = self.injects.last_error
    return {"database": database, "redis": redis}


def stats(self: Reported) -> dict[str, Any]:
    """`GET /a2a/stats`: counters since start."""
    c = self.conn_stats
    by_state = Counter({"running": len(self.relay.tasks), **self.relay.tasks_finished})
    cluster = (
        {}
        if self.cluster is None
        else {
            "cluster": {
                "replica": self.cluster.replica_id,
                "agentsHere": len(self.sockets.connections),
                "forwarded": dict(self.cluster.forwarded),
            }
        }
    )
    return {
        "agentsOnline": len(self.agents()),
        **cluster,
        "connections": {"total": self.sockets.connections_total, "refused": self.sockets.connections_refused},
        "tasks": {"dispatched": self.tasks_dispatched, "noAgent": self.tasks_no_agent, "byState": dict(by_state)},
        "eventsRelayed": c.events_in,
        "injects": {
            "sent": self.injects.sent,
            "throttled": self.relay.injects_throttled,
            "dropped": self.injects.dropped,
            "queued": self.injects.outbox_size,
        },
        "lines": {
            "in": c.lines_in,
            "malformed": c.lines_malformed,
            "oversized": c.lines_oversized,
            "unknownResponses": c.unknown_responses,
            "agentRequests": c.agent_requests,
            "badEvents": c.bad_events,
        },
        "redis": self.injects.state,
        "config": {"reloads": self.reloader.reloads, "rejected": self.reloader.rejected},
    }
