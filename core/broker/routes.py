"""The broker's HTTP and WebSocket surface, all under `/a2a` (seed 003).

    WS   /a2a?a2a_id=&agent_id=     remote agents dial in (`?token=` in jwt mode)
    GET  /a2a/agents?agent_id=      discovery
    POST /a2a/tasks/dispatch        {task, targetAgent, agentId, chatId, macAddress} -> ack
    POST /a2a/tasks/cancel          {chatId} -> {canceled: N}
    GET  /a2a/health, /a2a/stats
    POST /a2a/internal/dispatch     cluster mode: a forwarded dispatch, from another replica (INTERNAL_TOKEN)
    POST /a2a/internal/cancel       cluster mode: a forwarded cancel, from another replica (INTERNAL_TOKEN)

`/a2a/agents/{id}` (standard A2A JSON-RPC per agent) is not here; it belongs
to the A2A server module.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StrictInt, StringConstraints, ValidationError
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocketDisconnect

from core import tracing
from core.a2a import api_keys
from core.a2a.deps import ApiKeysDep
from core.auth.deps import SettingsDep, get_services, get_settings
from core.broker import report
from core.broker.auth import BrokerRefusedError
from core.broker.replicas import MAX_INTERNAL_BODY_BYTES
from core.broker.service import DISPATCH_TOKEN_OWNER, OPEN_OWNER, Broker, user_owner
from core.web.input_limits import MAX_JSON_NESTING, json_nesting, read_capped
from core.web.schemas import RequestBody

log = logging.getLogger(__name__)

MAX_TASK_CHARS = 20_000
MAX_ID_CHARS = 256  # chat ids, agent ids: what `broker_tasks` stores

NonEmpty = Annotated[str, StringConstraints(strict=True, strip_whitespace=True, min_length=1, max_length=MAX_ID_CHARS)]
ChatAgentNumber = Annotated[StrictInt, Field(ge=-(2**63), lt=2**63)]  # a 64-bit id, as chat systems store them


def get_broker(connection: HTTPConnection) -> Broker:
    """The app's broker (`app.state.services.broker`, as `core.auth.deps` reads the others)."""
    broker: Broker = get_services(connection).broker
    return broker


async def dispatch_owner(request: Request, settings: SettingsDep, keys: ApiKeysDep) -> str:
    """Who dispatches or cancels: `user:<id>` for an A2A API key, the dispatch token, or open mode; else 401."""
    if settings.broker_open_dispatch:
        return OPEN_OWNER
    token = api_keys.bearer_token(request.headers.get("authorization"))
    if token is not None:
        expected = settings.broker_dispatch_token
        if expected and hmac.compare_digest(token.encode(), expected.encode()):
            return DISPATCH_TOKEN_OWNER
        key = await keys.authenticate(token)
        if key is not None:
            return user_owner(key.user_id)
    raise HTTPException(
        401,
        headers={"WWW-Authenticate": 'Bearer realm="a2a broker"'},
        detail=(
            "Send 'Authorization: Bearer <key>': an A2A API key of the user this chat system acts for (make one at "
            "/api-keys), or the broker's dispatch token (BROKER_DISPATCH_TOKEN)."
        ),
    )


DispatchOwner = Annotated[str, Depends(dispatch_owner)]


class DispatchRequest(RequestBody):
    """`POST /a2a/tasks/dispatch` (seed 003)."""

    task: Annotated[
        str, StringConstraints(strict=True, strip_whitespace=True, min_length=1, max_length=MAX_TASK_CHARS)
    ] = Field(description="The whole task, as the user said it")
    targetAgent: NonEmpty = Field(description="a2a_id of a connected agent")  # noqa: N815 - wire name
    agentId: ChatAgentNumber | NonEmpty = Field(description="The chat agent's id; injects go to agent:events:<agentId>")  # noqa: N815
    chatId: NonEmpty = Field(description="The chat the injects are for")  # noqa: N815
    macAddress: str | None = Field(None, description="The device, passed through")  # noqa: N815


class DispatchAck(BaseModel):
    """`{taskId, status: "accepted"}` or `{status: "no_agent"}`."""

    taskId: str | None = None  # noqa: N815
    status: str


class CancelRequest(RequestBody):
    """`POST /a2a/tasks/cancel`."""

    chatId: NonEmpty  # noqa: N815


class InternalDispatch(DispatchRequest):
    """`POST /a2a/internal/dispatch`: a dispatch another replica forwards, with who made it."""

    owner: NonEmpty
    taskId: NonEmpty  # noqa: N815
    sessionId: NonEmpty | None = None  # noqa: N815
    origin: NonEmpty = Field(description="The replica that forwards it (a watched task's events go back there)")
    observe: bool = False


class InternalCancel(RequestBody):
    """`POST /a2a/internal/cancel`."""

    chatId: NonEmpty  # noqa: N815
    owner: NonEmpty | None = None


async def internal_body(request: Request, model: type[RequestBody]) -> Any:
    """A call from another replica: the internal token, a capped body, then the model; else 404, 401, 413, 422.

    Outside cluster mode (or without INTERNAL_TOKEN) these routes do not exist (404).
    """
    settings = await get_settings(request)
    if not settings.cluster or not settings.internal_token:
        raise HTTPException(404, "Not Found")
    token = api_keys.bearer_token(request.headers.get("authorization"))
    if token is None or not hmac.compare_digest(token.encode(), settings.internal_token.encode()):
        raise HTTPException(
            401,
            "This route is for the app's other replicas: send 'Authorization: Bearer <INTERNAL_TOKEN>'.",
            headers={"WWW-Authenticate": 'Bearer realm="a2a replicas"'},
        )
    raw = await read_capped(request.stream(), MAX_INTERNAL_BODY_BYTES, request.headers.get("content-length"))
    if raw is None:
        raise HTTPException(413, f"The request body is over {MAX_INTERNAL_BODY_BYTES:,} bytes.")
    try:
        data = json.loads(raw)
    except ValueError:
        raise HTTPException(400, "The request body is not JSON.") from None
    if json_nesting(data) > MAX_JSON_NESTING:
        raise HTTPException(400, "The request body nests too deeply.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None


def broker_router() -> APIRouter:
    """The `/a2a` broker routes."""
    router = APIRouter(tags=["a2a broker"])

    @router.websocket("/a2a")
    async def agent_socket(websocket: WebSocket) -> None:
        """A remote agent dials in; JSON-RPC 2.0, one message per line."""
        broker = get_broker(websocket)
        host = websocket.client.host if websocket.client else None
        try:
            identity = broker.admit(host, dict(websocket.query_params))
        except BrokerRefusedError as exc:
            await _deny(websocket, exc)
            return
        await websocket.accept()

        async def frames() -> AsyncIterator[str]:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("text") is not None:
                    yield message["text"]
                elif message.get("bytes") is not None:
                    yield message["bytes"].decode("utf-8", errors="replace")

        async def close(code: int, reason: str) -> None:
            await websocket.close(code, reason)

        try:
            await broker.serve(
                identity,
                frames(),
                send=websocket.send_text,
                close=close,
                remote_addr=f"{host}:{websocket.client.port}" if websocket.client else None,
            )
        except WebSocketDisconnect:
            pass

    @router.get("/a2a/agents")
    async def discover(
        connection: HTTPConnection, agent_id: Annotated[str | None, Query(description="The chat agent's id")] = None
    ) -> dict[str, Any]:
        """Connected agents bound to `agent_id` plus global ones (every agent without it), with LLM tools."""
        broker = get_broker(connection)
        await broker.refresh_directory()  # cluster mode: the other replicas' agents, as they are now
        return {"agents": broker.discover(agent_id)}

    @router.post("/a2a/tasks/dispatch", response_model=DispatchAck, response_model_exclude_none=True)
    async def dispatch(body: DispatchRequest, owner: DispatchOwner, connection: HTTPConnection) -> DispatchAck:
        """Start a task on a connected agent; returns at once, progress follows as injects.

        Needs `Authorization: Bearer <key>`: an A2A API key of the user the chat system acts for, or the
        settings' `broker_dispatch_token` (unless `broker_open_dispatch`, for trusted networks only).
        """
        try:
            ack = await get_broker(connection).dispatch(
                task=body.task,
                target_agent=body.targetAgent,
                agent_id=body.agentId,
                chat_id=body.chatId,
                owner=owner,
                mac_address=body.macAddress,
            )
        except SQLAlchemyError:
            log.exception("could not save a dispatched task")
            raise HTTPException(
                503,
                "The broker could not save the task (its database is unavailable); nothing "
                "was started. Try again shortly.",
            ) from None
        return DispatchAck(**ack)

    @router.post("/a2a/tasks/cancel")
    async def cancel(body: CancelRequest, owner: DispatchOwner, connection: HTTPConnection) -> dict[str, int]:
        """Cancel the chat's running tasks that the same credential dispatched (others count 0)."""
        return {"canceled": await get_broker(connection).cancel_chat(body.chatId, owner=owner)}

    @router.post("/a2a/internal/dispatch", include_in_schema=False)
    async def internal_dispatch(request: Request) -> dict[str, Any]:
        """Another replica forwards a dispatch for an agent connected here; the ack goes back to its caller."""
        body: InternalDispatch = await internal_body(request, InternalDispatch)
        broker = get_broker(request)
        observer = (
            broker.cluster.relayed_observer(body.origin, body.taskId)
            if body.observe and broker.cluster is not None
            else None
        )
        try:
            with tracing.continued(request.headers):  # the forwarding replica's trace goes on here
                ack = await broker.dispatch(
                    task=body.task,
                    target_agent=body.targetAgent,
                    agent_id=body.agentId,
                    chat_id=body.chatId,
                    owner=body.owner,
                    mac_address=body.macAddress,
                    task_id=body.taskId,
                    session_id=body.sessionId,
                    observer=observer,
                    local_only=True,
                )
        except SQLAlchemyError:
            log.exception("could not save a forwarded task")
            raise HTTPException(503, "The task could not be saved (the database is unavailable).") from None
        return ack

    @router.post("/a2a/internal/cancel", include_in_schema=False)
    async def internal_cancel(request: Request) -> dict[str, int]:
        """Another replica forwards a cancel: this replica's tasks of the chat."""
        body: InternalCancel = await internal_body(request, InternalCancel)
        return {"canceled": await get_broker(request).cancel_chat(body.chatId, owner=body.owner, local_only=True)}

    @router.get("/a2a/health", response_model=None)
    async def health(connection: HTTPConnection, live: bool = False) -> JSONResponse:
        """Liveness, the return path's state and each dependency's; 503 while a required one is down.

        `?live=1`: 200 whenever this process answers (the load balancer's check, deploy/Caddyfile): a database or
        Redis every replica shares is down for all of them at once, and taking them all out would turn away the
        requests the app answers itself meanwhile (503 with `Retry-After`, running turns' streams).
        """
        services = get_services(connection)
        broker = get_broker(connection)
        body = broker.health()
        body["dependencies"] = needs = await report.dependencies(broker, services.db, services.hub)
        down = [name for name, need in needs.items() if need["required"] and not need["ok"]]
        if down:
            body["status"] = "unavailable"
            body["down"] = down
        return JSONResponse(body, status_code=503 if down and not live else 200)

    @router.get("/a2a/stats")
    async def stats(connection: HTTPConnection) -> dict[str, Any]:
        """Counters since start."""
        return get_broker(connection).stats()

    return router


async def _deny(websocket: WebSocket, refused: BrokerRefusedError) -> None:
    """Refuse before the upgrade: an HTTP response with the reason, where the server supports it."""
    response = JSONResponse({"error": refused.reason}, status_code=refused.status)
    try:
        await websocket.send_denial_response(response)
    except RuntimeError:  # no websocket.http.response extension: a bare 403 is all we can send
        await websocket.close(1008, refused.reason[:120])
