"""The broker's calls between replicas (docs/ARCHITECTURE.md, "Cluster: the broker across replicas").

A dispatch or a cancel that reaches a replica which does not hold the agent's
socket is forwarded to the replica that does, over HTTP, on the internal routes
(`/a2a/internal/*`, `core.broker.routes`), with `INTERNAL_TOKEN` as a bearer
token. The caller still gets the synchronous ack (the owner's). Where the task
runs, its injects are made as for a local one (Redis `agent:events:<agentId>`,
and that replica's own chat inbox for the app's own chats, `core.broker.inbox`).

The app's own background dispatches also watch their task (the side panel,
`TaskObserver`): the owner relays the task's text and end on the dispatching
replica's pub/sub channel (`AgentDirectory.publish_event`), and this module
hands them to the observer waiting there. When the owner replica is gone (its
key expired: killed, or stalled past its lease), no end will come from it: the
observers of its tasks are ended here as interrupted (`OWNERS_CHECK_S`), as the
replica that adopts those tasks ends them in the database and in their chats.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

import httpx

from core.a2a.outbound import with_trace
from core.aio import cancel_and_wait
from core.broker.cluster import AgentDirectory, DirectoryEntry
from core.errors import AppError
from core.i18n import _
from core.settings import Settings

if TYPE_CHECKING:
    from core.broker.task import TaskObserver

log = logging.getLogger(__name__)

INTERNAL_DISPATCH = "/a2a/internal/dispatch"
INTERNAL_CANCEL = "/a2a/internal/cancel"
MAX_INTERNAL_BODY_BYTES = 262_144  # a task is at most 20,000 characters; the rest is ids
OWNERS_CHECK_S = 2.0  # how often the owners of watched forwarded tasks are checked for life (one MGET)


def replica_url(settings: Settings) -> str:
    """How the other replicas reach this one: `REPLICA_URL`, else this server's own base URL."""
    return (settings.replica_url or settings.base_url).rstrip("/")


class ForwardFailedError(AppError, RuntimeError):
    """The owner replica could not be reached or refused the call."""

    code = "forward_failed"


class RelayedObserver:
    """A `TaskObserver` on the owner replica that sends what it sees to the dispatching replica."""

    def __init__(self, directory: AgentDirectory, origin: str, task_id: str) -> None:
        self.directory = directory
        self.origin = origin
        self.task_id = task_id

    async def on_text(self, text: str) -> None:
        """One piece of text, relayed."""
        await self.directory.publish_event(self.origin, {"taskId": self.task_id, "kind": "text", "text": text})

    async def on_end(self, state: str, text: str) -> None:
        """The end, relayed."""
        await self.directory.publish_event(
            self.origin, {"taskId": self.task_id, "kind": "end", "state": state, "text": text}
        )


class BrokerCluster:
    """The directory, forwarding to owners, and the observers of tasks forwarded from here."""

    def __init__(self, settings: Settings, *, on_lost: Any = None) -> None:
        if not settings.redis.dsn:
            raise ValueError("cluster mode needs REDIS_URL")
        self.settings = settings
        self.replica_id = settings.instance_id  # different on every replica (Settings.cluster_problems)
        self.replica_url = replica_url(settings)
        self.token = settings.internal_token or ""
        self.directory = AgentDirectory(
            settings.redis.dsn,
            settings.redis.key_prefix,
            self.replica_id,
            self.replica_url,
            lease_s=settings.cluster_lease_s,
            on_lost=on_lost,
            on_event=self._on_event,
        )
        self.forwarded: Counter[str] = Counter()  # dispatch, cancel, failed
        self._observers: dict[str, TaskObserver] = {}
        self._owners: dict[str, str] = {}  # watched task id -> the replica that runs it
        self._http: httpx.AsyncClient | None = None
        self._owners_check: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Join: hold this replica's key, follow the directory, open the HTTP client."""
        await self.directory.start()
        self._http = httpx.AsyncClient(
            timeout=self.settings.request_timeout / 1000,
            follow_redirects=False,
            headers={"Authorization": f"Bearer {self.token}"},
            event_hooks={"request": [with_trace]},  # a forwarded task stays in its trace
        )
        self._owners_check = asyncio.get_running_loop().create_task(self._check_owners_forever(), name="task owners")

    async def stop(self) -> None:
        """Leave: release claims and this replica's key."""
        await cancel_and_wait(self._owners_check)
        self._owners_check = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        await self.directory.stop()

    async def running_replicas(self, replica_ids: set[str]) -> set[str]:
        """Which of these replicas are alive now (before `start`, with a short-lived client)."""
        if self._http is not None:  # started: the directory's client is open
            return await self.directory.live_replicas(replica_ids)
        probe = AgentDirectory(
            self.directory.redis_url,
            self.directory.prefix,
            self.replica_id,
            self.replica_url,
            lease_s=self.directory.lease_s,
        )
        try:
            await probe.connect()
            return await probe.live_replicas(replica_ids)
        finally:
            await probe.close()

    async def claim_replica(self) -> None:
        """Before serving: make sure no other live process has this replica's id (`start` then takes it).

        Raises:
            DuplicateReplicaError: one has.
        """
        probe = AgentDirectory(
            self.directory.redis_url,
            self.directory.prefix,
            self.replica_id,
            self.replica_url,
            lease_s=self.directory.lease_s,
        )
        try:
            await probe.claim_replica(claim=False)
        finally:
            await probe.close()

    # -- forwarding ---------------------------------------------------------------------------

    async def forward_dispatch(
        self, entry: DirectoryEntry, body: dict[str, Any], observer: TaskObserver | None
    ) -> dict[str, Any]:
        """Dispatch on the owner replica; its ack. An observer is fed from the owner's relayed events.

        Raises:
            ForwardFailedError: the owner could not be reached or answered with an error.
        """
        task_id = body["taskId"]
        if observer is not None:
            self._observers[task_id] = observer  # before the call: the first text may come before the ack
            self._owners[task_id] = entry.replica
        try:
            ack = await self._post(
                entry.url, INTERNAL_DISPATCH, {**body, "origin": self.replica_id, "observe": observer is not None}
            )
        except ForwardFailedError:
            self._forget(task_id)
            raise
        if ack.get("status") != "accepted":
            self._forget(task_id)
        self.forwarded["dispatch"] += 1
        return ack

    async def forward_cancel(self, replica: str, chat_id: str, owner: str | None) -> int:
        """Cancel a chat's tasks on another replica; how many it canceled (0 when it is gone)."""
        url = await self.directory.replica_url_of(replica)
        if url is None:
            return 0
        try:
            answer = await self._post(url, INTERNAL_CANCEL, {"chatId": chat_id, "owner": owner})
        except ForwardFailedError as exc:
            log.warning("could not cancel chat %s's tasks on replica %s: %s", chat_id, replica, exc)
            return 0
        self.forwarded["cancel"] += 1
        return int(answer.get("canceled") or 0)

    async def _post(self, base_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert self._http is not None, "BrokerCluster.start was not called"
        try:
            response = await self._http.post(f"{base_url}{path}", json=body)
        except httpx.HTTPError as exc:
            self.forwarded["failed"] += 1
            raise ForwardFailedError(f"replica at {base_url} is unreachable ({type(exc).__name__})") from exc
        if response.status_code != 200:
            self.forwarded["failed"] += 1
            raise ForwardFailedError(f"replica at {base_url} answered {response.status_code}: {response.text[:200]}")
        answer: dict[str, Any] = response.json()
        return answer

    def relayed_observer(self, origin: str, task_id: str) -> RelayedObserver:
        """The observer a forwarded dispatch gets on the owner: it relays to `origin`."""
        return RelayedObserver(self.directory, origin, task_id)

    async def _on_event(self, event: dict[str, Any]) -> None:
        task_id = event.get("taskId")
        if not isinstance(task_id, str):
            return
        observer = self._observers.get(task_id)
        if observer is None:
            return
        if event.get("kind") == "text":
            await observer.on_text(str(event.get("text") or ""))
        elif event.get("kind") == "end":
            self._forget(task_id)
            await observer.on_end(str(event.get("state") or "failed"), str(event.get("text") or ""))

    def _forget(self, task_id: str) -> None:
        self._observers.pop(task_id, None)
        self._owners.pop(task_id, None)

    async def end_orphans(self) -> int:
        """End the watched tasks whose owner replica is gone (no end will come from it); how many."""
        owners = set(self._owners.values())
        if not owners:
            return 0
        live = await self.directory.live_replicas(owners)
        orphans = [task_id for task_id, owner in self._owners.items() if owner not in live]
        for task_id in orphans:
            observer = self._observers.get(task_id)
            self._forget(task_id)
            if observer is not None:
                log.warning("the replica running task %s is gone; its watcher here ends it as interrupted", task_id)
                await observer.on_end("failed", _("The task was interrupted: the replica running it stopped."))
        return len(orphans)

    async def _check_owners_forever(self) -> None:
        while True:
            await asyncio.sleep(OWNERS_CHECK_S)
            try:
                await self.end_orphans()
            except Exception:  # Redis is unreachable: the owners' keys cannot be read; look again later
                log.debug("could not check the owners of watched tasks", exc_info=True)
