"""The agents' side of the broker: a socket admitted, its card read, its id claimed, then its lines read.

An agent's id is claimed in the app's one registry (`AgentRegistry.claim`) and, in
cluster mode, in the directory every replica shares (`core.broker.cluster`); a
refused peer is closed with the seed's codes (4400 bad card, 4408 no card, 4409 id
taken; 1013 when the directory is unreachable).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from core.broker import wire
from core.broker.auth import BrokerRefusedError, Identity, identify, is_blacklisted
from core.broker.cluster import DirectoryEntry
from core.broker.connection import AgentConnection, ConnectionStats, RpcError
from core.broker.replicas import BrokerCluster
from core.delegation.registry import AgentRegistry, IdTakenError
from core.settings import Settings
from core.web.logtext import loggable
from core.web.outbound_policy import AllowList

# The broker's log name, kept for the connections moved here: operators (and tests) filter on core.broker.service.
log = logging.getLogger("core.broker.service")

# WebSocket close codes (4000-4999 are the application's).
CLOSE_BAD_CARD, CLOSE_ID_TAKEN, CLOSE_NO_CARD, CLOSE_GOING_AWAY = 4400, 4409, 4408, 1001
CLOSE_TRY_AGAIN = 1013  # cluster mode: the directory (Redis) is unreachable, the agent should dial again later


def close_reason(text: str) -> str:
    """WebSocket close reasons are limited to 123 bytes."""
    data = text.encode("utf-8")
    return text if len(data) <= 123 else data[:120].decode("utf-8", "ignore") + "..."


class AgentSockets:
    """The agents connected to this replica, and how one is admitted and served."""

    def __init__(self, settings: Settings, registry: AgentRegistry, cluster: BrokerCluster | None) -> None:
        self.settings = settings
        self.registry = registry
        self.cluster = cluster
        self.stats = ConnectionStats()
        self.connections_total = 0
        self.connections_refused = 0
        self.connections: dict[str, AgentConnection] = {}
        self.closers: dict[str, Callable[[int, str], Awaitable[None]]] = {}

    def admit(self, client_host: str | None, query: dict[str, str]) -> Identity:
        """Check a connecting peer before the upgrade: blacklist, then identity.

        Raises:
            BrokerRefusedError: with the HTTP status and the reason for the peer.
        """
        try:
            if is_blacklisted(client_host, self.settings.blacklist_ip):
                raise BrokerRefusedError(403, f"connections from {client_host} are refused (blacklist_ip)")
            return identify(query, self.settings.auth)
        except BrokerRefusedError as exc:
            self.connections_refused += 1
            log.info("refused /a2a connection from %s: %s", client_host, exc.reason)
            raise

    async def serve(
        self,
        identity: Identity,
        frames: AsyncIterator[str],
        *,
        send: Callable[[str], Awaitable[None]],
        close: Callable[[int, str], Awaitable[None]],
        remote_addr: str | None = None,
    ) -> None:
        """Run one accepted connection until it ends: card, registration, then relaying lines."""
        conn = AgentConnection(identity, send=send, settings=self.settings, stats=self.stats, remote_addr=remote_addr)
        reader = asyncio.get_running_loop().create_task(self._read(conn, frames), name=f"a2a reader {conn.id}")
        registered = False
        try:
            refusal = await self._id_refusal(conn.id)
            if refusal is not None:
                return await self._refuse(close, CLOSE_ID_TAKEN, refusal)
            try:
                card = await self._card(conn)
            except TimeoutError:
                return await self._refuse(
                    close, CLOSE_NO_CARD, f"no agent card within {self.settings.request_timeout} ms"
                )
            except (wire.WireError, RpcError) as exc:
                return await self._refuse(close, CLOSE_BAD_CARD, f"agent card: {exc}")
            except ConnectionError:
                return None
            conn.set_card(card)
            try:
                await self.registry.claim(conn)
            except IdTakenError as exc:
                return await self._refuse(close, CLOSE_ID_TAKEN, str(exc))
            if self.cluster is not None:
                claim_refusal = await self._claim_in_cluster(conn)
                if claim_refusal is not None:
                    await self.registry.release(conn.id, conn)
                    return await self._refuse(close, *claim_refusal)
            registered = True
            self.connections_total += 1
            self.connections[conn.id] = conn
            self.closers[conn.id] = close
            log.info(
                "agent %s (%s) connected from %s%s",
                conn.id,
                loggable(conn.name, 80),
                remote_addr or "?",
                f", bound to {loggable(conn.binding, 80)}" if conn.binding else "",
            )
            await reader  # until the peer goes away
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)  # a reader that failed is not left unretrieved
            conn.close(conn.closed or "the connection ended")
            if registered:
                if self.connections.get(conn.id) is conn:
                    del self.connections[conn.id]
                    self.closers.pop(conn.id, None)
                await self.registry.release(conn.id, conn)
                if self.cluster is not None and self.connections.get(conn.id) is None:
                    await self.cluster.directory.release(conn.id)
                log.info("agent %s disconnected", conn.id)

    async def _claim_in_cluster(self, conn: AgentConnection) -> tuple[int, str] | None:
        """Claim the id across the cluster; None when claimed, else the close code and reason."""
        assert self.cluster is not None
        entry = DirectoryEntry(
            id=conn.id,
            name=conn.name,
            description=conn.description,
            skills=conn.card()["skills"],
            tool=conn.tool,
            binding=conn.binding,
            connected_at=conn.connected_at,
            replica=self.cluster.replica_id,
            url=self.cluster.replica_url,
        )
        try:
            holder = await self.cluster.directory.claim(entry)
        except Exception:  # Redis is down: an id that cannot be claimed cluster-wide is not accepted
            log.warning("could not claim the broker agent %s in Redis", conn.id, exc_info=True)
            return CLOSE_TRY_AGAIN, "the broker's directory (Redis) is unreachable; dial again shortly"
        if holder is not None:
            return CLOSE_ID_TAKEN, (
                f"an agent with the id {conn.id!r} is already connected (to replica {holder.replica})"
            )
        return None

    def taken_elsewhere(self, agent_id: str) -> str | None:
        """Why `agent_id` is taken: another replica's broker agent holds it (None: it is not)."""
        entry = self.cluster.directory.entry(agent_id) if self.cluster is not None else None
        return (
            None
            if entry is None
            else (f"an agent with the id {agent_id!r} is connected to the broker (on replica {entry.replica})")
        )

    async def _refuse(self, close: Callable[[int, str], Awaitable[None]], code: int, reason: str) -> None:
        self.connections_refused += 1
        log.info("closing /a2a connection: %s", reason)
        try:
            await close(code, close_reason(reason))
        except Exception:
            log.debug("close failed", exc_info=True)

    async def _read(self, conn: AgentConnection, frames: AsyncIterator[str]) -> None:
        try:
            async for frame in frames:
                await conn.feed(frame)
        finally:
            conn.close("the agent disconnected")

    async def _id_refusal(self, a2a_id: str) -> str | None:
        if a2a_id in self.connections:
            return f"an agent with the id {a2a_id!r} is already connected"
        if self.cluster is not None:
            with contextlib.suppress(Exception):  # Redis down: the claim after the card refuses it
                holder = await self.cluster.directory.lookup(a2a_id)
                if holder is not None:
                    return f"an agent with the id {a2a_id!r} is already connected (to replica {holder.replica})"
        if self.registry.remote(a2a_id) is not None:
            return f"{a2a_id!r} is already registered as a remote agent"
        async with self.registry.db.session() as s:
            from core.chat import agents as agents_store

            if await agents_store.get_agent_by_slug(s, a2a_id) is not None:
                return f"{a2a_id!r} is the id of a local agent; choose another id"
        return None

    async def _card(self, conn: AgentConnection) -> wire.AgentCard:
        timeout_s = self.settings.request_timeout / 1000
        if conn.card_url:
            from core.a2a import outbound  # only for agents that name a card URL

            allow = AllowList.parse(self.settings.outbound_allow_hosts)
            try:
                body = await outbound.fetch_card_json(conn.card_url, allow=allow, timeout_s=timeout_s)
            except outbound.CardFetchError as exc:
                if exc.category == outbound.TIMED_OUT:
                    raise TimeoutError(str(exc)) from None
                raise wire.WireError(str(exc)) from None
            return wire.parse_card(body)
        return await conn.fetch_card(timeout_s=timeout_s)

    async def disconnect(self, a2a_id: str, reason: str = "disconnected by an operator", code: int = 1000) -> bool:
        """Close a connected agent's socket (its tasks fail with `auto` injects); False when it is not connected."""
        close = self.closers.get(a2a_id)
        if close is None:
            return False
        await close(code, close_reason(reason))
        return True

    def agents(self) -> list[AgentConnection | DirectoryEntry]:
        """Every agent connected to the broker: here, and (cluster mode) to the other replicas, by id."""
        here: dict[str, AgentConnection | DirectoryEntry] = dict(self.connections)
        if self.cluster is not None:
            for entry in self.cluster.directory.entries():
                here.setdefault(entry.id, entry)
        return [here[k] for k in sorted(here)]

    def agent(self, a2a_id: str) -> AgentConnection | DirectoryEntry | None:
        """The agent with that id, connected here or (cluster mode) to another replica."""
        conn = self.connections.get(a2a_id)
        if conn is None and self.cluster is not None:
            return self.cluster.directory.entry(a2a_id)
        return conn

    async def refresh_directory(self) -> None:
        """Cluster mode: read the other replicas' agents now (else they are at most a few seconds old)."""
        if self.cluster is not None:
            try:
                await self.cluster.directory.refresh()
            except Exception:  # Redis is down: the last view stands
                log.warning("could not read the broker directory from Redis", exc_info=True)

    def discover(self, agent_id: str | None = None) -> list[dict[str, Any]]:
        """`GET /a2a/agents`: agents bound to `agent_id` plus global ones (all without it), on every replica."""
        return [self._describe(c) for c in self.agents() if agent_id is None or c.visible_to(agent_id)]

    def _describe(self, conn: AgentConnection | DirectoryEntry) -> dict[str, Any]:
        return {
            "a2a_id": conn.id,
            "name": conn.name,
            "description": conn.description,
            "skills": conn.card()["skills"],
            "tool": conn.tool,
            "agent_id": conn.binding,
            "connectedAt": conn.connected_at,
        }
