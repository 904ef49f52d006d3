"""The app's one agent registry (docs/ARCHITECTURE.md, "The one registry").

Local agents live in the database (`agents`, slug = id). Remote agents (dialed
in over the `/a2a` WebSocket, or registered by the URL of an A2A agent card)
live here while they are reachable, each behind a `RemoteAgent` adapter. An id
is unique across both kinds: `claim` refuses an id a local agent already has
or another remote agent holds.

Whatever reaches an agent by id (the `agent_invoke` tool, dispatch, the A2A
JSON-RPC server) asks `DelegationService`, which looks the id up locally first
and then here, and runs a remote agent through `RemoteAgent.stream`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.chat import agents as agents_store
from core.db import Database
from core.errors import AppError


@dataclass(frozen=True, slots=True)
class RemoteEvent:
    """One piece of a remote agent's answer, already out of its wire format.

    Attributes:
        text: text to show after what was shown so far (the side panel's stream; may be empty).
        state: the task state the remote agent reported, if it did (working, completed, failed, canceled, ...).
        final: the remote agent says this is its last event.
        error: why it failed, when it failed.
        answer: on the final event, the agent's answer as an A2A client reads it (its artifacts, else its
            final status message): the task's result. None: the text shown is the answer.
        status_text: `text` is a status message's (the answer streamed, or a progress note: which, is known
            when an artifact comes; `core/delegation/notes.py` lays them out).
        question: with `state` `input-required` or `auth-required`: what the agent asks (its status message).
    """

    text: str = ""
    state: str | None = None
    final: bool = False
    error: str | None = None
    answer: str | None = None
    status_text: bool = False
    question: str | None = None


#: How a remote run asks its caller back: `await ask(state, question)` is the caller's answer (issue 36).
Asker = Callable[[str, str], Awaitable[str]]


class RemoteAgent(Protocol):
    """An agent that runs elsewhere; adapters: broker WebSocket agents, HTTP A2A agents."""

    id: str
    name: str
    description: str
    kind: str  # 'ws' (dialed in to /a2a) | 'http' (registered by card URL)

    def stream(
        self, text: str, *, task_id: str, context_id: str | None = None, ask: Asker | None = None
    ) -> AsyncIterator[RemoteEvent]:
        """Send `text` as a new task and yield its events until the task ends.

        Cancelling the iteration (the caller's task is cancelled) must also cancel
        the remote task, as far as the remote protocol allows. When the agent asks back
        (`input-required`, `auth-required`) and `ask` is given, an adapter that can answer
        awaits `ask(state, question)` and sends the answer into the same remote task; one
        that cannot (or without `ask`) ends with the question as the answer.
        """
        ...

    def card(self) -> dict[str, Any]:
        """What the registry shows about the agent (name, description, skills)."""
        ...

    def visible_to(self, agent_id: Any) -> bool:
        """Whether the local agent with that id (database id or slug) may call it (broker agents may be bound)."""
        ...


class RemoteAgentError(AppError, RuntimeError):
    """A remote agent failed at the protocol level (raised by `RemoteAgent.stream` adapters)."""

    code = "remote_agent_error"


class IdTakenError(AppError, ValueError):
    """The id is a local agent's or another remote agent's; the message says which."""

    code = "id_taken"


@dataclass(slots=True)
class AgentRegistry:
    """Remote agents by id, next to the local agents in the database."""

    db: Database
    _remote: dict[str, RemoteAgent] = field(default_factory=dict)
    _listeners: list[Callable[[str, RemoteAgent | None], Awaitable[None] | None]] = field(default_factory=list)
    # Cluster mode: why an id is taken on another replica (the broker's directory), or None.
    taken_elsewhere: Callable[[str], str | None] | None = None

    async def claim(self, agent: RemoteAgent) -> None:
        """Add a remote agent under its id.

        Raises:
            IdTakenError: a local agent has that id, or a remote agent is already online under it (in cluster
                mode: on any replica).
        """
        if agent.id in self._remote:
            raise IdTakenError(f"an agent with the id {agent.id!r} is already connected")
        elsewhere = self.taken_elsewhere(agent.id) if self.taken_elsewhere is not None else None
        if elsewhere is not None:
            raise IdTakenError(elsewhere)
        async with self.db.session() as s:
            if await agents_store.get_agent_by_slug(s, agent.id) is not None:
                raise IdTakenError(f"{agent.id!r} is the id of a local agent; choose another id")
        self._remote[agent.id] = agent
        await self._notify(agent.id, agent)

    async def release(self, agent_id: str, agent: RemoteAgent | None = None) -> None:
        """Remove a remote agent (only that instance, when given)."""
        current = self._remote.get(agent_id)
        if current is None or (agent is not None and current is not agent):
            return
        del self._remote[agent_id]
        await self._notify(agent_id, None)

    def remote(self, agent_id: str) -> RemoteAgent | None:
        """The remote agent with that id, if online or registered."""
        return self._remote.get(agent_id)

    def remote_agents(self) -> list[RemoteAgent]:
        """Every remote agent, by id."""
        return [self._remote[k] for k in sorted(self._remote)]

    def on_change(self, listener: Callable[[str, RemoteAgent | None], Awaitable[None] | None]) -> None:
        """Call `listener(id, agent or None)` when a remote agent comes or goes, or an agent changes."""
        self._listeners.append(listener)

    async def changed(self, agent_id: str, _op: str = "") -> None:
        """An agent was created, edited or deleted (here, or on another replica): tell the listeners."""
        await self._notify(agent_id, self._remote.get(agent_id))

    async def _notify(self, agent_id: str, agent: RemoteAgent | None) -> None:
        for listener in list(self._listeners):
            result = listener(agent_id, agent)
            if result is not None:
                await result
