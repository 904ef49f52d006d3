"""The broker across replicas (docs/ARCHITECTURE.md, "Cluster: the broker across replicas").

With `CLUSTER=true` several app processes share one Redis. An agent's WebSocket
ends on one replica (its owner), but it must be one agent for the whole
cluster: listed everywhere, reachable from everywhere, its id unique. This
module is the Redis half of that:

- the directory: `<prefix>broker:agents` (hash, id -> the agent's card,
  binding, owner replica and its URL) and `<prefix>broker:leases` (hash, id ->
  "expires-at-ms token"). A claim is one Lua call that succeeds only when the
  id has no live lease or the lease is the caller's own, so two replicas can
  never both hold an id; the owner renews its leases every `lease_s / 3` and
  releases them when the socket closes. A replica that dies leaves leases that
  expire after `lease_s`, and the id is free again. Times come from Redis
  (`TIME`), so replicas' clocks do not matter.
- replicas: `<prefix>broker:replica:<id>` holds the replica's URL with the
  same lease; it says which replica is alive (start-up recovery) and where to
  forward a cancel.
- one pub/sub channel per replica, `<prefix>broker:replica-events:<id>`: the
  owner relays a forwarded task's text and end to the replica that dispatched
  it (the app's own chat watches its background tasks that way), and
  `<prefix>broker:directory` nudges every replica to re-read the directory.

Every key and channel is under `redis.key_prefix` (pub/sub ignores the database number).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

# One error for "this INSTANCE_ID is taken", whichever key says so.
from core.streaming.redis_hub import DuplicateReplicaError

log = logging.getLogger(__name__)

LEASE_S = 15.0  # the default; replicas use CLUSTER_LEASE_S
REFRESH_S = 2.0  # the cached directory is read again this often (and at once when a replica says it changed)

# KEYS: leases, agents. ARGV: id, token, entry JSON, lease ms. Nil: claimed (or renewed); else the holder's entry.
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local exp, tok = string.match(cur, '^(%d+) (.+)$')
  if tok ~= ARGV[2] and tonumber(exp) > now then
    return redis.call('HGET', KEYS[2], ARGV[1]) or '{}'
  end
end
redis.call('HSET', KEYS[1], ARGV[1], (now + tonumber(ARGV[4])) .. ' ' .. ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return false
"""

# KEYS: leases, agents. ARGV: id, token. 1 when it was the caller's and is now gone.
_RELEASE = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and string.match(cur, '^%d+ (.+)$') == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  return 1
end
return 0
"""

# KEYS: leases, agents. The entries whose lease is live (expired ones are removed on the way).
_LIST = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local leases = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #leases, 2 do
  local exp = tonumber(string.match(leases[i + 1], '^(%d+) '))
  if exp and exp > now then
    local entry = redis.call('HGET', KEYS[2], leases[i])
    if entry then table.insert(out, entry) end
  else
    redis.call('HDEL', KEYS[1], leases[i])
    redis.call('HDEL', KEYS[2], leases[i])
  end
end
return out
"""


@dataclass(frozen=True, slots=True)
class DirectoryEntry:
    """An agent connected to another replica, as this one sees it (shaped like `AgentConnection` for readers)."""

    id: str
    name: str
    description: str
    skills: list[dict[str, Any]]
    tool: dict[str, Any] | None
    binding: str | None
    connected_at: float
    replica: str
    url: str
    kind = "ws"
    closed = None  # listed means connected
    in_flight = 0  # not known here; the owner's /broker page shows it

    @property
    def remote_addr(self) -> str:
        """Where it is connected: the owner replica."""
        return f"replica {self.replica}"

    def card(self) -> dict[str, Any]:
        """Name, description and skills, as `AgentConnection.card`."""
        return {"name": self.name, "description": self.description, "skills": self.skills}

    def visible_to(self, agent_id: Any) -> bool:
        """Bound agents serve only their chat agent; unbound (global) agents serve everyone."""
        return self.binding is None or (agent_id is not None and str(agent_id) == self.binding)

    def to_json(self) -> str:
        """The directory's value for this agent."""
        return json.dumps(
            {
                "id": self.id,
                "name": self.name,
                "description": self.description,
                "skills": self.skills,
                "tool": self.tool,
                "binding": self.binding,
                "connectedAt": self.connected_at,
                "replica": self.replica,
                "url": self.url,
            },
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> DirectoryEntry | None:
        """Read a directory value; None when it is not one (a foreign or damaged key is skipped)."""
        try:
            d = json.loads(raw)
            return cls(
                id=str(d["id"]),
                name=str(d["name"]),
                description=str(d.get("description") or ""),
                skills=list(d.get("skills") or []),
                tool=d.get("tool"),
                binding=d.get("binding"),
                connected_at=float(d.get("connectedAt") or 0),
                replica=str(d["replica"]),
                url=str(d["url"]),
            )
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(slots=True)
class AgentDirectory:
    """This replica's view of the cluster's broker agents, and its own claims (see the module docstring)."""

    redis_url: str
    prefix: str
    replica_id: str
    replica_url: str
    lease_s: float = LEASE_S
    on_lost: Callable[[str], Awaitable[None]] | None = None  # an id this replica held was taken elsewhere
    on_event: Callable[[dict[str, Any]], Awaitable[None]] | None = None  # a message on this replica's channel
    _redis: Any = None
    _held: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (token, entry JSON)
    _entries: dict[str, DirectoryEntry] = field(default_factory=dict)  # other replicas' agents, cached
    _replica_token: str = field(default_factory=lambda: uuid.uuid4().hex)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _scripts: dict[str, Any] = field(default_factory=dict)

    @property
    def leases_key(self) -> str:
        """The hash of leases: agent id -> "expires-at-ms token"."""
        return f"{self.prefix}broker:leases"

    @property
    def agents_key(self) -> str:
        """The hash of agents: agent id -> its `DirectoryEntry` as JSON."""
        return f"{self.prefix}broker:agents"

    @property
    def changed_channel(self) -> str:
        """A replica published here: the directory changed."""
        return f"{self.prefix}broker:directory"

    def replica_key(self, replica_id: str) -> str:
        """Where a replica's URL and liveness are."""
        return f"{self.prefix}broker:replica:{replica_id}"

    def events_channel(self, replica_id: str) -> str:
        """The pub/sub channel a replica reads its forwarded tasks' events on."""
        return f"{self.prefix}broker:replica-events:{replica_id}"

    # -- life cycle -------------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the Redis client (idempotent)."""
        if self._redis is None:
            import redis.asyncio as redis

            self._redis = redis.Redis.from_url(self.redis_url, socket_connect_timeout=5.0, socket_timeout=10.0)
            self._scripts = {
                name: self._redis.register_script(src)
                for name, src in (("claim", _CLAIM), ("release", _RELEASE), ("list", _LIST))
            }

    async def claim_replica(self, *, claim: bool = True, wait_s: float | None = None) -> None:
        """Take this replica's liveness key (`claim=False`: only make sure nobody holds it).

        Waits out a lease its previous life left (a crash), then refuses.

        Raises:
            DuplicateReplicaError: another live process has this replica id.
        """
        await self.connect()
        key = self.replica_key(self.replica_id)
        deadline = time.monotonic() + (self.lease_s + 1 if wait_s is None else wait_s)
        while not (
            await self._redis.set(key, self.replica_url, nx=True, px=int(self.lease_s * 1000))
            if claim
            else not await self._redis.exists(key)
        ):
            if time.monotonic() > deadline:
                holder = await self._redis.get(self.replica_key(self.replica_id))
                raise DuplicateReplicaError(
                    f"another running replica uses the id {self.replica_id!r} (reachable at "
                    f"{holder.decode() if holder else '?'}); give each replica its own INSTANCE_ID"
                )
            await asyncio.sleep(0.5)

    async def start(self) -> None:
        """Hold this replica's key (see `claim_replica`), renew leases and follow the directory."""
        await self.claim_replica()
        listening = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._renew_forever(), name="broker directory leases"),
            loop.create_task(self._listen(listening), name="broker directory listener"),
            loop.create_task(self._refresh_forever(), name="broker directory refresh"),
        ]
        await asyncio.wait_for(listening.wait(), 10)
        await self.refresh()

    async def close(self) -> None:
        """Close the Redis client without releasing anything (a short-lived probe)."""
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
            self._redis = None

    async def stop(self) -> None:
        """Release every claim and this replica's key, then close."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._redis is None:
            return
        with contextlib.suppress(Exception):
            for agent_id in list(self._held):
                await self.release(agent_id)
            await self._redis.delete(self.replica_key(self.replica_id))
        with contextlib.suppress(Exception):
            await self._redis.aclose()
        self._redis = None

    # -- claims -------------------------------------------------------------------------------------

    async def claim(self, entry: DirectoryEntry) -> DirectoryEntry | None:
        """Claim `entry.id` for this replica; None when claimed, else the entry of the replica that holds it."""
        token = uuid.uuid4().hex
        value = entry.to_json()
        holder = await self._scripts["claim"](
            keys=[self.leases_key, self.agents_key], args=[entry.id, token, value, int(self.lease_s * 1000)]
        )
        if holder is not None:
            return DirectoryEntry.from_json(holder) or entry
        self._held[entry.id] = (token, value)
        await self._nudge()
        return None

    async def release(self, agent_id: str) -> None:
        """Give up a claim (the socket closed)."""
        held = self._held.pop(agent_id, None)
        if held is None:
            return
        try:
            await self._scripts["release"](keys=[self.leases_key, self.agents_key], args=[agent_id, held[0]])
            await self._nudge()
        except Exception:  # Redis is down: the lease expires by itself
            log.warning(
                "could not release the broker agent %s in Redis; its lease expires in %.0f s",
                agent_id,
                self.lease_s,
                exc_info=True,
            )

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await self._redis.set(self.replica_key(self.replica_id), self.replica_url, px=int(self.lease_s * 1000))
                for agent_id, (token, value) in list(self._held.items()):
                    holder = await self._scripts["claim"](
                        keys=[self.leases_key, self.agents_key], args=[agent_id, token, value, int(self.lease_s * 1000)]
                    )
                    if holder is not None and self._held.get(agent_id, (None,))[0] == token:
                        del self._held[agent_id]
                        log.warning(
                            "the broker agent %s was claimed by another replica while this one could not "
                            "renew its lease; closing its socket here",
                            agent_id,
                        )
                        if self.on_lost is not None:
                            await self.on_lost(agent_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("could not renew broker leases in Redis; trying again", exc_info=True)

    # -- reading ---------------------------------------------------------------------------------

    async def refresh(self) -> list[DirectoryEntry]:
        """Read the directory now; returns (and caches) the agents other replicas hold."""
        raw = await self._scripts["list"](keys=[self.leases_key, self.agents_key])
        entries = [e for e in (DirectoryEntry.from_json(r) for r in raw) if e is not None]
        self._entries = {e.id: e for e in entries if e.replica != self.replica_id}
        return sorted(self._entries.values(), key=lambda e: e.id)

    def entries(self) -> list[DirectoryEntry]:
        """Other replicas' agents as last read (at most `REFRESH_S` old, or nudged)."""
        return [self._entries[k] for k in sorted(self._entries)]

    def entry(self, agent_id: str) -> DirectoryEntry | None:
        """Another replica's agent with that id, as last read."""
        return self._entries.get(agent_id)

    async def lookup(self, agent_id: str) -> DirectoryEntry | None:
        """Another replica's agent with that id, read now."""
        await self.refresh()
        return self._entries.get(agent_id)

    async def replica_url_of(self, replica_id: str) -> str | None:
        """The URL of a live replica; None when it is not running."""
        raw = await self._redis.get(self.replica_key(replica_id))
        return raw.decode() if raw else None

    async def live_replicas(self, replica_ids: set[str]) -> set[str]:
        """Which of these replicas are running (their key has not expired)."""
        ids = sorted(replica_ids)
        if not ids:
            return set()
        values = await self._redis.mget([self.replica_key(r) for r in ids])
        return {r for r, v in zip(ids, values, strict=True) if v is not None}

    async def _refresh_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), REFRESH_S)
            self._changed.clear()
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.debug("could not read the broker directory", exc_info=True)

    # -- messages between replicas ---------------------------------------------------------------

    async def publish_event(self, replica_id: str, event: dict[str, Any]) -> None:
        """Send a message to another replica's channel (a forwarded task's text or end)."""
        await self._redis.publish(self.events_channel(replica_id), json.dumps(event, ensure_ascii=False))

    async def _nudge(self) -> None:
        await self._redis.publish(self.changed_channel, self.replica_id)

    async def _listen(self, listening: asyncio.Event) -> None:
        while True:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(self.changed_channel, self.events_channel(self.replica_id))
                listening.set()
                self._changed.set()  # a (re)subscription may have missed changes
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    channel = message["channel"].decode()
                    if channel == self.changed_channel:
                        self._changed.set()
                    elif self.on_event is not None:
                        try:
                            await self.on_event(json.loads(message["data"]))
                        except Exception:
                            log.exception("a message from another replica could not be handled")
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("the broker's Redis subscription dropped; subscribing again", exc_info=True)
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
