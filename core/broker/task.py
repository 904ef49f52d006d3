"""A dispatched broker task as the broker keeps it, and who may follow or own it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.broker.connection import AgentConnection
from core.broker.task_log import TaskLog


class TaskObserver(Protocol):
    """Follows one dispatched task besides its injects (the app's own dispatches: the side panel)."""

    async def on_text(self, text: str) -> None:
        """The text of one event, as it arrives (not throttled)."""
        ...

    async def on_end(self, state: str, text: str) -> None:
        """The task ended (completed, failed, canceled, timeout, input-required...) with this closing text."""
        ...


OPEN_OWNER = "open"  # tasks dispatched in the seed's open mode (broker_open_dispatch: trusted networks only)
DISPATCH_TOKEN_OWNER = "dispatch-token"  # tasks dispatched with the settings' broker_dispatch_token


USER_OWNER_PREFIX = "user:"


def user_owner(user_id: int) -> str:
    """The owner of the tasks a user dispatches (with an API key, or from the app's own chat)."""
    return f"{USER_OWNER_PREFIX}{user_id}"


def owner_user_id(owner: str) -> int | None:
    """The user id in an owner `user:<id>` (`user_owner`'s); None for the token and open-mode owners."""
    if not owner.startswith(USER_OWNER_PREFIX):
        return None
    try:
        return int(owner[len(USER_OWNER_PREFIX) :])
    except ValueError:
        return None


@dataclass(slots=True)
class BrokerTask:
    """One dispatched task, as the broker page and stats see it."""

    id: str
    agent: AgentConnection
    chat_agent_id: Any
    chat_id: str
    text: str
    owner: str = OPEN_OWNER  # who dispatched it: `user:<id>` (an API key or the app's chat), a token, open mode
    session_id: str | None = None  # the app's own chat session that dispatched it
    mac_address: str | None = None
    state: str = "submitted"
    last_text: str = ""
    events: int = 0
    injects: int = 0
    throttled: int = 0
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    remote_task_id: str | None = None
    cancel_requested: bool = False
    first_inject_at: float | None = None
    runner: asyncio.Task[None] | None = None
    observer: TaskObserver | None = None
    task_log: TaskLog | None = None  # the task's events in the hub stream `a2a_<id>` (core.broker.task_log)
    _last_delay: float = float("-inf")

    def view(self) -> dict[str, Any]:
        """A JSON-able summary."""
        return {
            "taskId": self.id,
            "targetAgent": self.agent.id,
            "agentName": self.agent.name,
            "agentId": self.chat_agent_id,
            "chatId": self.chat_id,
            "task": self.text,
            "state": self.state,
            "lastProgress": self.last_text,
            "events": self.events,
            "injects": self.injects,
            "throttled": self.throttled,
            "remoteTaskId": self.remote_task_id,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
            "finishedAt": self.finished_at,
        }
