"""The records of delegated tasks (seed 000 §3.1.4, `a2a_task_sessions`) and their reads.

A task row says who called whom (caller user, agent, session and task; callee id),
at which recursion depth, with what input, in which state (`submitted`, `working`,
`input-required` / `auth-required` while the callee waits for an answer (`questions.py`),
then `completed`, `failed` or `canceled`), with which error and token totals, and
which hidden session (`visible_in_sidebar=0`) holds the callee's messages. Its events
go to the hub buffer `task_stream_key(task_id)` = `a2a_<taskId>`.

`TaskRecords` writes the rows as `DelegationService` runs a task and reads them back
for the side panel, the audit view and the API (`TaskView`, `TaskDetail`). Only the
task's owner (the caller's user) can read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import literal_column, update
from sqlalchemy.sql.expression import ColumnClause
from sqlmodel import col, func, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.chat import agents as agents_store
from core.chat import sessions as sessions_store
from core.chat.tools import ToolContext
from core.db import Database
from core.delegation.registry import AgentRegistry
from core.i18n import N_, _
from core.streaming import events
from core.streaming.backend import StreamHubBackend
from core.streaming.hub import StreamEvent
from core.streaming.sse import Shape
from core.streaming.sse_stream import iso_now
from models import A2ATaskSession, Agent, AgentMessage, RemotePushWait, utcnow

SUBMITTED, WORKING, COMPLETED, FAILED, CANCELED = "submitted", "working", "completed", "failed", "canceled"
# The callee waits for an answer from the caller (a question; a sign-in); the task goes on once it comes.
INPUT_REQUIRED, AUTH_REQUIRED = "input-required", "auth-required"
WAITING_STATES = frozenset({INPUT_REQUIRED, AUTH_REQUIRED})
TERMINAL_STATES = frozenset({COMPLETED, FAILED, CANCELED})
# Written into the statement, not bound: the planner then knows the partial index of running tasks
# (`idx_a2a_task_sessions_running`, migration 0009) covers the query.
_RUNNING_LITERALS: list[ColumnClause[Any]] = [literal_column(f"'{SUBMITTED}'"), literal_column(f"'{WORKING}'")]


def task_stream_key(task_id: str) -> str:
    """The hub key of a task's events (seed 000: `a2a_${taskId}`)."""
    return f"a2a_{task_id}"


def state_event(
    state: str, previous: str | None, error: str | None = None, message: str | None = None
) -> events.TaskState:
    """A task buffer's `state` event, stamped now; a first state (no `previous`) comes from `NO_PREVIOUS_STATE`.

    `message`: what the callee asks with a waiting state (`input-required`, `auth-required`).
    """
    return events.TaskState(state, previous or events.NO_PREVIOUS_STATE, iso_now(), error, message)


def seed_task_shape(task_id: str) -> Shape:
    """How `GET /api/agents/a2a/stream` sends a task buffer's events: the seeds' shapes (`events.seed_task_wire`).

    An event of a kind the types do not know is sent as the buffer holds it.
    """

    def shape(event: StreamEvent) -> tuple[str, dict[str, Any]]:
        try:
            typed = events.from_stream(event.type, event.data)
        except events.EventFormatError:
            return event.type, event.data
        return events.seed_task_wire(typed, task_id)

    return shape


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
    cost_usd: float | None = None  # the callee's run's price, where its model has one

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


class TaskRecords:
    """The rows of delegated tasks: created, moved through their states, ended, and read back.

    Args:
        db: the database.
        hub: the stream hub (a state change is also a `state` event of the task's stream;
            a task view is `live` while its buffer is in the hub).
        registry: names remote callees in task views.
    """

    def __init__(self, db: Database, hub: StreamHubBackend, registry: AgentRegistry | None = None) -> None:
        self.db = db
        self.hub = hub
        self.registry = registry

    # -- writing -------------------------------------------------------------------------

    async def create_task(
        self,
        s: AsyncSession,
        slug: str,
        callee_id: int | None,
        text: str,
        depth: int,
        ctx: ToolContext,
        *,
        session_id: str | None = None,
        message_id: str | None = None,
        files: list[dict[str, Any]] | None = None,
    ) -> tuple[A2ATaskSession, AgentMessage]:
        """A new task row (`submitted`), its hidden session and the callee's user message, in session `s`.

        Args:
            s: the database session to write in.
            slug: the callee's registry id; `callee_id` its local agent row (None for a remote agent).
            callee_id: see `slug`.
            text: what the caller asks.
            depth: the task's recursion depth.
            ctx: the caller (user, agent, session, parent task, tool call).
            session_id: continue this hidden session (an A2A context) instead of opening a new one;
                the caller has checked that it is one of its own with this callee.
            message_id: the A2A client's `messageId` of the input, kept on the task.
            files: refs of the files the caller's message carries (`core.delegation.artifacts`), given to the callee.
        """
        hidden = None
        if session_id is None:
            # A remote callee has no local agent row: its hidden session belongs to the caller's agent
            # (a caller outside the app has none: then to the oldest local agent, a placeholder never shown).
            owner_id = callee_id if callee_id is not None else ctx.agent_id
            if owner_id is None:
                owner_id = (await s.exec(select(Agent.id).order_by(col(Agent.id)).limit(1))).first()
            if owner_id is None:  # no agent at all (the column is NOT NULL; say so rather than fail on insert)
                raise LookupError("there is no local agent to own the task's hidden session")
            hidden = sessions_store.add_session(
                s, user_id=ctx.user_id, agent_id=owner_id, title=sessions_store.make_title(f"Task: {text}")
            )
            await s.flush()  # before the task row, which refers to it (the models declare no relationship)
            session_id = hidden.id
        task = A2ATaskSession(
            session_id=session_id,
            callee_agent_id=callee_id,
            callee_agent_slug=slug,
            caller_user_id=ctx.user_id,
            caller_agent_id=ctx.agent_id,
            caller_session_id=ctx.session_id,
            parent_task_id=ctx.task_id,
            recursion_depth=depth,
            state=SUBMITTED,
            visible_in_sidebar=0,
            input=text,
            tool_call_id=ctx.tool_call_id or None,
            input_message_id=message_id,
        )
        s.add(task)
        user_message = {
            "role": "user",
            "content": text,
            "source": "a2a",
            "a2a_task_id": task.id,
            "caller_agent_id": ctx.agent_id,
            "caller_session_id": ctx.session_id,
            "attachments": files or None,  # the caller's files (core/delegation/artifacts.py)
        }
        # One transaction for the session, the task and the input: every task's start pays for it.
        if hidden is not None:
            [user_row] = sessions_store.add_first_messages(s, hidden, [user_message])
        else:
            [user_row] = await sessions_store.append_messages(s, session_id=session_id, messages=[user_message])
        await s.commit()  # the rows keep their values (and ids, set at flush): nothing to read back
        return task, user_row

    @staticmethod
    async def count_running(s: AsyncSession, user_id: int) -> int:
        """How many tasks of `user_id` are running (`submitted` or `working`), on any replica, read in session `s`."""
        query = (
            select(func.count())
            .select_from(A2ATaskSession)
            .where(A2ATaskSession.caller_user_id == user_id, col(A2ATaskSession.state).in_(_RUNNING_LITERALS))
        )
        count: int = (await s.exec(query)).one()
        return count

    async def set_state(
        self, task_id: str, state: str, previous: str, error: str | None = None, *, message: str | None = None
    ) -> None:
        """Record the task's new state, then tell its stream (`message`: a waiting state's question)."""
        async with self.db.session() as s:
            await s.exec(_state_update(task_id, state, error))
            await s.commit()
        await events.publish(self.hub, task_stream_key(task_id), state_event(state, previous, error, message))

    async def end_task(
        self,
        task_id: str,
        session_id: str,
        state: str,
        error: str | None,
        *,
        rows: list[dict[str, Any]],
        input_tokens: int,
        output_tokens: int,
        cost_usd: float | None = None,
    ) -> None:
        """Save the callee's answer into the task's hidden session `session_id`, its totals and its terminal state.

        One transaction, and no event: the caller tells the stream (`announce_state`) once it is saved.
        """
        async with self.db.session() as s:
            if rows:
                await sessions_store.append_messages(s, session_id=session_id, messages=rows)
            await s.exec(
                _state_update(task_id, state, error).values(
                    input_tokens=input_tokens, output_tokens=output_tokens, cost_usd=cost_usd
                )
            )
            await s.commit()

    async def announce_state(self, task_id: str, state: str, previous: str, error: str | None = None) -> None:
        """Tell the task's stream of its new state (`events.TaskState`)."""
        await events.publish(self.hub, task_stream_key(task_id), state_event(state, previous, error))

    # -- reading -------------------------------------------------------------------------

    async def owned_task(self, user_id: int, task_id: str) -> A2ATaskSession | None:
        """The task if `user_id` owns the conversation it belongs to, else None."""
        async with self.db.session() as s:
            row = await s.get(A2ATaskSession, task_id)
        return row if row is not None and row.caller_user_id == user_id else None

    async def fail_interrupted(self) -> int:
        """At start-up: tasks still running (or waiting for an answer) were cut off by a stop; mark them failed.

        Not those whose remote agent ends them by push (a waiting `a2a_remote_push_waits` row): they go on
        (`core/a2a/remote_push.py`).
        """
        reason = "The server stopped while this task was running."
        running = [SUBMITTED, WORKING, *sorted(WAITING_STATES)]
        waiting = select(RemotePushWait.task_id).where(RemotePushWait.state == "waiting")
        async with self.db.session() as s:
            rows = list(
                (
                    await s.exec(
                        select(A2ATaskSession).where(
                            col(A2ATaskSession.state).in_(running), col(A2ATaskSession.id).not_in(waiting)
                        )
                    )
                ).all()
            )
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
                query = (
                    select(A2ATaskSession)
                    .where(
                        col(A2ATaskSession.caller_session_id).in_(frontier), A2ATaskSession.caller_user_id == user_id
                    )
                    .order_by(col(A2ATaskSession.created_at), col(A2ATaskSession.id))
                )
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
                select(A2ATaskSession)
                .where(A2ATaskSession.caller_user_id == user_id)
                .order_by(col(A2ATaskSession.created_at).desc(), col(A2ATaskSession.id))
                .limit(limit)
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
            query = (
                select(A2ATaskSession)
                .where(A2ATaskSession.parent_task_id == task_id)
                .order_by(col(A2ATaskSession.created_at), col(A2ATaskSession.id))
            )
            children = list((await s.exec(query)).all())
        return TaskDetail(self._view(row, names), messages, [self._view(c, names) for c in children])

    async def task_chain(self, user_id: int, task_id: str) -> list[TaskView]:
        """The whole delegation chain `task_id` belongs to (its root and every task under it), for its owner.

        Root first, then depth first in start order (each task right after its parent): the audit's
        waterfall. Empty when the task is not the user's. A chain is at most `maxRecursionDepth` (≤ 20)
        levels: one query a level.
        """
        async with self.db.session() as s:
            row = await s.get(A2ATaskSession, task_id)
            if row is None or row.caller_user_id != user_id:
                return []
            for _level in range(agents_store.AGENT_INVOKE_MAXIMA["maxRecursionDepth"] + 1):
                if row.parent_task_id is None:
                    break
                parent = await s.get(A2ATaskSession, row.parent_task_id)
                if parent is None or parent.caller_user_id != user_id:
                    break
                row = parent
            tasks, level = [row], [row.id]
            while level:
                query = select(A2ATaskSession).where(col(A2ATaskSession.parent_task_id).in_(level))
                children = list((await s.exec(query)).all())
                tasks.extend(children)
                level = [c.id for c in children]
            names = await _agent_names(s)
        kids: dict[str | None, list[A2ATaskSession]] = {}
        for task in tasks[1:]:
            kids.setdefault(task.parent_task_id, []).append(task)
        ordered: list[A2ATaskSession] = []

        def visit(task: A2ATaskSession) -> None:
            ordered.append(task)
            for child in sorted(kids.get(task.id, []), key=lambda t: (t.created_at, t.id)):
                visit(child)

        visit(tasks[0])
        return [self._view(t, names) for t in ordered]

    def _view(self, row: A2ATaskSession, names: dict[int, tuple[str, str]]) -> TaskView:
        caller = names.get(row.caller_agent_id or -1)
        callee = names.get(row.callee_agent_id or -1)
        remote = self.registry.remote(row.callee_agent_slug) if self.registry and callee is None else None
        if remote is not None:
            callee = (remote.id, remote.name)
        return TaskView(
            id=row.id,
            session_id=row.session_id,
            parent_task_id=row.parent_task_id,
            caller_session_id=row.caller_session_id,
            caller_agent_slug=caller[0] if caller else None,
            caller_agent_name=caller[1] if caller else None,
            callee_agent_slug=row.callee_agent_slug,
            callee_agent_name=callee[1] if callee else row.callee_agent_slug,
            tool_call_id=row.tool_call_id,
            input=row.input,
            state=row.state,
            error=row.error,
            recursion_depth=row.recursion_depth,
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
            created_at=row.created_at,
            finished_at=row.finished_at,
            live=self.hub.get(task_stream_key(row.id)) is not None,
            cost_usd=row.cost_usd,
        )


def _state_update(task_id: str, state: str, error: str | None) -> Any:
    """The one UPDATE of a task's state (and its end time when the state is terminal): no read first."""
    now = utcnow()
    values: dict[str, Any] = {"state": state, "error": error, "updated_at": now}
    if state in TERMINAL_STATES:
        values["finished_at"] = now
    return (
        update(A2ATaskSession)
        .where(col(A2ATaskSession.id) == task_id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )  # the row is not loaded in the session


DELETED_MARK = N_("(agent deleted)")  # after a deleted agent's name, in the reader's language


async def _agent_names(s: AsyncSession) -> dict[int, tuple[str, str]]:
    # A deleted agent's tasks stay readable; its name says it is gone.
    return {
        a.id: (a.slug, a.name + (" " + _(DELETED_MARK) if a.deleted_at is not None else ""))
        for a in await agents_store.list_agents(s, include_deleted=True)
        if a.id is not None
    }
