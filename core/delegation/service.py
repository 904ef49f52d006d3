"""Agent delegation (seed 000 §3.2): running the tasks behind `agent_invoke`, for callers in and outside the app.

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

Refusals (bad arguments, unknown callee, not allowed, too deep, a cycle, too many
running tasks of the user) are tool errors the caller's model reads; no task is
created and no panel opens. The callee runs inside the caller's tool call, so
stopping the caller's turn cancels the delegation, and its own delegations, down
the chain.

With accounts, one user may have at most `max_running_tasks_per_user` tasks
running (`submitted` or `working`, counted from the task rows, so on every
replica); a start over it is refused (`TooManyDelegatedTasksError`). The user's starts
take turns (a lock held until the new row is committed), so the count never
lets more through than the limit (docs/ARCHITECTURE.md, "Running work per user").

The task rows are written and read by `core.delegation.tasks.TaskRecords`; the
tool's arguments and limits are `core.delegation.tool`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sqlmodel.ext.asyncio.session import AsyncSession

from core import metrics
from core.chat import agents as agents_store
from core.chat import sessions as sessions_store
from core.chat.engine import ChatEngine
from core.chat.errors import RUNNING_LIMIT_RETRY_AFTER_S
from core.chat.run import AgentRun, build_model_messages
from core.chat.tools import ToolContext, ToolRegistry, ToolResult
from core.db import RUNNING_WORK_LOCK_KEY, Database
from core.delegation.artifacts import TaskFiles
from core.delegation.errors import (
    TOO_MANY_RUNNING_TASKS,
    DelegationRefusedError,
    TooManyDelegatedTasksError,
    failure_text,
)
from core.delegation.questions import ASK_USER, TaskQuestions
from core.delegation.reads import TaskReads
from core.delegation.registry import AgentRegistry
from core.delegation.runs import BackgroundTask, LocalRun, RemoteRun, RunRecord, hop_span, message_fields
from core.delegation.states import TIMED_OUT
from core.delegation.tasks import (
    CANCELED,
    COMPLETED,
    FAILED,
    SUBMITTED,
    WORKING,
    TaskRecords,
    state_event,
    task_stream_key,
)
from core.delegation.tool import InvokeLimits, parse_invoke_arguments
from core.i18n import _
from core.streaming import events as ev
from core.streaming.backend import StreamHubBackend
from core.streaming.background import BackgroundTasks
from core.streaming.redis_hub import RedisStreamHub
from models import A2ATaskSession

log = logging.getLogger(__name__)

__all__ = ["DelegationRefusedError", "DelegationService", "TooManyDelegatedTasksError"]


class DelegationService(TaskReads):
    """Creates and runs delegated tasks: local callees through the chat engine, remote ones through their adapter.

    Over 300 lines on purpose: a task's life (refusals, creation, announcement, run, end) for each
    kind of caller (a chat's tool call, a broker dispatch, an A2A client) is one path that reads best
    in one place; what stands alone is elsewhere (rows `tasks.py`, run records and the remote relay
    `runs.py`, limits and refusals `tool.py`, events `core.streaming.events`).

    The task rows are `TaskRecords`' (`self.records`); the reads at the end of this class
    hand over to it, so pages and routes keep one entry point. `max_running_tasks_per_user`
    limits one user's running tasks (None: no limit, single-user mode; set by `Services.prepare`).
    """

    def __init__(
        self,
        db: Database,
        hub: StreamHubBackend,
        engine: ChatEngine,
        tools: ToolRegistry,
        registry: AgentRegistry | None = None,
        *,
        max_running_tasks_per_user: int | None = None,
    ) -> None:
        self.max_running_tasks_per_user = max_running_tasks_per_user
        self.db = db
        self.hub = hub
        self.engine = engine
        self.tools = tools
        self.registry = registry
        self.records = TaskRecords(db, hub, registry)
        self.questions = TaskQuestions(self.records)  # callees that ask back (issue 36)
        self.files = TaskFiles(db)  # the files a delegation passes on and brings back (Services sets its links)
        self.tasks_started = 0
        # Tasks started for callers outside the app (A2A clients), by task id: see `start_external_task`.
        self._external = BackgroundTasks()
        self._external_runs: dict[str, asyncio.Task[Any]] = {}
        if isinstance(hub, RedisStreamHub):  # a cluster: CancelTask on any replica reaches the one running it
            hub.on_cancel(self._cancel_here)

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

    async def _invoke(
        self,
        arguments: Any,
        config: dict[str, Any],
        ctx: ToolContext,
        *,
        session_id: str | None = None,
        message_id: str | None = None,
        task_row: asyncio.Future[A2ATaskSession] | None = None,
    ) -> ToolResult:
        """Run one delegation; `session_id` continues a hidden session (an A2A context), see `create_task`.

        `task_row` is given the task's row as written once the task is announced.
        """
        started = time.monotonic()
        limits = InvokeLimits.from_config(config).for_call(arguments)
        try:
            slug, text = parse_invoke_arguments(arguments)
        except ValueError as exc:
            return ToolResult(False, error=f"Invalid agent_invoke call: {exc}.")
        depth = ctx.recursion_depth + 1
        files = await self.files.of_caller(ctx)
        refusal = limits.refusal(slug, depth, ctx.chain)
        if refusal is not None:
            return ToolResult(False, error=refusal, metadata={"agentSlug": slug, "recursionDepth": depth})

        remote = self.registry.remote(slug) if self.registry is not None else None
        if (
            remote is not None
            and ctx.agent_id is not None
            and not (remote.visible_to(ctx.agent_id) or remote.visible_to(ctx.agent_slug))
        ):
            return ToolResult(
                False,
                error=f"Delegation refused: {slug!r} is bound to another agent and serves only that agent.",
                metadata={"agentSlug": slug, "recursionDepth": depth},
            )
        async with self.db.session() as s:
            callee = await agents_store.get_agent_by_slug(s, slug)
            tool_rows: list[tuple[str, dict[str, Any]]] = []
            if callee is not None:
                assert callee.id is not None  # a row read from the database
                tool_rows, callee_name = await agents_store.agent_tool_rows(s, callee.id), callee.name
            elif remote is not None:
                callee_name = remote.name
            else:
                known = sorted({a.slug for a in await agents_store.list_agents(s)} | set(self._remote_ids()))
                known = [k for k in known if k not in ctx.chain]
                return ToolResult(
                    False,
                    error=f"There is no agent {slug!r}. Agents you can delegate to: {', '.join(known) or 'none'}.",
                    metadata={"agentSlug": slug, "recursionDepth": depth},
                )
            try:
                await self._check_running_tasks(s, ctx.user_id)
            except TooManyDelegatedTasksError as exc:
                return ToolResult(
                    False,
                    error=str(exc),
                    metadata={"agentSlug": slug, "recursionDepth": depth, "code": TOO_MANY_RUNNING_TASKS},
                )
            task, user_row = await self.records.create_task(
                s,
                slug,
                callee.id if callee is not None else None,
                text,
                depth,
                ctx,
                session_id=session_id,
                message_id=message_id,
                files=files,
            )
            # In a continued context the callee sees the earlier exchanges too.
            history = (
                await sessions_store.list_messages(s, session_id=task.session_id)
                if session_id is not None
                else [user_row]
            )
        await self._announce(task.id, slug, callee_name, depth, ctx)
        if task_row is not None and not task_row.done():  # done: the caller gave up waiting (cancelled)
            task_row.set_result(task)
        key = task_stream_key(task.id)
        fields = message_fields(task.id, ctx)
        if callee is not None:
            record: RunRecord = LocalRun(
                AgentRun(agent=callee, messages=build_model_messages(callee, history), fields=fields)
            )
        else:
            record = RemoteRun(slug, fields)
        state, error, returned = FAILED, None, ""
        try:
            await self.records.set_state(task.id, WORKING, SUBMITTED)
            async with asyncio.timeout(limits.timeout_s):
                with hop_span(task.id, slug, depth, remote=callee is None):  # the callee's run is its child
                    if isinstance(record, LocalRun):
                        agent = record.run.agent
                        callee_ctx = ToolContext(
                            user_id=ctx.user_id,
                            agent_id=agent.id,
                            agent_slug=agent.slug,
                            session_id=task.session_id,
                            recursion_depth=depth,
                            task_id=task.id,
                            chain=(*ctx.chain, agent.slug),
                        )
                        # A callee may always ask its caller back (`ask_user`, core.delegation.questions).
                        tools = self.tools.bind([*tool_rows, (ASK_USER, {})], agent_id=agent.id, agent_slug=agent.slug)
                        await self.engine.runner.run(
                            stream_key=key,
                            run=record.run,
                            tools=tools,
                            ctx=callee_ctx,
                            max_output_tokens=limits.max_output_tokens,
                        )
                    elif remote is not None:  # always, when the callee is not local
                        ask = self.questions.asker(task.id, task.session_id, fields)
                        await record.relay(
                            self.hub, key, remote, text, task.id, await self.files.outgoing(files), ask=ask
                        )
            state, error = record.result()
            if state == COMPLETED:  # its files and data shown in the panel before `done`, stored for the owner
                returned = await self.files.publish_returned(
                    self.hub, key, task.id, ctx, task.session_id, record.text()
                )
        except TimeoutError:
            error = _("{name} did not finish within {seconds} s and was stopped.").format(
                name=callee_name, seconds=f"{limits.timeout_s:g}"
            )
            await ev.publish(self.hub, key, ev.Error(error, TIMED_OUT))
            record.mark_stopped(status="error", error=error)
        except asyncio.CancelledError:
            state, error = (
                CANCELED,
                (
                    _("The delegation was stopped because the calling turn was stopped.")
                    if ctx.session_id
                    else _("The caller canceled the task.")
                ),
            )
            record.mark_stopped(status="canceled", error=None)
            # Shielded: the record is written even if the cancelling caller gives up waiting.
            await asyncio.shield(self.finish_task(task.id, task.session_id, record, state, error, started))
            raise
        await self.finish_task(task.id, task.session_id, record, state, error, started)

        metadata = {
            "taskId": task.id,
            "agentSlug": slug,
            "calleeAgentName": callee_name,
            "recursionDepth": depth,
            "state": state,
            "durationMs": int((time.monotonic() - started) * 1000),
            "usage": ev.usage_payload(record.input_tokens, record.output_tokens, record.cost_usd),
        }
        text_out = returned if state == COMPLETED else record.text()
        if state == COMPLETED:
            return ToolResult(True, data=text_out, metadata=metadata)
        failure = failure_text(callee_name, error)
        if text_out:  # what it had said as a block of its own, never run into the reason
            failure += (
                "" if failure.endswith((".", "!", "?", "…", "。", "！", "？")) else "."
            ) + f" It had said:\n\n{text_out}"
        return ToolResult(False, error=failure, metadata=metadata)

    def _remote_ids(self) -> list[str]:
        return [a.id for a in self.registry.remote_agents()] if self.registry is not None else []

    async def _check_running_tasks(self, s: AsyncSession, user_id: int | None) -> None:
        """Refuse a new task of `user_id` when they have the most running tasks allowed (in `s`, before its insert).

        The lock (PostgreSQL; SQLite's units of work take turns already) is held until `s` commits the new
        task, so the user's starts, on any replica, count one after the other.

        Raises:
            TooManyDelegatedTasksError: the user has `max_running_tasks_per_user` tasks submitted or working.
        """
        limit = self.max_running_tasks_per_user
        if limit is None or user_id is None:
            return
        await self.db.lock_for_transaction(s, RUNNING_WORK_LOCK_KEY, user_id)
        if await self.records.count_running(s, user_id) >= limit:
            raise TooManyDelegatedTasksError(
                f"Delegation refused: this user already has {limit} delegated tasks running, the most one "
                f"account may have at once. Wait for one of them to finish (try again in about "
                f"{RUNNING_LIMIT_RETRY_AFTER_S} s), or answer without delegating."
            )

    async def _announce(self, task_id: str, slug: str, callee_name: str, depth: int, ctx: ToolContext) -> None:
        """Open a new task's buffer and tell the caller (`a2a-task-started`); the next call may then start."""
        key = task_stream_key(task_id)
        meta = {
            "taskId": task_id,
            "userId": ctx.user_id,
            "callerSessionId": ctx.session_id,
            "calleeAgentSlug": slug,
            "calleeAgentName": callee_name,
            "parentTaskId": ctx.task_id,
            "toolCallId": ctx.tool_call_id,
            "recursionDepth": depth,
        }
        await self.hub.create(key, meta=meta)
        await ev.publish(self.hub, key, state_event(SUBMITTED, None))
        self.tasks_started += 1
        if ctx.emit is not None:
            await ctx.emit(ev.TaskStarted(task_id, slug, callee_name, ctx.tool_call_id, ctx.task_id, depth))
        if ctx.turnstile is not None:
            ctx.turnstile.release()  # announced: the next call of this step may start

    async def open_background_task(self, agent_id: str, agent_name: str, text: str, ctx: ToolContext) -> BackgroundTask:
        """A delegated task for work that runs elsewhere while the caller's turn goes on (a broker dispatch).

        The task is recorded like any delegation (task row, hidden session, `source='a2a'`
        messages, buffer `a2a_<taskId>`, `a2a-task-started` to the caller, so the side panel
        shows it); the returned `BackgroundTask` is fed the work's text and its end.
        """
        depth = ctx.recursion_depth + 1
        async with self.db.session() as s:
            await self._check_running_tasks(s, ctx.user_id)
            task, _user_row = await self.records.create_task(s, agent_id, None, text, depth, ctx)
        await self._announce(task.id, agent_id, agent_name, depth, ctx)
        await self.records.set_state(task.id, WORKING, SUBMITTED)
        return BackgroundTask(self, task.id, task.session_id, RemoteRun(agent_id, message_fields(task.id, ctx)))

    async def finish_task(
        self, task_id: str, session_id: str, record: RunRecord, state: str, error: str | None, started: float
    ) -> None:
        """Save the callee's answer (into its hidden session `session_id`) and totals, then end the task's stream.

        Runs once per task.
        """
        callee = record.run.agent.slug if isinstance(record, LocalRun) else record.agent_id
        metrics.DELEGATED_TASKS.labels(state, callee).inc()
        key = task_stream_key(task_id)
        try:
            await self.records.end_task(
                task_id,
                session_id,
                state,
                error,
                rows=record.rows(),
                input_tokens=record.input_tokens,
                output_tokens=record.output_tokens,
                cost_usd=record.cost_usd,
            )
            if state == CANCELED:
                await ev.publish(self.hub, key, ev.Error(error or ""))
            await self.records.announce_state(task_id, state, WORKING, error)
        except Exception:
            log.exception("could not record the end of task %s", task_id)
        finally:
            duration_ms = int((time.monotonic() - started) * 1000)
            done = ev.TaskDone(state, error, duration_ms, record.input_tokens, record.output_tokens, record.cost_usd)
            await ev.publish(self.hub, key, done)
            await self.hub.finish(key, error=error if state != COMPLETED else None)

    # -- tasks for callers outside the app (A2A JSON-RPC, issue 6) ---------------------------

    async def start_external_task(
        self,
        agent_slug: str,
        text: str,
        *,
        user_id: int,
        config: dict[str, Any] | None = None,
        session_id: str | None = None,
        message_id: str | None = None,
        files: list[dict[str, Any]] | None = None,
    ) -> A2ATaskSession:
        """Start a delegation for a caller outside the app (an A2A client); returns its row, as written, once it exists.

        The task is an ordinary delegation (hidden session, `source='a2a'` messages, hub buffer `a2a_<taskId>`, the
        audit view), with no caller agent and no caller session, owned by `user_id`. It runs in the background until
        it ends, `cancel_external_task` stops it, or the service shuts down; `config` is an `agent-invoke` config
        (limits; default limits when None). `session_id` continues the hidden session of an earlier task of the same
        caller and callee (an A2A context: the callee sees its earlier exchanges); `message_id` is the client's id of
        the message, kept on the task; `files` the refs of its files. The row is the task as it started (`submitted`).

        Raises:
            TooManyDelegatedTasksError: the user has `max_running_tasks_per_user` tasks running.
            DelegationRefusedError: no such agent, or the request is not acceptable; the message says why.
        """
        task_row: asyncio.Future[A2ATaskSession] = asyncio.get_running_loop().create_future()
        # No caller agent or session: the task and its messages record None for both.
        ctx = ToolContext(user_id=user_id, agent_id=None, agent_slug="", session_id=None, files=tuple(files or ()))
        arguments = {"agentSlug": agent_slug, "input": text}
        run = self._external.spawn(
            self._invoke(arguments, config or {}, ctx, session_id=session_id, message_id=message_id, task_row=task_row),
            name=f"a2a task for {agent_slug}",
        )
        await asyncio.wait([task_row, run], return_when=asyncio.FIRST_COMPLETED)
        if not task_row.done():  # refused before a task existed
            result: ToolResult = run.result()
            if result.metadata.get("code") == TOO_MANY_RUNNING_TASKS:
                raise TooManyDelegatedTasksError(result.error or "")
            raise DelegationRefusedError(result.error or f"The delegation to {agent_slug!r} was refused.")
        task = task_row.result()
        self._external_runs[task.id] = run
        run.add_done_callback(lambda _done: self._external_runs.pop(task.id, None))
        return task

    async def wait_external_task(self, task_id: str, timeout: float | None = None) -> None:
        """Wait until a task started by `start_external_task` ends (returns at once when none runs)."""
        run = self._external_runs.get(task_id)
        if run is not None:
            await asyncio.wait([run], timeout=timeout)

    def external_task_running(self, task_id: str) -> bool:
        """Whether a task started by `start_external_task` still runs in this process."""
        return task_id in self._external_runs

    async def cancel_external_task(self, task_id: str, timeout: float = 10.0) -> bool:
        """Stop a task started by `start_external_task` and wait until it is recorded as canceled.

        Returns False when no such task runs in this process (in a cluster: on any replica).
        """
        run = self._external_runs.get(task_id)
        if run is None and isinstance(self.hub, RedisStreamHub):  # it may run on another replica: stop it there
            return await self.hub.request_cancel(task_stream_key(task_id), timeout=timeout)
        if run is None or run.done():
            return False
        run.cancel()
        await asyncio.wait([run], timeout=timeout)
        return True

    async def _cancel_here(self, key: str) -> bool:
        """A cluster's cancel of `a2a_<taskId>`: stop the task when this process runs it for an A2A caller."""
        run = self._external_runs.get(key.removeprefix("a2a_")) if key.startswith("a2a_") else None
        if run is None or run.done():
            return False
        run.cancel()
        return True

    async def end_orphan(self, task_id: str) -> None:
        """A cluster's reaper took over this task's stream (its replica's lease expired): record it failed, end it."""
        error = "Interrupted: the server running this task stopped."
        key = task_stream_key(task_id)
        try:
            await self.records.set_state(task_id, FAILED, WORKING, error)
        except Exception:
            log.exception("could not record the interruption of task %s", task_id)
        await ev.publish(self.hub, key, ev.TaskDone(FAILED, error, 0))
        await self.hub.finish(key, error=error)

    async def shutdown_external_tasks(self) -> None:
        """Cancel every task started by `start_external_task` (each records itself as canceled)."""
        await self._external.shutdown()
