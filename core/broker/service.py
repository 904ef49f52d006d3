"""The broker (seed 003 `A2aBroker`): connected agents, dispatched tasks, progress back as injects.

Three legs: chat systems dispatch over HTTP (`dispatch`, `cancel_chat`),
agents stream over WebSocket (`serve`), and progress goes back over Redis
(`InjectPublisher`). A dispatched task is relayed event by event
(`core.broker.relay`):

- text of a working event -> `delay` inject, at most one per task per
  `inject_min_interval` (leading edge; the rest are dropped, not deferred);
- the terminal event -> `auto` inject with the result (never throttled);
- no event for `task_idle_timeout` -> `tasks/cancel` to the agent and an
  `auto` "timed out" inject; an agent that disconnects fails its tasks the same way.

A task is saved when it is accepted and its end is saved with its result
(`core.broker.store`), so a stop or a crash loses no `auto` inject: at the
next start the tasks cut off end with "interrupted by a server restart", and
results that never reached Redis are sent.

Agents join the app's one registry (`AgentRegistry.claim`), so the chat's
`@<id>` delegation reaches them too, through `AgentConnection.stream`.

In cluster mode an agent's id is also claimed in the directory shared by every
replica, and a dispatch or cancel for an agent another replica holds is sent
there (`core.broker.replicas`; docs/ARCHITECTURE.md, "Cluster: the broker
across replicas").

The parts are modules of their own: the agents' sockets (`core.broker.sockets`),
a task's relay (`core.broker.relay`) and its log in the hub stream `a2a_<taskId>`
(`core.broker.task_log`), the wire, the return path, the durable store, the counters
(`core.broker.report`). This class ties their life cycles (a closing socket ends
tasks, a stop ends them differently).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from core.broker import report
from core.broker.auth import Identity
from core.broker.cluster import DirectoryEntry
from core.broker.connection import AgentConnection
from core.broker.inject import InjectPublisher
from core.broker.relay import RECENT_TASKS, STOPPED, TIMEOUT, TaskRelay
from core.broker.reload import ConfigReloader
from core.broker.replicas import BrokerCluster, ForwardFailedError
from core.broker.sockets import CLOSE_GOING_AWAY, CLOSE_ID_TAKEN, AgentSockets
from core.broker.store import BrokerStore
from core.broker.task import DISPATCH_TOKEN_OWNER, OPEN_OWNER, BrokerTask, TaskObserver, owner_user_id, user_owner
from core.broker.task_log import TaskLog
from core.delegation.registry import AgentRegistry
from core.settings import Settings
from core.streaming.background import BackgroundTasks
from core.streaming.hub import StreamHub
from core.streaming.redis_hub import RedisStreamHub
from core.web.logtext import loggable

__all__ = [  # the task's names, re-exported: callers import them from here
    "DISPATCH_TOKEN_OWNER",
    "OPEN_OWNER",
    "RECENT_TASKS",
    "STOPPED",
    "TIMEOUT",
    "Broker",
    "BrokerTask",
    "TaskObserver",
    "user_owner",
]

log = logging.getLogger(__name__)


class Broker:
    """Connections, tasks and the return path."""

    def __init__(
        self, settings: Settings, registry: AgentRegistry, hub: StreamHub | RedisStreamHub | None = None
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.hub = hub  # where each task's events are logged (`a2a_<taskId>`); None: not logged
        # Cluster mode (docs/ARCHITECTURE.md, "Cluster: the broker across replicas"; needs REDIS_URL).
        self.cluster = BrokerCluster(settings, on_lost=self._lost) if settings.cluster and settings.redis.dsn else None
        self.store = BrokerStore(registry.db, settings.instance_id)
        self.injects = InjectPublisher(
            settings.redis.dsn,
            outbox_max=settings.broker_outbox_max,
            on_sent=self.store.mark_published,
        )
        self.reloader = ConfigReloader(settings)
        self.sockets = AgentSockets(settings, registry, self.cluster)
        if self.cluster is not None:  # an id another replica's broker agent holds is taken here too
            registry.taken_elsewhere = self.sockets.taken_elsewhere
        self.conn_stats = self.sockets.stats
        self.started_at = time.time()
        self.tasks_dispatched = 0
        self.tasks_no_agent = 0
        self._connections = self.sockets.connections  # the same dict (the broker page's tests fill it)
        self._closers = self.sockets.closers
        self._runners = BackgroundTasks()
        self._stopping = False
        self.relay = TaskRelay(settings, self.store, self.injects, lambda: self._stopping)
        self._tasks = self.relay.tasks  # the running tasks (the relay's own dict: it removes the ended)

    # -- life cycle ------------------------------------------------------------------------------

    async def recover(self) -> int:
        """Before serving: end the tasks a stop or a crash cut off, each with its result; how many.

        In cluster mode, this replica's own tasks and those of replicas that are no longer running
        (their key in Redis expired), never the tasks of a live replica.

        Raises:
            DuplicateReplicaError: (cluster mode) another running replica has this replica's id.
        """
        if self.cluster is None:
            return await self.store.interrupt_running(sent=not self.injects.configured)
        await self.cluster.claim_replica()
        return await self.store.interrupt_running(sent=not self.injects.configured, adopt=await self._gone_replicas())

    async def reap_gone_replicas(self) -> int:
        """While serving, in a cluster: end the tasks of replicas that are gone, as `recover` does; how many.

        The cluster's reaper calls it (docs/ARCHITECTURE.md, "Cluster: the broker across replicas"): a replica
        killed for good never starts again to end its tasks. Their results are sent now, once each.
        """
        if self.cluster is None:
            return 0
        results = await self.store.adopt_running(await self._gone_replicas(), sent=not self.injects.configured)
        for item in results:
            await self.injects.publish(item.inject, to_redis=item.to_redis)
        if results:
            log.warning(
                "%d broker tasks of replicas that stopped were ended here; their chats are told they were interrupted",
                len(results),
            )
        return len(results)

    async def _gone_replicas(self) -> set[str]:
        """The other replicas with running tasks whose liveness key in Redis expired (never a live one)."""
        assert self.cluster is not None
        others = await self.store.owing_instances() - {self.store.instance}
        return others - await self.cluster.running_replicas(others) if others else set()

    async def start(self) -> None:
        """Connect the return path, send the results a stop kept back, and watch the config file."""
        self._stopping = False
        self.started_at = time.time()
        if self.cluster is not None:
            await self.cluster.start()
        await self.injects.start()
        try:
            pending = await self.store.pending(redis=self.injects.configured)
        except Exception:  # the database is down: they wait for the next start
            log.exception("could not read the unsent results of broker tasks")
            pending = []
        if pending:
            log.info("sending %d broker task results that a stop kept back", len(pending))
        for item in pending:
            await self.injects.publish(item.inject, to_redis=item.to_redis)
        await self.reloader.start()

    def stopping(self) -> None:
        """The app is stopping: agents' sockets closing from now on end their tasks as stopped, not failed."""
        self._stopping = True

    async def stop(self) -> None:
        """Fail running tasks (their `auto` injects still go out), close agents, then the return path."""
        self._stopping = True
        await self._runners.shutdown(timeout=5.0)
        for agent_id, close in list(self._closers.items()):
            try:
                await close(CLOSE_GOING_AWAY, "the broker is shutting down")
            except Exception:  # the socket may already be gone
                log.debug("closing %s failed", agent_id, exc_info=True)
        await self.reloader.stop()
        if self.cluster is not None:
            await self.cluster.stop()
        await self.injects.stop()

    # -- connections -------------------------------------------------------------------------

    def admit(self, client_host: str | None, query: dict[str, str]) -> Identity:
        """Check a connecting peer before the upgrade: blacklist, then identity (`AgentSockets.admit`).

        Raises:
            BrokerRefusedError: with the HTTP status and the reason for the peer.
        """
        return self.sockets.admit(client_host, query)

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
        await self.sockets.serve(identity, frames, send=send, close=close, remote_addr=remote_addr)

    async def disconnect(self, a2a_id: str, reason: str = "disconnected by an operator", code: int = 1000) -> bool:
        """Close a connected agent's socket (its tasks fail with `auto` injects); False when it is not connected."""
        return await self.sockets.disconnect(a2a_id, reason, code)

    async def _lost(self, a2a_id: str) -> None:
        """Another replica holds the id now (this one could not renew its lease): close the socket here."""
        await self.disconnect(a2a_id, "this agent id is now connected to another replica", code=CLOSE_ID_TAKEN)

    def connection(self, a2a_id: str) -> AgentConnection | None:
        """The connected agent with that id."""
        return self._connections.get(a2a_id)

    def connections(self) -> list[AgentConnection]:
        """Every connected agent, by id."""
        return [self._connections[k] for k in sorted(self._connections)]

    def agents(self) -> list[AgentConnection | DirectoryEntry]:
        """Every agent connected to the broker: here, and (cluster mode) to the other replicas, by id."""
        return self.sockets.agents()

    def agent(self, a2a_id: str) -> AgentConnection | DirectoryEntry | None:
        """The agent with that id, connected here or (cluster mode) to another replica."""
        return self.sockets.agent(a2a_id)

    async def refresh_directory(self) -> None:
        """Cluster mode: read the other replicas' agents now (else they are at most a few seconds old)."""
        await self.sockets.refresh_directory()

    def discover(self, agent_id: str | None = None) -> list[dict[str, Any]]:
        """`GET /a2a/agents`: agents bound to `agent_id` plus global ones (all without it), on every replica."""
        return self.sockets.discover(agent_id)

    # -- tasks --------------------------------------------------------------------------------

    async def dispatch(
        self,
        *,
        task: str,
        target_agent: str,
        agent_id: Any,
        chat_id: str,
        owner: str = OPEN_OWNER,
        mac_address: str | None = None,
        task_id: str | None = None,
        session_id: str | None = None,
        observer: TaskObserver | None = None,
        local_only: bool = False,
    ) -> dict[str, Any]:
        """Start a task on a connected agent; the answer is the ack, progress follows as injects.

        The task is saved before the ack (its result is then owed even across a crash). `task_id`
        (default: a new UUID), `session_id` and `observer` are for the app's own dispatches, whose
        task is also a delegation record (`core.broker.tools`). In cluster mode an agent connected to
        another replica gets the task through that replica (`local_only`: the call came from one).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the task could not be saved; nothing was started.
        """
        conn = self._connections.get(target_agent)
        if conn is None and self.cluster is not None and not local_only:
            return await self._forward_dispatch(
                target_agent,
                observer,
                {
                    "task": task,
                    "targetAgent": target_agent,
                    "agentId": agent_id,
                    "chatId": chat_id,
                    "owner": owner,
                    "macAddress": mac_address,
                    "taskId": task_id or str(uuid.uuid4()),
                    "sessionId": session_id,
                },
            )
        if conn is None or not conn.visible_to(agent_id) or conn.closed is not None:
            self.tasks_no_agent += 1
            return {"status": "no_agent"}
        record = BrokerTask(
            id=task_id or str(uuid.uuid4()),
            agent=conn,
            chat_agent_id=agent_id,
            chat_id=chat_id,
            text=task,
            owner=owner,
            session_id=session_id,
            mac_address=mac_address,
            observer=observer,
        )
        await self.store.add_task(
            task_id=record.id,
            owner=owner,
            target_agent=conn.id,
            agent_name=conn.name,
            chat_agent_id=agent_id,
            chat_id=chat_id,
            session_id=session_id,
            task=task,
        )
        record.task_log = TaskLog(self.hub, record.id, writes=observer is None)  # observed: it has its stream
        await record.task_log.open(conn.id, conn.name, owner_user_id(owner))
        self._tasks[record.id] = record
        self.tasks_dispatched += 1
        record.runner = self._runners.spawn(self.relay.run(record), name=f"a2a task {record.id}")
        return {"taskId": record.id, "status": "accepted"}

    async def _forward_dispatch(
        self, target_agent: str, observer: TaskObserver | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        assert self.cluster is not None
        try:
            entry = await self.cluster.directory.lookup(target_agent)
        except Exception:
            log.warning("could not read the broker directory for %s", loggable(target_agent, 80), exc_info=True)
            entry = None
        if entry is None or not entry.visible_to(body["agentId"]):
            self.tasks_no_agent += 1
            return {"status": "no_agent"}
        try:
            return await self.cluster.forward_dispatch(entry, body, observer)
        except ForwardFailedError as exc:
            log.warning("dispatch to %s on replica %s failed: %s", entry.id, entry.replica, exc)
            self.tasks_no_agent += 1
            return {"status": "no_agent"}

    async def cancel_chat(self, chat_id: str, owner: str | None = None, *, local_only: bool = False) -> int:
        """Cancel the chat's running tasks (each agent gets `tasks/cancel`); how many there were.

        With `owner`, only the tasks that owner dispatched: another owner's chat is left alone and
        counts 0, exactly like a chat with nothing running. In cluster mode the replicas that run
        tasks of the chat (`broker_tasks.instance`) cancel theirs too (`local_only`: the call came from one).
        """
        canceled = 0
        if self.cluster is not None and not local_only:
            for replica in await self.store.running_instances(chat_id=chat_id, owner=owner) - {self.store.instance}:
                canceled += await self.cluster.forward_cancel(replica, chat_id, owner)
        return canceled + await self._cancel_here(chat_id, owner)

    async def _cancel_here(self, chat_id: str, owner: str | None) -> int:
        runners = []
        for record in [t for t in self._tasks.values() if t.chat_id == chat_id and (owner is None or t.owner == owner)]:
            if (runner := record.runner) is not None:
                record.cancel_requested = True
                runners.append(runner)
                runner.cancel()
        if runners:
            await asyncio.wait(runners, timeout=self.settings.request_timeout / 1000)
        return len(runners)

    def running_tasks(self) -> list[BrokerTask]:
        """Tasks still relaying, oldest first."""
        return sorted(self._tasks.values(), key=lambda t: t.created_at)

    def recent_tasks(self) -> list[BrokerTask]:
        """Finished tasks, newest first (the last hundred)."""
        return list(reversed(self.relay.recent))

    # -- health and counters ------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """`GET /a2a/health`: ok, or degraded while Redis is configured but down."""
        return report.health(self)

    def stats(self) -> dict[str, Any]:
        """`GET /a2a/stats`: counters since start."""
        return report.stats(self)
