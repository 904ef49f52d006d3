"""The delegated tasks over HTTP (included under `/api` by `core.routes`): the task stream and the audit reads.

    GET /api/agents/a2a/stream?taskId=   SSE of one delegated task (seed 000 §3.2.5), for its owner only
    GET /api/tasks                       your delegated tasks, newest first
    GET /api/tasks/{id}                  one task with the callee's messages and its nested delegations
    POST /api/tasks/{id}/messages        answer a task that asks back (`input-required`, `auth-required`)

Another user's task is answered exactly like an unknown one, so task ids cannot be probed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from core.auth.deps import CurrentUser, HubDep, user_id_of
from core.chat.routes import MessageOut, message_out
from core.delegation.deps import DelegationDep
from core.delegation.questions import MAX_ANSWER_CHARS, TaskNotWaitingError
from core.delegation.service import DelegationService
from core.delegation.tasks import WAITING_STATES, TaskView, seed_task_shape, task_stream_key
from core.i18n import _
from core.streaming.redis_hub import refresh
from core.streaming.sse import hub_sse_response, last_event_id
from core.web.errors import ApiError

# Seed 000 §3.2.5: the task stream says it can be resumed (here with Last-Event-ID or ?lastEventId=).
RESUMABLE = {"X-Stream-Resume": "true"}


class TaskOut(BaseModel):
    """A delegated task (the audit view's row)."""

    id: str
    session_id: str = Field(serialization_alias="sessionId")
    parent_task_id: str | None = Field(serialization_alias="parentTaskId")
    caller_session_id: str | None = Field(serialization_alias="callerSessionId")
    caller_agent_id: str | None = Field(serialization_alias="callerAgentId", description="registry id (slug)")
    caller_agent_name: str | None = Field(
        serialization_alias="callerAgentName", description="its name as shown (None: a remote A2A caller)"
    )
    callee_agent_id: str = Field(serialization_alias="calleeAgentId", description="registry id (slug)")
    callee_agent_name: str = Field(serialization_alias="calleeAgentName")
    tool_call_id: str | None = Field(serialization_alias="toolCallId")
    input: str
    state: str
    error: str | None
    recursion_depth: int = Field(serialization_alias="recursionDepth")
    input_tokens: int = Field(serialization_alias="inputTokens")
    output_tokens: int = Field(serialization_alias="outputTokens")
    cost_usd: float | None = Field(
        None, serialization_alias="costUsd", description="US dollars at LiteLLM's list prices; null: no price known"
    )
    duration_ms: int | None = Field(serialization_alias="durationMs")
    created_at: datetime = Field(serialization_alias="createdAt")
    finished_at: datetime | None = Field(serialization_alias="finishedAt")
    question: str | None = Field(
        default=None, description="what the callee asks while the task is input-required or auth-required"
    )


class AnswerIn(BaseModel):
    """An answer to a task's question (the chat message body)."""

    content: str = Field(min_length=1, max_length=MAX_ANSWER_CHARS)


class TaskDetailOut(TaskOut):
    """A task with the callee's messages and its direct child tasks."""

    messages: list[MessageOut]
    children: list[TaskOut]


def tasks_router() -> APIRouter:
    """The delegation routes (tag `delegation`)."""
    router = APIRouter()

    @router.get("/agents/a2a/stream", response_model=None, tags=["delegation"])
    async def task_stream(
        request: Request,
        user: CurrentUser,
        delegation: DelegationDep,
        hub: HubDep,
        task_id: Annotated[str | None, Query(alias="taskId", max_length=64)] = None,
    ) -> Response:
        """SSE of one delegated task (seed 000 §3.2.5): replay, then live; resumable with `Last-Event-ID`.

        Seed 000's shapes: `{"type": "text-delta", "textDelta"}`, `{"type": "error", "message"}`,
        `{"type": "done", ...}`; the named `state` event is `{taskId, from, to, timestamp}` (seed 002).

        `{"active": false, "reason": "no-buffer"}` when nothing is buffered for the task
        (unknown, or finished and evicted: read it from `/api/tasks/{id}` then).
        """
        if not task_id:
            raise ApiError(
                400, "task_id_missing", detail=_("Missing taskId: call /api/agents/a2a/stream?taskId=<task id>.")
            )
        key = task_stream_key(task_id)
        # Another user's task is answered exactly like an unknown one, so task ids cannot be probed.
        info = await refresh(hub, key)
        # A broker task dispatched with the user's API key has no task row: its stream says whose it is.
        owned = (info is not None and info.meta.get("userId") == user.id) or (
            await delegation.owned_task(user_id_of(user), task_id) is not None
        )
        if not owned or info is None:
            return JSONResponse({"active": False, "reason": "no-buffer"})
        return hub_sse_response(hub, key, last_event_id(request), shape=seed_task_shape(task_id), headers=RESUMABLE)

    @router.get("/tasks", response_model=list[TaskOut], response_model_by_alias=True, tags=["delegation"])
    async def list_tasks(user: CurrentUser, delegation: DelegationDep) -> list[dict[str, Any]]:
        """Your delegated tasks, newest first (what the audit view lists)."""
        return [_task_out(t, delegation) for t in await delegation.list_tasks(user_id_of(user))]

    @router.get("/tasks/{task_id}", response_model=TaskDetailOut, response_model_by_alias=True, tags=["delegation"])
    async def get_task(task_id: str, user: CurrentUser, delegation: DelegationDep) -> dict[str, Any]:
        """One delegated task with the callee's messages and its nested delegations."""
        detail = await delegation.task_detail(user_id_of(user), task_id)
        if detail is None:
            raise ApiError(404, "task_not_found", detail=_("There is no such task among your conversations."))
        out = _task_out(detail.task, delegation)
        if detail.task.state in WAITING_STATES and out["question"] is None:  # asked on another replica
            said = [m.content for m in detail.messages if m.role == "assistant" and m.content]
            out["question"] = said[-1] if said else None
        return {
            **out,
            "messages": [message_out(m) for m in detail.messages],
            "children": [_task_out(c, delegation) for c in detail.children],
        }

    @router.post(
        "/tasks/{task_id}/messages",
        response_model=TaskOut,
        response_model_by_alias=True,
        status_code=202,
        tags=["delegation"],
    )
    async def answer_task(task_id: str, body: AnswerIn, user: CurrentUser, delegation: DelegationDep) -> dict[str, Any]:
        """Answer a task that asks back: the callee goes on with it in the same task (202: working again).

        404 for a task that is not yours (or none); 409 `task_not_waiting` when it asks nothing now.
        """
        if await delegation.owned_task(user_id_of(user), task_id) is None:
            raise ApiError(404, "task_not_found", detail=_("There is no such task among your conversations."))
        try:
            await delegation.questions.answer(task_id, body.content)
        except TaskNotWaitingError:
            raise ApiError(
                409,
                TaskNotWaitingError.code,
                detail=_("This task is not waiting for an answer: it is running, it has ended, or it asked nothing."),
            ) from None
        detail = await delegation.task_detail(user_id_of(user), task_id)
        assert detail is not None, "the user's task, read just before"
        return _task_out(detail.task, delegation)

    return router


def _task_out(t: TaskView, delegation: DelegationService) -> dict[str, Any]:
    waiting = delegation.questions.pending(t.id) if t.state in WAITING_STATES else None
    return dict(
        question=waiting.text if waiting is not None else None,
        id=t.id,
        session_id=t.session_id,
        parent_task_id=t.parent_task_id,
        caller_session_id=t.caller_session_id,
        caller_agent_id=t.caller_agent_slug,
        caller_agent_name=t.caller_agent_name,
        callee_agent_id=t.callee_agent_slug,
        callee_agent_name=t.callee_agent_name,
        tool_call_id=t.tool_call_id,
        input=t.input,
        state=t.state,
        error=t.error,
        recursion_depth=t.recursion_depth,
        input_tokens=t.input_tokens,
        output_tokens=t.output_tokens,
        cost_usd=t.cost_usd,
        duration_ms=t.duration_ms,
        created_at=t.created_at,
        finished_at=t.finished_at,
    )
