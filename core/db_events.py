"""Cluster mode: "the registry changed" for every replica, on PostgreSQL `LISTEN/NOTIFY`.

Some of what a replica knows about agents is kept in memory: the remote A2A
agents registered by card URL live in its `AgentRegistry` as HTTP adapters.
When one replica registers or removes such an agent, or an admin creates, edits
or deletes an agent, it sends `NOTIFY a2a_registry` with
`{"kind", "id", "op", "replica"}`; every replica listens on a connection of its
own and hands the others' notices to the handler of their kind (the sender has
applied the change already). A notice is sent after the change is committed,
and a replica that was not listening (it was starting, or its connection
dropped) reads the database afresh when it (re)connects (`on_reconnect`).

Without cluster mode, or on SQLite, nothing is sent and nothing listens.
docs/ARCHITECTURE.md, "Cluster: the broker across replicas".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from core.aio import cancel_and_wait
from core.db import Database

log = logging.getLogger(__name__)

CHANNEL = "a2a_registry"
RECONNECT_S = 1.0

Handler = Callable[[str, str], Awaitable[None]]  # (agent id, op)


class RegistryEvents:
    """Sends and receives registry notices between replicas (see the module docstring)."""

    def __init__(self, db: Database, replica: str, *, enabled: bool) -> None:
        self.db = db
        self.replica = replica
        self.enabled = enabled and db.dialect == "postgresql"
        self.received = 0
        self._handlers: dict[str, Handler] = {}
        self._on_reconnect: list[Callable[[], Awaitable[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()

    def on(self, kind: str, handler: Handler) -> None:
        """Call `handler(agent_id, op)` for another replica's notice of this kind."""
        self._handlers[kind] = handler

    def on_reconnect(self, resync: Callable[[], Awaitable[None]]) -> None:
        """Call `resync()` after the listening connection was lost and is back (notices may have been missed)."""
        self._on_reconnect.append(resync)

    async def notify(self, kind: str, agent_id: str, op: str) -> None:
        """Tell the other replicas (after the change is committed); a failure is logged, never raised."""
        if not self.enabled:
            return
        payload = json.dumps({"kind": kind, "id": agent_id, "op": op, "replica": self.replica})
        try:
            async with self.db.engine.connect() as conn:
                await conn.execute(
                    text("SELECT pg_notify(:channel, :payload)"), {"channel": CHANNEL, "payload": payload}
                )
                await conn.commit()
        except Exception:
            log.warning("could not tell the other replicas that %s %s was %s", kind, agent_id, op, exc_info=True)

    @property
    def listening(self) -> bool:
        """Whether the other replicas' notices are being received now (always, without cluster mode: none are sent)."""
        return not self.enabled or self._listening.is_set()

    async def start(self) -> None:
        """Listen (returns once listening, or after a few seconds if the database does not answer)."""
        if not self.enabled:
            return
        self._task = asyncio.get_running_loop().create_task(self._listen_forever(), name="registry notices")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listening.wait(), 10)

    async def stop(self) -> None:
        """Stop listening."""
        await cancel_and_wait(self._task)
        self._task = None

    async def _listen_forever(self) -> None:
        import psycopg

        conninfo = make_url(self.db.url).set(drivername="postgresql").render_as_string(hide_password=False)
        first = True
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    if not first:  # (notices that come meanwhile wait in the connection)
                        for resync in self._on_reconnect:
                            await resync()
                    first = False
                    self._listening.set()  # after the resync: what was kept before it is not trusted until then
                    async for notice in conn.notifies():
                        await self._handle(notice.payload)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("listening for registry notices failed; listening again", exc_info=True)
            self._listening.clear()  # notices sent meanwhile are missed: `listening` says so until resynced
            await asyncio.sleep(RECONNECT_S)

    async def _handle(self, payload: str) -> None:
        try:
            notice: dict[str, Any] = json.loads(payload)
            kind, agent_id, op, sender = notice["kind"], str(notice["id"]), str(notice["op"]), notice["replica"]
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed registry notice: %.200s", payload)
            return
        if sender == self.replica:
            return
        self.received += 1
        handler = self._handlers.get(kind)
        if handler is None:
            return
        try:
            await handler(agent_id, op)
        except Exception:
            log.exception("applying another replica's change of %s %s failed", kind, agent_id)
