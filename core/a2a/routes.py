"""HTTP routes of issue 6: standard A2A for every agent, API keys, remote agents by card URL.

    GET    /a2a/agents/{id}/.well-known/agent-card.json   the agent's card (public)
    GET    /.well-known/agent-card.json                    the default agent's card (public)
    POST   /a2a/agents/{id}                                A2A JSON-RPC, v1.0 and v0.3 (API key required)
    *      /a2a/agents/{id}/rest/{path}                    A2A HTTP+JSON, v1.0 and v0.3 (API key required)
    POST   /a2a/push/{id}                                  a remote agent's push notification (its token required)
    GET    /api/a2a/keys            POST /api/a2a/keys            DELETE /api/a2a/keys/{key_id}
    GET    /api/a2a/remote-agents   POST /api/a2a/remote-agents   DELETE /api/a2a/remote-agents/{id}

`GET /a2a/agents` itself (no id) belongs to the broker's discovery and is not
touched here. The A2A server (`core/a2a/server.py`, on the a2a-sdk) is built
on the first A2A request, or by `warm_up` shortly after start: its import is
kept off the path to the first page.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import BaseModel, Field

from core import tracing
from core.a2a import api_keys
from core.a2a.deps import A2AServerDep, ApiKeysDep, RemoteAgentsDep
from core.a2a.remote_agents import RegistrationError
from core.auth.deps import CurrentUser, user_id_of
from core.i18n import _
from core.web.errors import ApiError
from core.web.schemas import RequestBody

if TYPE_CHECKING:  # imported at run time only on first use (a2a_server): it loads the a2a-sdk
    pass

AgentId = Annotated[str, Path(max_length=64, description="The agent's registry id")]
WaitId = Annotated[str, Path(max_length=64, description="The id of the task's webhook (from the push config)")]
KeyId = Annotated[int, Path(ge=1, le=2**63 - 1, description="The key's id (from GET /api/a2a/keys)")]


def a2a_router() -> APIRouter:
    """`/a2a/agents/{id}`: the card and the JSON-RPC endpoint of every agent; the root card."""
    router = APIRouter(tags=["a2a"])

    @router.get("/.well-known/agent-card.json", response_model=None)
    async def read_root_agent_card(request: Request, server: A2AServerDep) -> Response:
        """The default agent's A2A card (`DEFAULT_AGENT`), where generic clients look for one; no key needed."""
        return await server.root_card_response(request)

    @router.get("/a2a/agents/{agent_id}/.well-known/agent-card.json", response_model=None)
    async def read_agent_card(agent_id: AgentId, request: Request, server: A2AServerDep) -> Response:
        """The agent's A2A card (v1.0; v0.3 with `A2A-Version: 0.3`); no key needed."""
        return await server.card_response(agent_id, request)

    @router.post("/a2a/agents/{agent_id}", response_model=None)
    async def call_agent(agent_id: AgentId, request: Request, server: A2AServerDep) -> Response:
        """A2A JSON-RPC 2.0 (v1.0 with `A2A-Version: 1.0`; v0.3 methods too); needs `Authorization: Bearer <key>`."""
        with served(agent_id, request):  # the task it starts runs in the caller's trace
            return await server.rpc_response(agent_id, request)

    async def call_agent_rest(agent_id: AgentId, rest_path: str, request: Request, server: A2AServerDep) -> Response:
        """A2A HTTP+JSON (v1.0 with `A2A-Version: 1.0`; v0.3 below `/v1`); needs `Authorization: Bearer <key>`.

        The paths are the SDK's: `POST message:send`, `POST message:stream` (SSE), `GET tasks`,
        `GET tasks/{taskId}`, `POST tasks/{taskId}:cancel`, `GET|POST tasks/{taskId}:subscribe` (SSE),
        `GET extendedAgentCard`, the push configs below `tasks/{taskId}/pushNotificationConfigs`; and v0.3's
        `v1/message:send`, `v1/message:stream`, `v1/tasks/{taskId}`, … Errors: `{"error": {code, status,
        message, details}}` with the HTTP status of the A2A spec's mapping.
        """
        with served(agent_id, request):
            return await server.rest_response(agent_id, request)

    for method in ("GET", "POST", "DELETE"):  # one route each: each its own OpenAPI operation
        router.add_api_route(
            "/a2a/agents/{agent_id}/rest/{rest_path:path}",
            call_agent_rest,
            methods=[method],
            name=f"call_agent_rest_{method.lower()}",
            response_model=None,
        )

    @router.post("/a2a/push/{wait_id}", status_code=204, response_model=None)
    async def receive_push_notification(wait_id: WaitId, request: Request, remote_agents: RemoteAgentsDep) -> Response:
        """A remote agent's push notification of a task this app waits for (`A2A_REMOTE_PUSH`).

        Needs the token the app gave with the task, in `X-A2A-Notification-Token`; without it, and for an
        unknown id, the answer is the same 404.
        """
        try:
            body = await request.json()
        except ValueError:
            raise ApiError(400, "invalid_json", detail=_("The notification is not valid JSON.")) from None
        token = request.headers.get("x-a2a-notification-token")
        if not await remote_agents.push.receive(wait_id, token, body):
            raise ApiError(404, "not_found", detail=_("There is no such push notification address."))
        return Response(status_code=204)

    return router


def warm_up() -> None:
    """Import the A2A server in a thread, so the first A2A request does not pay for it."""
    threading.Thread(target=importlib.import_module, args=("core.a2a.server",), name="a2a warm-up", daemon=True).start()


# -- /api/a2a ------------------------------------------------------------------------------


class ApiKeyCreate(RequestBody):
    """A new API key for A2A callers."""

    name: str = Field(min_length=1, max_length=api_keys.MAX_NAME_CHARS, description="What will use the key")


class ApiKeyOut(BaseModel):
    """An API key without its secret."""

    id: int
    name: str
    prefix: str
    created_at: datetime = Field(serialization_alias="createdAt")
    last_used_at: datetime | None = Field(serialization_alias="lastUsedAt")
    revoked_at: datetime | None = Field(serialization_alias="revokedAt")


class ApiKeyCreated(ApiKeyOut):
    """A new key: `key` is shown only in this answer."""

    key: str


class RemoteAgentCreate(RequestBody):
    """A remote A2A agent to register by its card."""

    card_url: str = Field(
        alias="cardUrl",
        min_length=8,
        max_length=2000,
        description="The card's URL (…/.well-known/agent-card.json) or the agent's base URL",
    )
    id: str | None = Field(None, max_length=64, description="Registry id; default: from the card's name")
    bearer_token: str | None = Field(
        None, alias="bearerToken", max_length=4000, description="Sent as 'Authorization: Bearer …' to the remote agent"
    )


class RemoteAgentOut(BaseModel):
    """A registered remote A2A agent."""

    id: str
    name: str
    description: str
    card_url: str = Field(serialization_alias="cardUrl")
    url: str | None
    protocol_version: str | None = Field(serialization_alias="protocolVersion")
    streaming: bool
    skills: list[dict[str, Any]]
    online: bool
    yours: bool = Field(description="Whether you registered it (only its owner can remove it)")


def a2a_api_router() -> APIRouter:
    """`/api/a2a/keys` and `/api/a2a/remote-agents`."""
    router = APIRouter(prefix="/api/a2a", tags=["a2a"])

    @router.get("/keys", response_model=list[ApiKeyOut], response_model_by_alias=True)
    async def list_keys(user: CurrentUser, keys: ApiKeysDep) -> list[ApiKeyOut]:
        """Your API keys, newest first (secrets are never shown again)."""
        rows = await keys.list_keys(user_id=user_id_of(user))
        return [ApiKeyOut.model_validate(r, from_attributes=True) for r in rows]

    @router.post("/keys", status_code=201, response_model=ApiKeyCreated, response_model_by_alias=True)
    async def create_key(body: ApiKeyCreate, user: CurrentUser, keys: ApiKeysDep) -> ApiKeyCreated:
        """Create an API key for A2A callers; copy `key` now, it is stored only as a hash."""
        try:
            row, key = await keys.create_key(user_id=user_id_of(user), name=body.name)
        except api_keys.ApiKeyError as exc:
            raise ApiError(
                422, "api_key_invalid", detail=_("Cannot create the key: {reason}.").format(reason=exc)
            ) from exc
        return ApiKeyCreated(**ApiKeyOut.model_validate(row, from_attributes=True).model_dump(), key=key)

    @router.delete("/keys/{key_id}", status_code=204)
    async def revoke_key(key_id: KeyId, user: CurrentUser, keys: ApiKeysDep) -> Response:
        """Revoke one of your keys; requests with it are refused from now on."""
        if not await keys.revoke_key(user_id=user_id_of(user), key_id=key_id):
            raise ApiError(404, "api_key_not_found", detail=_("You have no such active key."))
        return Response(status_code=204)

    @router.get("/remote-agents", response_model=list[RemoteAgentOut], response_model_by_alias=True)
    async def list_remote_agents(user: CurrentUser, remote_agents: RemoteAgentsDep) -> list[RemoteAgentOut]:
        """Remote A2A agents registered by card URL (every user may delegate to them; tokens are never shown)."""
        return [_remote_out(v, user_id_of(user)) for v in await remote_agents.list()]

    @router.post("/remote-agents", status_code=201, response_model=RemoteAgentOut, response_model_by_alias=True)
    async def register_remote_agent(
        body: RemoteAgentCreate, user: CurrentUser, remote_agents: RemoteAgentsDep
    ) -> RemoteAgentOut:
        """Register a remote A2A agent by its card URL; it can be delegated to at once (`@<id> …`)."""
        try:
            view = await remote_agents.register(
                body.card_url, agent_id=body.id, bearer_token=body.bearer_token or None, user_id=user_id_of(user)
            )
        except RegistrationError as exc:
            raise HTTPException(exc.status_code, detail=str(exc)) from exc
        return _remote_out(view, user_id_of(user))

    @router.delete("/remote-agents/{agent_id}", status_code=204)
    async def unregister_remote_agent(agent_id: AgentId, user: CurrentUser, remote_agents: RemoteAgentsDep) -> Response:
        """Remove a remote agent you registered (403 for another user's)."""
        try:
            removed = await remote_agents.unregister(agent_id, user_id=user_id_of(user))
        except RegistrationError as exc:
            raise HTTPException(exc.status_code, detail=str(exc)) from exc
        if not removed:
            raise ApiError(
                404,
                "remote_agent_not_found",
                detail=_("There is no registered remote agent {name!r}.").format(name=agent_id),
            )
        return Response(status_code=204)

    return router


def _remote_out(view: Any, user_id: int) -> RemoteAgentOut:
    """The API's view of a registration for `user_id` (its owner's id stays inside)."""
    fields = dataclasses.asdict(view)
    owner_id = fields.pop("owner_id")
    return RemoteAgentOut(**fields, yours=owner_id in (None, user_id))


@contextmanager
def served(agent_id: str, request: Request) -> Iterator[None]:
    """An A2A request the app answers: a server span in the caller's trace (its `traceparent`), if it sent one.

    The work it starts (the task's run, spawned inside) is the span's child, so the callee's turn and model
    calls join the caller's trace across processes.
    """
    with (
        tracing.continued(request.headers),
        tracing.span(
            "a2a.serve",
            kind=tracing.SpanKind.SERVER,
            attributes={"agent.id": agent_id, "http.request.method": request.method},
        ),
    ):
        yield
