"""The chat over HTTP (included under `/api` by `core.routes`): sessions, messages, turns and their streams.

A session that is not the caller's is answered exactly like one that does not exist (404),
so ids cannot be probed. Who the caller is: `core.auth.deps`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlmodel.ext.asyncio.session import AsyncSession

from core.auth.deps import CurrentUser, DatabaseDep, HubDep, SettingsDep, user_id_of
from core.chat import agents as agents_store
from core.chat import attachments
from core.chat import sessions as sessions_store
from core.chat.deps import ChatDep
from core.chat.engine import ChatEngine, ChatError, TurnStarted
from core.i18n import _
from core.streaming.redis_hub import refresh
from core.streaming.sse import hub_sse_response, last_event_id
from core.web.errors import ApiError
from core.web.schemas import RequestBody
from models import AgentMessage, AgentSession, User


class SessionCreate(RequestBody):
    """A new chat with an agent (default: the default agent, see `agents.get_default_agent`)."""

    agent_id: str | None = Field(None, alias="agentId", max_length=64, description="Agent registry id (slug)")
    title: str | None = Field(None, max_length=200)


class SessionOut(BaseModel):
    """A chat session."""

    id: str
    title: str
    agent_id: str = Field(serialization_alias="agentId")
    created_at: datetime = Field(serialization_alias="createdAt")
    updated_at: datetime = Field(serialization_alias="updatedAt")
    running: bool
    agent_deleted: bool = Field(
        False,
        serialization_alias="agentDeleted",
        description="Its agent was deleted: the chat stays readable, it takes no new messages",
    )


class MessageCreate(RequestBody):
    """A user message; the length limit is checked against `MAX_MESSAGE_CHARS` too."""

    content: str = Field(min_length=1, max_length=100_000)
    attachment_ids: list[str] = Field(
        default_factory=list,
        alias="attachmentIds",
        max_length=20,
        description="Files of this chat (from POST .../attachments) the message carries",
    )


class MessageOut(BaseModel):
    """A saved message."""

    id: int
    role: str
    content: str
    sort_order: int = Field(serialization_alias="sortOrder")
    status: str
    error: str | None
    model_id: str | None = Field(serialization_alias="modelId")
    input_tokens: int | None = Field(serialization_alias="inputTokens")
    output_tokens: int | None = Field(serialization_alias="outputTokens")
    cost_usd: float | None = Field(
        None, serialization_alias="costUsd", description="US dollars at LiteLLM's list prices; null: no price known"
    )
    tool_calls: list[dict[str, Any]] | None = Field(serialization_alias="toolCalls")
    tool_results: list[dict[str, Any]] | None = Field(serialization_alias="toolResults")
    source: str
    a2a_task_id: str | None = Field(serialization_alias="a2aTaskId")
    caller_agent_id: int | None = Field(serialization_alias="callerAgentId")
    caller_session_id: str | None = Field(serialization_alias="callerSessionId")
    inject_mode: str | None = Field(
        None,
        serialization_alias="injectMode",
        description="'delay' or 'auto' on a system message from a background task",
    )
    attachments: list[dict[str, Any]] = Field(
        default_factory=list, description="Files the message carries: id, name, mime, size (GET /api/attachments/{id})"
    )
    created_at: datetime = Field(serialization_alias="createdAt")


MessageId = Annotated[int, Path(ge=1, le=2**63 - 1, description="The message's id (from GET .../messages)")]


class TurnOut(BaseModel):
    """A started turn: subscribe to `streamUrl` to follow it."""

    session_id: str = Field(serialization_alias="sessionId")
    user_message_id: int = Field(serialization_alias="userMessageId")
    stream_url: str = Field(serialization_alias="streamUrl")
    after_event_id: int = Field(serialization_alias="afterEventId")


def chat_router() -> APIRouter:
    """The chat routes: sessions, messages, turns and their streams (agents: `core.delegation.agent_routes`)."""
    router = APIRouter()

    @router.get("/sessions", response_model=list[SessionOut], response_model_by_alias=True)
    async def list_sessions(user: CurrentUser, db: DatabaseDep, chat: ChatDep) -> list[SessionOut]:
        """The caller's chat sessions, most recent first (delegated-task sessions are not listed)."""
        async with db.read() as s:
            rows = await sessions_store.list_sessions(s, user_id=user_id_of(user))
            slugs = await _agent_slugs(s)
        return [_session_out(r, slugs, chat) for r in rows]

    @router.post("/sessions", status_code=201, response_model=SessionOut, response_model_by_alias=True)
    async def create_session(
        body: SessionCreate, user: CurrentUser, db: DatabaseDep, chat: ChatDep, settings: SettingsDep
    ) -> SessionOut:
        """Start a new chat with an agent."""
        async with db.session() as s:
            if body.agent_id:
                agent = await agents_store.get_agent_by_slug(s, body.agent_id)
                if agent is None:
                    raise ApiError(
                        404, "agent_not_found", detail=_("There is no agent {name!r}.").format(name=body.agent_id)
                    )
            else:
                agent = await agents_store.get_default_agent(s, settings.default_agent)
                if agent is None:
                    raise ApiError(
                        404,
                        "default_agent_missing",
                        detail=_(
                            "The default agent {name!r} does not exist: name one with "
                            "agentId (GET /api/agents lists them), or set DEFAULT_AGENT."
                        ).format(name=settings.default_agent),
                    )
            assert agent.id is not None  # a saved row
            row = await sessions_store.create_session(
                s, user_id=user_id_of(user), agent_id=agent.id, title=body.title or "New chat"
            )
        return _session_out(row, {agent.id: (agent.slug, False)}, chat)

    @router.get("/sessions/{session_id}", response_model=SessionOut, response_model_by_alias=True)
    async def get_session(
        session_id: str, user: CurrentUser, db: DatabaseDep, chat: ChatDep, hub: HubDep
    ) -> SessionOut:
        """One chat session."""
        async with db.read() as s:
            row = await _owned_session(s, session_id, user)
            slugs = await _agent_slugs(s)
        await refresh(hub, session_id)  # a cluster: whether a turn runs on any replica
        return _session_out(row, slugs, chat)

    @router.delete("/sessions/{session_id}", status_code=204)
    async def delete_session(session_id: str, user: CurrentUser, db: DatabaseDep, chat: ChatDep) -> Response:
        """Delete a chat (stops its running turn first)."""
        async with db.read() as s:
            await _owned_session(s, session_id, user)
        await chat.cancel(session_id)  # outside the transaction: the turn saves in its own
        async with db.session() as s:
            await sessions_store.delete_session(s, session_id=session_id, user_id=user_id_of(user))
        return Response(status_code=204)

    @router.get("/sessions/{session_id}/messages", response_model=list[MessageOut], response_model_by_alias=True)
    async def list_messages(session_id: str, user: CurrentUser, db: DatabaseDep) -> list[MessageOut]:
        """The saved messages of a chat, in order."""
        async with db.read() as s:
            await _owned_session(s, session_id, user)
            rows = await sessions_store.list_messages(s, session_id=session_id)
        return [message_out(m) for m in rows]

    @router.post(
        "/sessions/{session_id}/messages", status_code=202, response_model=TurnOut, response_model_by_alias=True
    )
    async def post_message(session_id: str, body: MessageCreate, user: CurrentUser, chat: ChatDep) -> TurnOut:
        """Send a message; the answer streams from `streamUrl`."""
        try:  # the engine checks the chat is the user's before it checks it is busy (404 before 409)
            files = await attachments.owned_refs(
                chat.db, body.attachment_ids, user_id=user_id_of(user), session_id=session_id
            )
            turn = await chat.start_turn(
                session_id=session_id, user_id=user_id_of(user), text=body.content, files=files
            )
        except attachments.AttachmentError as exc:
            raise ApiError(exc.status_code, exc.code, detail=exc.message) from exc
        except ChatError as exc:
            raise ApiError(exc.status_code, exc.code, detail=exc.message, headers=exc.headers or None) from exc
        return _turn_out(turn)

    @router.post(
        "/sessions/{session_id}/regenerate", status_code=202, response_model=TurnOut, response_model_by_alias=True
    )
    async def regenerate(session_id: str, user: CurrentUser, chat: ChatDep) -> TurnOut:
        """Answer the last message again; the new answer streams from `streamUrl`.

        The last answer (all its steps and tool calls) is removed; delegated tasks' records stay.
        409 while the chat answers, or when it holds no message of the caller.
        """
        try:
            turn = await chat.regenerate(session_id=session_id, user_id=user_id_of(user))
        except ChatError as exc:
            raise ApiError(exc.status_code, exc.code, detail=exc.message, headers=exc.headers or None) from exc
        return _turn_out(turn)

    @router.post(
        "/sessions/{session_id}/messages/{message_id}/resend",
        status_code=202,
        response_model=TurnOut,
        response_model_by_alias=True,
    )
    async def resend(
        session_id: str, message_id: MessageId, body: MessageCreate, user: CurrentUser, chat: ChatDep
    ) -> TurnOut:
        """Edit the last message and send it again; the new answer streams from `streamUrl`.

        The message gets `content` (checked as a new message is) and what followed it is removed. Only the
        caller's last message (409 for an earlier one, 404 for none); 409 while the chat answers.
        """
        try:
            turn = await chat.resend(
                session_id=session_id, user_id=user_id_of(user), message_id=message_id, text=body.content
            )
        except ChatError as exc:
            raise ApiError(exc.status_code, exc.code, detail=exc.message, headers=exc.headers or None) from exc
        return _turn_out(turn)

    @router.post("/sessions/{session_id}/stop")
    async def stop_turn(session_id: str, user: CurrentUser, db: DatabaseDep, chat: ChatDep) -> dict[str, bool]:
        """Stop the running answer; what it said so far is kept."""
        async with db.read() as s:
            await _owned_session(s, session_id, user)
        return {"stopped": await chat.cancel(session_id)}

    @router.get("/sessions/{session_id}/stream", response_model=None)
    async def stream(session_id: str, request: Request, user: CurrentUser, db: DatabaseDep, hub: HubDep) -> Response:
        """SSE of the chat's current (or last) turn; resumable with `Last-Event-ID`."""
        info = await refresh(hub, session_id)  # a cluster: the turn may run on another replica
        # A turn's buffer says whose chat it is (`ChatEngine._launch`, once its start found the chat theirs): the
        # owner following the turn it just started is not checked again in the database (issue 41). Anyone else
        # is, so another's chat still answers exactly like one that does not exist.
        if info is None or info.meta.get("userId") != user_id_of(user):
            async with db.read() as s:
                await _owned_session(s, session_id, user)
        if info is None:
            return JSONResponse({"active": False, "reason": "no-buffer"})
        return hub_sse_response(hub, session_id, last_event_id(request))

    return router


def _turn_out(turn: TurnStarted) -> TurnOut:
    return TurnOut(
        session_id=turn.session_id,
        user_message_id=turn.user_message_id,
        stream_url=f"/api/sessions/{turn.session_id}/stream?lastEventId={turn.after_event_id}",
        after_event_id=turn.after_event_id,
    )


async def _owned_session(s: AsyncSession, session_id: str, user: User) -> AgentSession:
    row = await sessions_store.get_user_session(s, session_id=session_id, user_id=user_id_of(user))
    if row is None:
        raise ApiError(404, "session_not_found", detail=_("There is no such chat session."))
    return row


async def _agent_slugs(s: AsyncSession) -> dict[int, tuple[str, bool]]:
    agents = await agents_store.list_agents(s, include_deleted=True)
    return {a.id: (a.slug, a.deleted_at is not None) for a in agents if a.id is not None}


def _session_out(row: AgentSession, slugs: dict[int, tuple[str, bool]], chat: ChatEngine) -> SessionOut:
    slug, deleted = slugs.get(row.agent_id, ("", True))
    return SessionOut(
        id=row.id,
        title=row.title,
        agent_id=slug,
        created_at=row.created_at,
        updated_at=row.updated_at,
        running=chat.is_running(row.id),
        agent_deleted=deleted,
    )


def message_out(m: AgentMessage) -> MessageOut:
    """A saved message as the API shows it (also inside a task's detail)."""
    return MessageOut(
        id=m.id,
        role=m.role,
        content=m.content,
        sort_order=m.sort_order,
        status=m.status,
        error=m.error,
        model_id=m.model_id,
        input_tokens=m.input_tokens,
        output_tokens=m.output_tokens,
        cost_usd=m.cost_usd,
        tool_calls=m.tool_calls,
        tool_results=m.tool_results,
        source=m.source,
        a2a_task_id=m.a2a_task_id,
        caller_agent_id=m.caller_agent_id,
        caller_session_id=m.caller_session_id,
        inject_mode=m.inject_mode,
        attachments=m.attachments or [],
        created_at=m.created_at,
    )
