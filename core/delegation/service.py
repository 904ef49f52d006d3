"""Agent delegation (seed 000 §3.2): the `agent_invoke` tool and the tasks behind it.

A delegation is a task: the callee gets a hidden session of its own (an
`agent_sessions` row plus an `a2a_task_sessions` row with `visible_in_sidebar=0`),
its run streams into the hub buffer `a2a_<taskId>`, and its messages are saved
with `source='a2a'` and the caller's context. The caller's model waits for the
result (the tool call is synchronous), while the page shows the callee's stream
in the side panel.

Events of a task buffer, in order: `state` {state: 'submitted'}, `state`
{state: 'working'}, then the callee's run as in a chat turn (`start`,
`text-delta`, `tool-*`, and `a2a-task-started` when the callee delegates in
turn), `error` {errorText} when it fails, a final `state` with the terminal
state (completed, failed, canceled), and `done` {state, error, durationMs,
usage}: the last event. The caller's buffer gets `a2a-task-started` {taskId,
calleeAgentSlug, calleeAgentName, toolCallId, parentTaskId, recursionDepth}
before the callee starts.

Refusals (bad arguments, unknown callee, not allowed, too deep, a cycle) are
tool errors the caller's model reads; no task is created and no panel opens.
The callee runs inside the caller's tool call, so stopping the caller's turn
cancels the delegation, and its own delegations, down the chain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlmodel import col, select

from core.chat import agents as agents_store
from core.chat import sessions as sessions_store
from core.chat.agents import AGENT_INVOKE, DEFAULT_AGENT_INVOKE_CONFIG
from core.chat.engine import ChatEngine
from core.chat.prompts import AGENT_INVOKE_TOOL
from core.chat.run import AgentRun, build_model_messages
from core.chat.tools import ToolContext, ToolRegistry, ToolResult
from core.db import Database
from core.delegation.registry import AgentRegistry, RemoteAgent
from core.streaming.background import BackgroundTasks
from core.streaming.hub import StreamHub
from models import A2ATaskSession, Agent, AgentMessage, utcnow

log = logging.getLogger(__name__)

SUBMITTED, WORKING, COMPLETED, FAILED, CANCELED = "submitted", "working", "completed", "failed", "canceled"
TERMINAL_STATES = frozenset({COMPLETED, FAILED, CANCELED})
MAX_INPUT_CHARS = 20_000


def task_stream_key(task_id: str) -> str:
    """The hub key of a task's events (seed 000: `a2a_${taskId}`)."""
    return f"a2a_{task_id}"


@dataclass(frozen=True, slots=True)
class InvokeLimits:
    """An agent's `agent-invoke` config, validated (seed 000 §3.2.4)."""

    max_recursion_depth: int
    timeout_s: float
    max_output_tokens: int | None
    allowed_agents: frozenset[str] | None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> InvokeLimits:
        """Limits from a tool config; missing or unusable values take the defaults."""
        merged = {**DEFAULT_AGENT_INVOKE_CONFIG, **{k: v for k, v in (config or {}).items() if v is not None}}
        allowed = merged.get("allowedAgents")
        return cls(
            max_recursion_depth=_positive_int(merged.get("maxRecursionDepth"), DEFAULT_AGENT_INVOKE_CONFIG["maxRecursionDepth"]),
            timeout_s=_positive_int(merged.get("timeoutMs"), DEFAULT_AGENT_INVOKE_CONFIG["timeoutMs"]) / 1000,
            max_output_tokens=_positive_int(merged.get("maxOutputTokens"), 0) or None,
            allowed_agents=frozenset(str(a) for a in allowed) if isinstance(allowed, list) else None,
        )


def _positive_int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def parse_invoke_arguments(arguments: Any) -> tuple[str, str]:
    """`(agentSlug, input)` from the model's arguments.

    Raises:
        ValueError: what is wrong, worded for the model to correct its call.
    """
    if not isinstance(arguments, dict):
        raise ValueError('arguments must be a JSON object like {"agentSlug": "coding-assistant", "input": "..."}')
    slug, text = arguments.get("agentSlug"), arguments.get("input")
    if not isinstance(slug, str) or not slug.strip():
        raise ValueError('"agentSlug" is required: the id of the agent to delegate to, as a string')
    if not isinstance(text, str) or not text.strip():
        raise ValueError('"input" is required: the request for that agent, as a non-empty string')
    if len(text) > MAX_INPUT_CHARS:
        raise ValueError(f'"input" is {len(text):,} characters long; the limit is {MAX_INPUT_CHARS:,}')
    return slug.strip(), text.strip()


@dataclass(slots=True)
class TaskView:
    """A delegated task as pages and the API show it."""

    id: str
    session_id: str
    parent_task_id: str | None
    caller_session_id: str | None
    caller_agent_slug: str | None
    caller_agent_name: str | None
    callee_agent_slug: str
    callee_agent_name: str
    tool_call_id: str | None
    input: str
    state: str
    error: str | None
    recursion_depth: int
    input_tokens: int
    output_tokens: int
    created_at: datetime
    finished_at: datetime | None
    live: bool = False  # its buffer is still in the hub (running, or finished recently)

    @property
    def duration_ms(self) -> int | None:
        """Wall time from creation to the terminal state (None while running)."""
        if self.finished_at is None:
            return None
        return int((self.finished_at - self.created_at).total_seconds() * 1000)


@dataclass(slots=True)
class TaskDetail:
    """One task with the callee's messages and its child tasks."""

    task: TaskView
    messages: list[AgentMessage]
    children: list[TaskView] = field(default_factory=list)


class DelegationService:
    """Creates and runs delegated tasks; reads them back for the panel and the audit view."""

    def __init__(
        self, db: Database, hub: StreamHub, engine: ChatEngine, tools: ToolRegistry,
        registry: AgentRegistry | None = None,
    ) -> None:
        self.db = db
        self.hub = hub
        self.engine = engine
        self.tools = tools
        self.registry = registry
        self.tasks_started = 0
        # Tasks started for callers outside the app (A2A clients), by task id: see `start_external_task`.
        self._external = BackgroundTasks()
        self._external_runs: dict[str, asyncio.Task[Any]] = {}

    # -- running -------------------------------------------------------------------------

    async def invoke(self, arguments: Any, config: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run one `agent_invoke` call to its end; never raises for bad input (cancellation passes).

        Parallel calls of one step create and announce their tasks in the model's order
        (`ctx.turnstile`), so tabs and task rows follow the mentions; then they run concurrently.
        """
        if ctx.turnstile is not None:
            await ctx.turnstile.wait()
        try:
            return await self._invoke(arguments, config, ctx)
        finally:
            if ctx.turnstile is not None:
                ctx.turnstile.release()

    async def _invoke(self, arguments: Any, config: dict[str, Any], ctx: ToolContext) -> ToolResult:
        started = time.monotonic()
        limits = InvokeLimits.from_config(config)
        try:
            slug, text = parse_invoke_arguments(arguments)
        except ValueError as exc:
            return ToolResult(False, error=f"Invalid agent_invoke call: {exc}.")
        depth = ctx.recursion_depth + 1
        refusal = self._refusal(slug, depth, limits, ctx)
        if refusal is not None:
            return ToolResult(False, error=refusal, metadata={"agentSlug": slug, "recursionDepth": depth})

        remote = self.registry.remote(slug) if self.registry is not None else None
        if remote is not None and ctx.agent_id is not None and not (
                remote.visible_to(ctx.agent_id) or remote.visible_to(ctx.agent_slug)):
            return ToolResult(False, error=f"Delegation refused: {slug!r} is bound to another agent and serves "
                              "only that agent.", metadata={"agentSlug": slug, "recursionDepth": depth})
        async with self.db.session() as s:
            callee = await agents_store.get_agent_by_slug(s, slug)
            if callee is None and remote is None:
                known = sorted({a.slug for a in await agents_store.list_agents(s)} | set(self._remote_ids()))
                known = [k for k in known if k not in ctx.chain]
                return ToolResult(
                    False,
                    error=f"There is no agent {slug!r}. Agents you can delegate to: {', '.join(known) or 'none'}.",
                    metadata={"agentSlug": slug, "recursionDepth": depth},
                )
            tool_rows = await agents_store.agent_tool_rows(s, callee.id) if callee is not None else []
            callee_name = callee.name if callee is not None else remote.name
            task, user_row = await self._create_task(
                s, slug, callee.id if callee is not None else None, text, depth, ctx
            )
        await self._announce(task.id, slug, callee_name, depth, ctx)
        key = task_stream_key(task.id)
        fields = _message_fields(task.id, ctx)
        if callee is not None:
            record: _RunRecord = _LocalRun(AgentRun(agent=callee, messages=build_model_messages(callee, [user_row]),
                                                    fields=fields))
        else:
            record = _RemoteRun(slug, fields)
        state, error = FAILED, None
        try:
            await self._set_state(task.id, WORKING, SUBMITTED)
            async with asyncio.timeout(limits.timeout_s):
                if isinstance(record, _LocalRun):
                    callee_ctx = ToolContext(
                        user_id=ctx.user_id, agent_id=callee.id, agent_slug=callee.slug, session_id=task.session_id,
                        recursion_depth=depth, task_id=task.id, chain=(*ctx.chain, callee.slug),
                    )
                    tools = self.tools.bind(tool_rows, agent_id=callee.id, agent_slug=callee.slug)
                    await self.engine.run_agent(
                        stream_key=key, run=record.run, tools=tools, ctx=callee_ctx,
                        max_output_tokens=limits.max_output_tokens,
                    )
                else:
                    await self._run_remote(key, remote, text, task.id, record)
            state, error = record.result()
        except TimeoutError:
            error = f"{callee_name} did not finish within {limits.timeout_s:g} s and was stopped."
            await self.hub.append(key, "error", {"errorText": error})
            record.mark_stopped(status="error", error=error)
        except asyncio.CancelledError:
            state, error = CANCELED, (
                "The delegation was stopped because the calling turn was stopped." if ctx.session_id
                else "The caller canceled the task.")
            record.mark_stopped(status="canceled", error=None)
            # Shielded: the record is written even if the cancelling caller gives up waiting.
            await asyncio.shield(self._finish(task.id, record, state, error, started))
            raise
        await self._finish(task.id, record, state, error, started)

        metadata = {
            "taskId": task.id, "agentSlug": slug, "calleeAgentName": callee_name,
            "recursionDepth": depth, "state": state, "durationMs": int((time.monotonic() - started) * 1000),
            "usage": {"inputTokens": record.input_tokens, "outputTokens": record.output_tokens},
        }
        text_out = record.text()
        if state == COMPLETED:
            return ToolResult(True, data=text_out, metadata=metadata)
        partial = f" It had said: {text_out}" if text_out else ""
        return ToolResult(False, error=f"{callee_name} failed: {error}{partial}", metadata=metadata)

    def _remote_ids(self) -> list[str]:
        return [a.id for a in self.registry.remote_agents()] if self.registry is not None else []

    async def _run_remote(self, key: str, remote: RemoteAgent, text: str, task_id: str, record: _RemoteRun) -> None:
        """Relay a remote agent's events into the task buffer until it reports a terminal state."""
        try:
            async for event in remote.stream(text, task_id=task_id):
                if event.text:
                    record.chunks.append(event.text)
                    await self.hub.append(key, "text-delta", {"id": "text-0", "delta": event.text})
                if event.error:
                    record.error = event.error
                if event.final or (event.state in TERMINAL_STATES):
                    record.state = event.state if event.state in TERMINAL_STATES else COMPLETED
                    if record.state == FAILED and not record.error:
                        record.error = f"{remote.name} reported that the task failed."
                    break
            else:
                record.state, record.error = FAILED, f"{remote.name} ended the stream without a final state."
        except (ConnectionError, OSError, RemoteAgentError) as exc:
            record.state, record.error = FAILED, f"{remote.name} is unreachable: {exc}"
        if record.state == FAILED and record.error:
            await self.hub.append(key, "error", {"errorText": record.error})

    def _refusal(self, slug: str, depth: int, limits: InvokeLimits, ctx: ToolContext) -> str | None:
        if depth > limits.max_recursion_depth:
            return (
                f"Delegation refused: this would be delegation level {depth}, and the limit is "
                f"{limits.max_recursion_depth}. Answer with what you have instead."
            )
        if slug in ctx.chain:
            return (
                f"Delegation refused: {slug!r} is already working on this request "
                f"({' → '.join([*ctx.chain, slug])}); delegating to it again would loop."
            )
        if limits.allowed_agents is not None and slug not in limits.allowed_agents:
            allowed = ", ".join(sorted(limits.allowed_agents)) or "none"
            return f"Delegation refused: {slug!r} is not one of the agents this agent may call ({allowed})."
        return None

    async def _announce(self, task_id: str, slug: str, callee_name: str, depth: int, ctx: ToolContext) -> None:
        """Open a new task's buffer and tell the caller (`a2a-task-started`); the next call may then start."""
        key = task_stream_key(task_id)
        meta = {
            "taskId": task_id, "userId": ctx.user_id, "callerSessionId": ctx.session_id,
            "calleeAgentSlug": slug, "calleeAgentName": callee_name, "parentTaskId": ctx.task_id,
            "toolCallId": ctx.tool_call_id, "recursionDepth": depth,
        }
        await self.hub.create(key, meta=meta)
        await self.hub.append(key, "state", {"state": SUBMITTED})
        self.tasks_started += 1
        if ctx.emit is not None:
            await ctx.emit("a2a-task-started", {
                "taskId": task_id, "calleeAgentSlug": slug, "calleeAgentName": callee_name,
                "toolCallId": ctx.tool_call_id, "parentTaskId": ctx.task_id, "recursionDepth": depth,
            })
        if ctx.turnstile is not None:
            ctx.turnstile.release()  # announced: the next call of this step may start

    async def open_background_task(self, agent_id: str, agent_name: str, text: str,
                                   ctx: ToolContext) -> BackgroundTask:
        """A delegated task for work that runs elsewhere while the caller's turn goes on (a broker dispatch).

        The task is recorded like any delegation (task row, hidden session, `source='a2a'`
        messages, buffer `a2a_<taskId>`, `a2a-task-started` to the caller, so the side panel
        shows it); the returned `BackgroundTask` is fed the work's text and its end.
        """
        depth = ctx.recursion_depth + 1
        async with self.db.session() as s:
            task, _ = await self._create_task(s, agent_id, None, text, depth, ctx)
        await self._announce(task.id, agent_id, agent_name, depth, ctx)
        await self._set_state(task.id, WORKING, SUBMITTED)
        return BackgroundTask(self, task.id, _RemoteRun(agent_id, _message_fields(task.id, ctx)))

    async def _create_task(
        self, s, slug: str, callee_id: int | None, text: str, depth: int, ctx: ToolContext
    ) -> tuple[A2ATaskSession, AgentMessage]:
        # A remote callee has no local agent row: its hidden session belongs to the caller's agent
        # (a caller outside the app has none: then to the oldest local agent, a placeholder never shown).
        owner_id = callee_id if callee_id is not None else ctx.agent_id
        if owner_id is None:
            owner_id = (await s.exec(select(Agent.id).order_by(col(Agent.id)).limit(1))).first()
        hidden = await sessions_store.create_session(
            s, user_id=ctx.user_id, agent_id=owner_id,
            title=sessions_store.make_title(f"Task: {text}"),
        )
        task = A2ATaskSession(
            session_id=hidden.id, callee_agent_id=callee_id, callee_agent_slug=slug,
            caller_user_id=ctx.user_id, caller_agent_id=ctx.agent_id, caller_session_id=ctx.session_id,
            parent_task_id=ctx.task_id, recursion_depth=depth, state=SUBMITTED, visible_in_sidebar=0,
            input=text, tool_call_id=ctx.tool_call_id or None,
        )
        s.add(task)
        await s.commit()
        await s.refresh(task)
        [user_row] = await sessions_store.add_messages(s, session_id=hidden.id, messages=[{
            "role": "user", "content": text, "source": "a2a", "a2a_task_id": task.id,
            "caller_agent_id": ctx.agent_id, "caller_session_id": ctx.session_id,
        }])
        return task, user_row

    async def _set_state(self, task_id: str, state: str, previous: str, error: str | None = None) -> None:
        async with self.db.session() as s:
            row = await s.get(A2ATaskSession, task_id)
            if row is not None:
                row.state, row.error, row.updated_at = state, error, utcnow()
                if state in TERMINAL_STATES:
                    row.finished_at = row.updated_at
                s.add(row)
                await s.commit()
        data = {"state": state, "previous": previous}
        if error:
            data["error"] = error
        await self.hub.append(task_stream_key(task_id), "state", data)

    async def _finish(self, task_id: str, record: _RunRecord, state: str, error: str | None, started: float) -> None:
        """Save the callee's answer and totals, then end the task's stream (runs once per task)."""
        key = task_stream_key(task_id)
        try:
            rows = record.rows()
            async with self.db.session() as s:
                row = await s.get(A2ATaskSession, task_id)
                if rows and row is not None:
                    await sessions_store.add_messages(s, session_id=row.session_id, messages=rows)
                    row = await s.get(A2ATaskSession, task_id)
                if row is not None:
                    row.input_tokens, row.output_tokens = record.input_tokens, record.output_tokens
                    s.add(row)
                    await s.commit()
            if state == CANCELED:
                await self.hub.append(key, "error", {"errorText": error})
            await self._set_state(task_id, state, WORKING, error)
        except Exception:
            log.exception("could not record the end of task %s", task_id)
        finally:
            await self.hub.append(key, "done", {
                "state": state, "error": error, "durationMs": int((time.monotonic() - started) * 1000),
                "usage": {"inputTokens": record.input_tokens, "outputTokens": record.output_tokens},
            })
            await self.hub.finish(key, error=error if state != COMPLETED else None)

    # -- tasks for callers outside the app (A2A JSON-RPC, issue 6) ---------------------------

    async def start_external_task(
        self, agent_slug: str, text: str, *, user_id: int, config: dict[str, Any] | None = None
    ) -> str:
        """Start a delegation for a caller outside the app (an A2A client); returns its id once it exists.

        The task is an ordinary delegation (hidden session, `source='a2a'` messages, hub buffer
        `a2a_<taskId>`, the audit view), with no caller agent and no caller session, owned by
        `user_id`. It runs in the background until it ends, `cancel_external_task` stops it, or
        the service shuts down; `config` is an `agent-invoke` config (limits; default limits when None).

        Raises:
            DelegationRefused: no such agent, or the request is not acceptable; the message says why.
        """
        loop = asyncio.get_running_loop()
        created: asyncio.Future[str] = loop.create_future()

        async def on_event(type: str, data: dict[str, Any]) -> None:
            if type == "a2a-task-started" and not created.done():
                created.set_result(data["taskId"])

        # No caller agent or session: the task and its messages record None for both.
        ctx = ToolContext(user_id=user_id, agent_id=None, agent_slug="", session_id=None,  # type: ignore[arg-type]
                          emit=on_event)
        arguments = {"agentSlug": agent_slug, "input": text}
        run = self._external.spawn(self.invoke(arguments, config or {}, ctx), name=f"a2a task for {agent_slug}")
        await asyncio.wait([created, run], return_when=asyncio.FIRST_COMPLETED)
        if not created.done():  # refused before a task existed
            result: ToolResult = run.result()
            raise DelegationRefused(result.error or f"The delegation to {agent_slug!r} was refused.")
        task_id = created.result()
        self._external_runs[task_id] = run
        run.add_done_callback(lambda _done: self._external_runs.pop(task_id, None))
        return task_id

    async def wait_external_task(self, task_id: str, timeout: float | None = None) -> None:
        """Wait until a task started by `start_external_task` ends (returns at once when none runs)."""
        run = self._external_runs.get(task_id)
        if run is not None:
            await asyncio.wait([run], timeout=timeout)

    async def cancel_external_task(self, task_id: str, timeout: float = 10.0) -> bool:
        """Stop a task started by `start_external_task` and wait until it is recorded as canceled.

        Returns False when no such task runs in this process.
        """
        run = self._external_runs.get(task_id)
        if run is None or run.done():
            return False
        run.cancel()
        await asyncio.wait([run], timeout=timeout)
        return True

    async def shutdown_external_tasks(self) -> None:
        """Cancel every task started by `start_external_task` (each records itself as canceled)."""
        await self._external.shutdown()

    # -- reading -------------------------------------------------------------------------

    async def owned_task(self, user_id: int, task_id: str) -> A2ATaskSession | None:
        """The task if `user_id` owns the conversation it belongs to, else None."""
        async with self.db.session() as s:
            row = await s.get(A2ATaskSession, task_id)
        return row if row is not None and row.caller_user_id == user_id else None

    async def fail_interrupted(self) -> int:
        """At start-up: tasks still submitted or working were cut off by a stop; mark them failed."""
        reason = "The server stopped while this task was running."
        async with self.db.session() as s:
            rows = list((await s.exec(select(A2ATaskSession).where(
                col(A2ATaskSession.state).in_([SUBMITTED, WORKING])
            ))).all())
            now = utcnow()
            for row in rows:
                row.state, row.error, row.updated_at, row.finished_at = FAILED, reason, now, now
                s.add(row)
            await s.commit()
        return len(rows)

    async def tasks_of_session(self, user_id: int, session_id: str) -> list[TaskView]:
        """Every task started from a session, nested ones included, parents before children."""
        async with self.db.session() as s:
            names = await _agent_names(s)
            found: list[A2ATaskSession] = []
            frontier = [session_id]
            seen: set[str] = set()
            while frontier:
                query = select(A2ATaskSession).where(
                    col(A2ATaskSession.caller_session_id).in_(frontier), A2ATaskSession.caller_user_id == user_id
                ).order_by(col(A2ATaskSession.created_at), col(A2ATaskSession.id))
                rows = [r for r in (await s.exec(query)).all() if r.id not in seen]
                seen.update(r.id for r in rows)
                found.extend(rows)
                frontier = [r.session_id for r in rows]
        return [self._view(r, names) for r in found]

    async def list_tasks(self, user_id: int, *, limit: int = 200) -> list[TaskView]:
        """A user's delegated tasks, newest first (the audit view)."""
        async with self.db.session() as s:
            names = await _agent_names(s)
            query = (
                select(A2ATaskSession).where(A2ATaskSession.caller_user_id == user_id)
                .order_by(col(A2ATaskSession.created_at).desc(), col(A2ATaskSession.id)).limit(limit)
            )
            rows = list((await s.exec(query)).all())
        return [self._view(r, names) for r in rows]

    async def task_detail(self, user_id: int, task_id: str) -> TaskDetail | None:
        """One of the user's tasks with the callee's saved messages and its direct children."""
        async with self.db.session() as s:
            row = await s.get(A2ATaskSession, task_id)
            if row is None or row.caller_user_id != user_id:
                return None
            names = await _agent_names(s)
            messages = await sessions_store.list_messages(s, session_id=row.session_id)
            query = select(A2ATaskSession).where(A2ATaskSession.parent_task_id == task_id).order_by(
                col(A2ATaskSession.created_at), col(A2ATaskSession.id)
            )
            children = list((await s.exec(query)).all())
        return TaskDetail(self._view(row, names), messages, [self._view(c, names) for c in children])

    def _view(self, row: A2ATaskSession, names: dict[int, tuple[str, str]]) -> TaskView:
        caller = names.get(row.caller_agent_id or -1)
        callee = names.get(row.callee_agent_id or -1)
        remote = self.registry.remote(row.callee_agent_slug) if self.registry and callee is None else None
        if remote is not None:
            callee = (remote.id, remote.name)
        return TaskView(
            id=row.id, session_id=row.session_id, parent_task_id=row.parent_task_id,
            caller_session_id=row.caller_session_id,
            caller_agent_slug=caller[0] if caller else None, caller_agent_name=caller[1] if caller else None,
            callee_agent_slug=row.callee_agent_slug, callee_agent_name=callee[1] if callee else row.callee_agent_slug,
            tool_call_id=row.tool_call_id, input=row.input, state=row.state, error=row.error,
            recursion_depth=row.recursion_depth, input_tokens=row.input_tokens, output_tokens=row.output_tokens,
            created_at=row.created_at, finished_at=row.finished_at,
            live=self.hub.get(task_stream_key(row.id)) is not None,
        )


async def _agent_names(s) -> dict[int, tuple[str, str]]:
    return {a.id: (a.slug, a.name) for a in await agents_store.list_agents(s)}


class RemoteAgentError(RuntimeError):
    """A remote agent failed at the protocol level (raised by `RemoteAgent.stream` adapters)."""


class DelegationRefused(ValueError):
    """A delegation that was not started (unknown agent, bad input, limits); the message says why."""


class _LocalRun:
    """The record of a local callee's run (the chat engine's `AgentRun`)."""

    def __init__(self, run: AgentRun) -> None:
        self.run = run

    @property
    def input_tokens(self) -> int:
        return self.run.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.run.output_tokens

    def result(self) -> tuple[str, str | None]:
        outcome = self.run.outcome
        return (COMPLETED, None) if outcome is not None and outcome.status == "complete" else (
            FAILED, outcome.error if outcome else "the agent did not answer")

    def mark_stopped(self, *, status: str, error: str | None) -> None:
        outcome = self.run.outcome
        if outcome is None or status == "canceled":
            return
        outcome.status, outcome.error = status, error
        for row in outcome.rows:
            if row.get("status") == "canceled":
                row["status"], row["error"] = status, error

    def rows(self) -> list[dict[str, Any]]:
        return self.run.outcome.rows if self.run.outcome else []

    def text(self) -> str:
        return self.run.outcome.text if self.run.outcome else ""


@dataclass(slots=True)
class _RemoteRun:
    """The record of a remote callee's answer, relayed chunk by chunk."""

    agent_id: str
    fields: dict[str, Any]
    chunks: list[str] = field(default_factory=list)
    state: str | None = None
    error: str | None = None
    status: str = "complete"
    input_tokens: int = 0
    output_tokens: int = 0

    def result(self) -> tuple[str, str | None]:
        if self.state == COMPLETED:
            return COMPLETED, None
        if self.state == CANCELED:
            return CANCELED, self.error or "the remote agent canceled the task"
        self.status = "error"
        return FAILED, self.error or "the remote agent failed"

    def mark_stopped(self, *, status: str, error: str | None) -> None:
        self.status, self.error = status, error

    def rows(self) -> list[dict[str, Any]]:
        if not self.chunks and self.status == "complete":
            return []
        return [{"role": "assistant", "content": self.text(), "model_id": f"a2a/{self.agent_id}",
                 "status": self.status, "error": self.error, **self.fields}]

    def text(self) -> str:
        return "".join(self.chunks)


_RunRecord = _LocalRun | _RemoteRun


def _message_fields(task_id: str, ctx: ToolContext) -> dict[str, Any]:
    """The columns every message of a delegated task carries (seed 000 §3.1)."""
    return {"source": "a2a", "a2a_task_id": task_id, "caller_agent_id": ctx.agent_id,
            "caller_session_id": ctx.session_id}


class BackgroundTask:
    """The record of a task that runs elsewhere (see `DelegationService.open_background_task`).

    `on_text` appends to the task's stream and saved answer; `on_end` records how it ended
    (once). Both are what the broker's relay calls (`core.broker.service.TaskObserver`).
    """

    # The broker's end states, as task states: a timeout is a failure, an agent that needs
    # more input has ended its turn (its text says what it needs).
    _STATES = {"completed": COMPLETED, "canceled": CANCELED, "input-required": COMPLETED,
               "auth-required": COMPLETED}

    def __init__(self, service: DelegationService, task_id: str, record: _RemoteRun) -> None:
        self.service = service
        self.task_id = task_id
        self.record = record
        self.ended = False
        self._started = time.monotonic()

    async def on_text(self, text: str) -> None:
        """A piece of the agent's answer."""
        if self.ended or not text:
            return
        self.record.chunks.append(text)
        await self.service.hub.append(task_stream_key(self.task_id), "text-delta", {"id": "text-0", "delta": text})

    async def on_end(self, state: str, text: str) -> None:
        """The work is over: `state` as the broker names it, `text` its closing words."""
        if self.ended:
            return
        self.ended = True
        final = self._STATES.get(state, FAILED)
        error = None if final == COMPLETED else text or f"the task ended as {state}"
        self.record.state = final
        if final != COMPLETED:
            self.record.mark_stopped(status="canceled" if final == CANCELED else "error", error=error)
            if final == FAILED:
                await self.service.hub.append(task_stream_key(self.task_id), "error", {"errorText": error})
        await self.service._finish(self.task_id, self.record, final, error, self._started)


class AgentInvokeTool:
    """The `agent_invoke` tool (seed 000 §3.2.4): delegate a request to another agent and wait for its answer."""

    tool_type = AGENT_INVOKE
    name = AGENT_INVOKE_TOOL
    description = (
        "Delegate a request to another agent and get its answer. Use it when another agent is better "
        "suited (for example coding-assistant for code). The other agent's reply is shown to the user live."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "agentSlug": {"type": "string", "description": "Id of the agent to delegate to, e.g. coding-assistant"},
            "input": {"type": "string", "description": "The complete request for that agent"},
        },
        "required": ["agentSlug", "input"],
        "additionalProperties": False,
    }

    def __init__(self, service: DelegationService) -> None:
        self.service = service

    async def execute(self, arguments: Any, config: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run the delegation (see `DelegationService.invoke`)."""
        return await self.service.invoke(arguments, config, ctx)
