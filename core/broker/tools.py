"""The `a2a_<id>` tools: the app's own agents dispatch to broker agents in the background.

Seed 003's discovery builds one LLM tool per connected agent (`a2a_<id>`, input
`{task}`); a chat system offers those to its model, and a call becomes a
dispatch whose progress comes back as injects. This module makes the app's own
chat such a chat system: an agent with the `a2a-dispatch` tool is offered the
`a2a_<id>` tool of every broker agent bound to it (by its database id or its
slug) or global, when its turn starts.

A call returns at once (the model says the work is under way and the turn
ends). The task goes through `Broker.dispatch` like one from outside (throttled
`delay` progress, `auto` result, idle timeout), and is recorded as a delegation
too, so its stream shows in the side panel and in the audit view. Its injects
carry the chat session's id and come back into the chat through `core.broker.inbox.ChatInbox`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from core.broker.cluster import DirectoryEntry
from core.broker.connection import AgentConnection
from core.broker.service import user_owner
from core.chat.agents import A2A_DISPATCH
from core.chat.prompts import DISPATCH_TOOL_PREFIX as TOOL_NAME_PREFIX
from core.chat.tools import ToolContext, ToolResult
from core.delegation.service import DelegationRefusedError

if TYPE_CHECKING:
    from core.broker.service import Broker
    from core.delegation.service import DelegationService

log = logging.getLogger(__name__)

MAX_TASK_CHARS = 20_000

__all__ = ["TOOL_NAME_PREFIX", "BrokerDispatchTool", "BrokerDispatchTools"]


class BrokerDispatchTools:
    """The `a2a-dispatch` tool family: one `a2a_<id>` tool per broker agent the calling agent may use."""

    tool_type = A2A_DISPATCH

    def __init__(self, broker: Broker, delegation: DelegationService) -> None:
        self.broker = broker
        self.delegation = delegation

    def tools_for(self, agent_id: int | None, agent_slug: str) -> list[BrokerDispatchTool]:
        """The tools of the agents online now (cluster mode: on any replica) that are global or bound to this agent."""
        return [
            BrokerDispatchTool(self, conn.id, conn.tool)
            for conn in self.broker.agents()
            if conn.tool is not None and conn.closed is None and _binding_of(conn, agent_id, agent_slug)
        ]


def _binding_of(conn: AgentConnection | DirectoryEntry, agent_id: int | None, agent_slug: str) -> Any:
    """The chat agent id to dispatch under (seed 003 `agentId`), or None when the agent may not use `conn`.

    A global agent, or one bound to the numeric id, gets the numeric id (injects on
    `agent:events:<id>`); an agent bound to the slug gets the slug.
    """
    if conn.binding is None or (agent_id is not None and conn.binding == str(agent_id)):
        return agent_id if agent_id is not None else agent_slug
    return agent_slug if agent_slug and conn.binding == agent_slug else None


@dataclass(frozen=True, slots=True)
class BrokerDispatchTool:
    """`a2a_<id>`: dispatch a task to one broker agent and return at once."""

    family: BrokerDispatchTools
    a2a_id: str
    spec: dict[str, Any]  # seed 003's tool definition: name, description, inputSchema
    tool_type: str = A2A_DISPATCH

    @property
    def name(self) -> str:
        """`a2a_<id>`."""
        return str(self.spec["name"])

    @property
    def description(self) -> str:
        """From the agent's card and skills, plus how the call behaves."""
        return (
            f"{self.spec['description']} Runs in the background: the call returns at once, and the "
            "result arrives later in this chat as a system message."
        )

    @property
    def parameters(self) -> dict[str, Any]:
        """`{task: string}`, required."""
        schema: dict[str, Any] = self.spec["inputSchema"]
        return schema

    async def execute(self, arguments: Any, config: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Dispatch; the result is the broker's ack (the task runs on)."""
        if ctx.turnstile is not None:
            await ctx.turnstile.wait()
        try:
            return await self._dispatch(arguments, ctx)
        finally:
            if ctx.turnstile is not None:
                ctx.turnstile.release()

    async def _dispatch(self, arguments: Any, ctx: ToolContext) -> ToolResult:
        broker, metadata = self.family.broker, dict[str, Any](agentSlug=self.a2a_id)
        task = arguments.get("task") if isinstance(arguments, dict) else None
        if not isinstance(task, str) or not task.strip():
            return ToolResult(
                False, error=f"Invalid {self.name} call: 'task' must be a non-empty string.", metadata=metadata
            )
        if len(task) > MAX_TASK_CHARS:
            return ToolResult(
                False,
                error=f"Invalid {self.name} call: the task is {len(task):,} characters "
                f"long; the limit is {MAX_TASK_CHARS:,}.",
                metadata=metadata,
            )
        if ctx.session_id is None or ctx.recursion_depth > 0:
            return ToolResult(
                False,
                error="Background tasks can only be started from a user's own chat; use "
                "agent_invoke to delegate and wait for the answer.",
                metadata=metadata,
            )
        conn = broker.agent(self.a2a_id)
        chat_agent_id = _binding_of(conn, ctx.agent_id, ctx.agent_slug) if conn is not None else None
        if conn is None or chat_agent_id is None:
            return ToolResult(
                False, error=f"The agent {self.a2a_id!r} is no longer connected to the broker.", metadata=metadata
            )
        try:
            record = await self.family.delegation.open_background_task(self.a2a_id, conn.name, task.strip(), ctx)
        except DelegationRefusedError as exc:  # the user has too many tasks running: nothing was started
            return ToolResult(False, error=str(exc), metadata=metadata)
        metadata.update(taskId=record.task_id, calleeAgentName=conn.name, background=True)
        try:
            ack = await broker.dispatch(
                task=task.strip(),
                target_agent=self.a2a_id,
                agent_id=chat_agent_id,
                chat_id=ctx.session_id,
                owner=user_owner(ctx.user_id),
                task_id=record.task_id,
                session_id=ctx.session_id,
                observer=record,
            )
        except SQLAlchemyError:
            log.exception("could not save the background task %s", record.task_id)
            ack = {"status": "not_saved"}
        if ack.get("status") != "accepted":
            reason = (
                f"{conn.name} disconnected before the task could be sent."
                if ack.get("status") == "no_agent"
                else "The task could not be saved (the database is unavailable); nothing was started."
            )
            await record.on_end("failed", reason)
            return ToolResult(False, error=reason, metadata=metadata)
        return ToolResult(
            True,
            data=(
                f"{conn.name} is working on it in the background (task {record.task_id}). Its progress and "
                "result will arrive in this chat as system messages; tell the user it is under way."
            ),
            metadata=metadata,
        )
