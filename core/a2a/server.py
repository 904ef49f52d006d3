"""Standard A2A for every agent in the registry: cards, JSON-RPC and HTTP+JSON at `/a2a/agents/{id}`.

Here: `A2AServer` (the endpoint); beside it `AgentRequestHandler` (`core/a2a/handler.py`, the SDK's
request handler over our delegations), which changes with it when the SDK does. The other a2a-sdk server
interfaces of this endpoint are beside it: the cards (`core/a2a/agent_cards.py`) and the task store
over `a2a_task_sessions` (`core/a2a/task_store.py`); the wire is the package `core/a2a/protocol/`.

    GET  /a2a/agents/{id}/.well-known/agent-card.json   public card (v1.0; v0.3 with `A2A-Version: 0.3`)
    GET  /.well-known/agent-card.json                    the same for the default agent (`DEFAULT_AGENT`)
    POST /a2a/agents/{id}                                JSON-RPC: v1.0 (A2A-Version: 1.0) and v0.3
    GET|POST|DELETE /a2a/agents/{id}/rest/…              HTTP+JSON: the SDK's REST routes, v1.0 (`/message:send`,
                                                         `/tasks/{taskId}`, …) and v0.3 (`/v1/message:send`, …)

Both bindings go through the same key check, body cap and request handler (`AgentRequestHandler`);
HTTP+JSON answers errors with the HTTP status of the spec's mapping (unknown task 404, not cancelable
400, bad JSON 400, no key 401, too many running tasks 429 with `Retry-After`) and its
`{"error": {code, status, message, details}}` body (`core/a2a/protocol/rest.py`).

Local agents (database) and remote ones (`AgentRegistry`) are looked up by id
on every request, so an agent added at run time is served at once.

A call from outside is a delegation like any other (`DelegationService.
start_external_task`): a row of `a2a_task_sessions` owned by the API key's
user, a hidden session with `source='a2a'` messages, the hub buffer
`a2a_<taskId>`, the audit view. Those rows are the task store
(`TaskSessionStore`, `core/a2a/task_store.py`): `GetTask` reads them, so it answers after a restart; a
stream (`SendStreamingMessage`, `SubscribeToTask`) follows the task's hub
buffer and turns its events into A2A events:

    text-delta {delta}        → status update WORKING carrying the delta as an agent message
    state {completed}         → artifact `result` with the full saved answer, then status COMPLETED
    state {failed|canceled}   → status FAILED / CANCELED with the error as its message
    state {input-required|auth-required} → that status with the question as its message; the stream
                                ends, and the caller's next message in the task (same taskId) is the
                                answer: the task goes on (`core.delegation.questions`, issue 36)

Who may call: every JSON-RPC and HTTP+JSON request needs an API key (`core/a2a/api_keys.py`, also
in single-user mode); without one the answer is HTTP 401. A key sees only its
user's tasks; another user's task id is answered as unknown (-32001), so ids
cannot be probed. Only tasks started over A2A can be canceled over A2A; a
delegation started by a chat is stopped from that chat.

Bad input gets the spec's codes from the SDK's dispatcher (-32700 parse,
-32600 request, -32601 method, -32602 params, -32009 version, -32001 task not
found, -32002 not cancelable, -32004 unsupported, -32005 content type) with a
message that says what to change; a key whose user has too many tasks running
gets the app's -32029 (`wire.TooManyRunningTasksError`, try again later). Bodies over `MAX_BODY_BYTES` are refused
before they are read to the end.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Message

from core.a2a import api_keys
from core.a2a import protocol as wire
from core.a2a.agent_cards import REST_PATH, AgentCards
from core.a2a.handler import AgentRequestHandler
from core.a2a.push import PushNotifier
from core.a2a.push_store import PushConfigStore
from core.a2a.task_store import TaskSessionStore
from core.secret_box import LazySecretBox
from core.settings import Settings
from core.web.input_limits import read_capped
from core.web.outbound_policy import AllowList

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1_048_576
_ASK_FOR_KEY = {"WWW-Authenticate": 'Bearer realm="a2a"'}


class A2AServer:
    """The two routes' work: cards, key check, body limit, then the SDK's JSON-RPC dispatcher.

    Args:
        services: the app's services (db, hub, registry, delegation, settings, api_keys).
    """

    def __init__(self, services: Any) -> None:
        self.db = services.db
        self.api_keys: api_keys.ApiKeys = services.api_keys
        self.settings: Settings = services.settings
        self.cards = AgentCards(services.db, services.registry, services.settings)
        self.store = TaskSessionStore(services.db)
        settings = services.settings
        box = LazySecretBox(settings.data_dir, settings.secret_key)  # push tokens, sealed at rest
        push_store = PushConfigStore(
            services.db, seal=box.seal, unseal=box.open, max_per_task=settings.a2a_push_max_configs_per_task
        )
        self.notifier = PushNotifier(
            db=services.db,
            store=push_store,
            tasks=self.store,
            hub=services.hub,
            allow=AllowList.parse(settings.outbound_allow_hosts),
            max_deliveries=settings.a2a_push_max_deliveries_per_task,
            attempts=settings.a2a_push_attempts,
            retry_base_s=settings.a2a_push_first_retry_s,
        )
        self.handler = AgentRequestHandler(
            delegation=services.delegation,
            hub=services.hub,
            store=self.store,
            cards=self.cards,
            push_store=push_store,
            notifier=self.notifier,
        )
        self.dispatcher = wire.create_dispatcher(self.handler)
        self.rest = wire.RestEndpoint(self.handler, "/a2a/agents/{agent_id}" + REST_PATH)

    async def card_response(self, agent_id: str, request: Request) -> Response:
        """The agent's public card (no key needed), with a weak ETag.

        A v1.0 card unless the client asks for v0.3 (`A2A-Version: 0.3`, as a header or a query
        parameter): one document cannot be both (`protocol.card_json`).
        """
        spec = await self.cards.spec(agent_id)
        if spec is None:
            return JSONResponse({"detail": f"There is no agent {agent_id!r}."}, status_code=404)
        version = request.headers.get(wire.VERSION_HEADER) or request.query_params.get(wire.VERSION_HEADER)
        body = wire.card_json(wire.build_card(spec), version=version)
        etag = 'W/"' + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32] + '"'
        headers = {"ETag": etag, "Vary": wire.VERSION_HEADER}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return JSONResponse(body, headers=headers)

    async def root_card_response(self, request: Request) -> Response:
        """The card at the server root (`/.well-known/agent-card.json`): the default agent's (`DEFAULT_AGENT`)."""
        return await self.card_response(self.settings.default_agent, request)

    async def rpc_response(self, agent_id: str, request: Request) -> Response:
        """Check the key and the body, then hand the request to the dispatcher."""
        user_id = await self._authenticate(request)
        if user_id is None:
            return JSONResponse(wire.invalid_request_body(self._unauthorized()), status_code=401, headers=_ASK_FOR_KEY)
        if not await self.cards.exists(agent_id):
            return JSONResponse(
                wire.invalid_request_body(f"There is no agent {agent_id!r} on this server."), status_code=404
            )
        body = await _read_body(request, MAX_BODY_BYTES)
        if body is None:
            return JSONResponse(
                wire.invalid_request_body(f"Payload too large: the request body is over {MAX_BODY_BYTES:,} bytes.")
            )
        refusal = wire.check_rpc_body(body, self.dispatcher, request.headers.get(wire.VERSION_HEADER))
        if refusal is not None:  # what the SDK would answer with -32603 and a traceback in the log
            return JSONResponse(refusal)
        request.state.a2a_user_id = user_id
        return wire.coalesce_sse(await self.dispatcher.handle_requests(_with_body(request, body)))

    async def rest_response(self, agent_id: str, request: Request) -> Response:
        """HTTP+JSON below `/a2a/agents/{id}/rest`: the same checks as JSON-RPC, then the SDK's REST routes."""
        user_id = await self._authenticate(request)
        if user_id is None:
            return wire.rest_error(401, "UNAUTHENTICATED", "UNAUTHENTICATED", self._unauthorized(), _ASK_FOR_KEY)
        if not await self.cards.exists(agent_id):
            return wire.rest_error(
                404, "NOT_FOUND", "AGENT_NOT_FOUND", f"There is no agent {agent_id!r} on this server."
            )
        body = await _read_body(request, MAX_BODY_BYTES)
        if body is None:
            return wire.rest_error(
                413,
                "INVALID_ARGUMENT",
                "PAYLOAD_TOO_LARGE",
                f"Payload too large: the request body is over {MAX_BODY_BYTES:,} bytes.",
            )
        refusal = wire.check_rest_body(body)
        if refusal is not None:
            return refusal
        request.state.a2a_user_id = user_id
        return await self.rest.respond(_with_body(request, body))

    def _unauthorized(self) -> str:
        return (
            "Unauthorized: send an API key of this app as 'Authorization: Bearer <key>' "
            f"(create one at {self.settings.base_url}/api-keys)."
        )

    async def _authenticate(self, request: Request) -> int | None:
        token = api_keys.bearer_token(request.headers.get("authorization"))
        if token is None:
            return None
        key = await self.api_keys.authenticate(token)
        return key.user_id if key is not None else None


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is known to exceed `limit` (Content-Length, or while reading)."""
    return await read_capped(request.stream(), limit, request.headers.get("content-length"))


def _with_body(request: Request, body: bytes) -> Request:
    """The same request, its body already read (the dispatcher reads it again)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await request.receive()

    return Request(request.scope, receive)


# -- the request handler -------------------------------------------------------------------
