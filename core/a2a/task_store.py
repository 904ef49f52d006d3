"""The A2A task store (`TaskSessionStore`): the rows of `a2a_task_sessions`, read as tasks.

No second copy of a task, in memory or elsewhere: `GetTask` and `ListTasks` read these rows, so
they answer after a restart. The A2A endpoint (`core/a2a/server.py`) hands it to the SDK.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, func, or_
from sqlmodel import col, select

from core.a2a import protocol as wire
from core.chat import sessions as sessions_store
from core.delegation.tasks import TERMINAL_STATES
from models import A2ATaskSession, AgentMessage


class TaskSessionStore(wire.TaskStore):
    """A2A tasks are the rows of `a2a_task_sessions` (no second copy, in memory or elsewhere).

    A task's answer is its hidden session's saved assistant messages, so a Task read from
    here after a restart has the same status, artifact and history as before. What a caller
    may see is scoped by the call context: tasks of the key's user, for the agent of the URL.
    """

    def __init__(self, db: Any) -> None:
        self.db = db

    async def snapshot(self, task_id: str, *, user_id: int | None, agent_id: str) -> wire.TaskSnapshot | None:
        """The task in plain values when this caller may see it, else None."""
        async with self.db.read() as s:
            row = await s.get(A2ATaskSession, task_id)
            if row is None or user_id is None or row.caller_user_id != user_id or row.callee_agent_slug != agent_id:
                return None
            output = ""
            if row.state in TERMINAL_STATES:
                messages = await sessions_store.list_messages(s, session_id=row.session_id)
                output = _answer_of([m for m in messages if m.a2a_task_id == row.id])
        return row_snapshot(row, output)

    async def context_running_task(self, context_id: str, *, user_id: int, agent_id: str) -> str | None:
        """For a context of this caller with this agent: the id of its running task, or '' when none runs.

        None when the context is unknown, another caller's, or another agent's (the same answer for all three).
        """
        async with self.db.read() as s:
            rows = list(
                (
                    await s.exec(
                        select(A2ATaskSession).where(
                            A2ATaskSession.session_id == context_id,
                            A2ATaskSession.caller_user_id == user_id,
                            A2ATaskSession.callee_agent_slug == agent_id,
                        )
                    )
                ).all()
            )
        if not rows:
            return None
        return next((r.id for r in rows if r.state not in TERMINAL_STATES), "")

    async def get(self, task_id: str, context: wire.ServerCallContext) -> wire.Task | None:
        """The Task, or None when unknown to this caller."""
        snap = await self.snapshot(
            task_id, user_id=context.state.get("user_id"), agent_id=context.state.get("agent_id", "")
        )
        return wire.to_task(snap) if snap is not None else None

    async def save(self, task: wire.Task, context: wire.ServerCallContext) -> None:
        """Not offered: `DelegationService` writes the rows (and the hub events that go with them)."""
        raise NotImplementedError("tasks are written by DelegationService, which also streams their events")

    async def list(self, params: wire.ListTasksRequest, context: wire.ServerCallContext) -> wire.ListTasksResponse:
        """The caller's tasks for this agent, filtered, last updated first, a page at a time (§3.1.4).

        The page token is a cursor (status time and id of the last task of a page), so pages
        stay consistent while tasks are added; `totalSize` counts the tasks that match the filters.
        """
        query = wire.read_list_request(params)
        user_id, agent_id = context.state.get("user_id"), context.state.get("agent_id", "")
        matching = [A2ATaskSession.caller_user_id == user_id, A2ATaskSession.callee_agent_slug == agent_id]
        if query.context_id:
            matching.append(A2ATaskSession.session_id == query.context_id)
        if query.state is not None:
            matching.append(A2ATaskSession.state == query.state)
        if query.updated_after is not None:
            matching.append(col(A2ATaskSession.updated_at) >= query.updated_after)
        page_query = select(A2ATaskSession).where(*matching)
        if query.after is not None:
            when = wire.cursor_time(query.after)
            page_query = page_query.where(
                or_(
                    col(A2ATaskSession.updated_at) < when,
                    and_(col(A2ATaskSession.updated_at) == when, col(A2ATaskSession.id) < query.after.task_id),
                )
            )
        page_query = page_query.order_by(col(A2ATaskSession.updated_at).desc(), col(A2ATaskSession.id).desc())
        async with self.db.read() as s:
            total = (await s.exec(select(func.count()).select_from(A2ATaskSession).where(*matching))).one()
            rows = list((await s.exec(page_query.limit(query.page_size + 1))).all())
            outputs = await _answers(s, [r.id for r in rows[: query.page_size] if r.state in TERMINAL_STATES])
        page = rows[: query.page_size]
        response = wire.ListTasksResponse(
            tasks=[
                wire.to_task(
                    row_snapshot(r, outputs.get(r.id, "")),
                    history_length=query.history_length,
                    artifacts=query.artifacts,
                )
                for r in page
            ],
            page_size=query.page_size,
            total_size=total,
        )
        if len(rows) > query.page_size:
            response.next_page_token = wire.list_page_token(page[-1].updated_at, page[-1].id)
        return response

    async def delete(self, task_id: str, context: wire.ServerCallContext) -> None:
        """Not offered: tasks are the audit record of delegations."""
        raise NotImplementedError("tasks are kept as the audit record of delegations; they are not deleted over A2A")


async def _answers(s: Any, task_ids: list[str]) -> dict[str, str]:
    """The saved answers of these tasks (their assistant messages, joined), by task id."""
    if not task_ids:
        return {}
    query = (
        select(AgentMessage)
        .where(col(AgentMessage.a2a_task_id).in_(task_ids), col(AgentMessage.role).in_(["assistant", "user"]))
        .order_by(col(AgentMessage.sort_order), col(AgentMessage.id))
    )
    by_task: dict[str, list[AgentMessage]] = {}
    for message in (await s.exec(query)).all():
        by_task.setdefault(message.a2a_task_id or "", []).append(message)
    return {task_id: _answer_of(messages) for task_id, messages in by_task.items()}


def _answer_of(messages: list[AgentMessage]) -> str:
    """A task's answer: its assistant messages after its last user message (a question's answer, issue 36), joined.

    A task that asked back keeps its question and the answer it got as messages; the result is what followed.
    """
    answer: list[str] = []
    for message in messages:
        if message.role == "user":
            answer = []
        elif message.role == "assistant":
            answer.append(message.content)
    return "".join(answer)


def row_snapshot(row: A2ATaskSession, output: str) -> wire.TaskSnapshot:
    """A task's row and its saved answer (`output`, '' while it runs) in plain values."""
    return wire.TaskSnapshot(
        id=row.id,
        context_id=row.session_id,
        state=row.state,
        input=row.input,
        output=output,
        error=row.error,
        created_at=row.created_at,
        updated_at=row.updated_at,
        input_message_id=row.input_message_id,
        metadata={"agentId": row.callee_agent_slug, "inputTokens": row.input_tokens, "outputTokens": row.output_tokens},
    )
