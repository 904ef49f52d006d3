"""The A2A wire, in one package: everything that knows a2a-sdk 1.3.0's types and helpers.

Why one package: it is the only one that imports the a2a-sdk (an import-linter contract says
so), which is pinned exactly because of divergence 2 below, so an SDK upgrade is read and
tested in one place. Its modules follow the SDK's own split:

    states        our task states and the protocol's, and the constants every side shares
    cards         agent cards (server side): `CardSpec` → the SDK's `AgentCard`, v1.0 or v0.3 JSON
    tasks         tasks (server side): `TaskSnapshot` → `Task`, requests read, one task's events
    text_updates  the per-token event as plain values and its JSON written by hand (divergence 4)
    errors        the app's own JSON-RPC error, -32029 (divergence 5), and the SDK's errors we raise
    jsonrpc       the JSON-RPC endpoint (server side): the dispatcher and the checks before it
    rest          the HTTP+JSON endpoint (server side): the SDK's REST routes below one route per agent
    v03_compat    what the app adds to the SDK's v0.3 compat layer (version refusals, -32602)
    sse           a streamed answer written in bursts (divergence 3)
    remote        remote agents (client side): cards, the client, their stream read
    push          push notifications: configs (server side), asking for them and reading them (client side)
    parts         file and data parts: an answer's artifact blocks as parts, a remote's parts as blocks

This file re-exports the public names: callers write `from core.a2a import protocol as wire`.

The rest of `core` talks to A2A through plain values: `CardSpec` and
`TaskSnapshot` in, protobuf objects handed straight back to the SDK out
(server side, `core/a2a/server.py`), and `RemoteEvent`s out of a remote
agent's stream (client side, `core/a2a/client.py`). v1.0 ProtoJSON, the v0.3
`kind` objects and the JSON-RPC framing stay inside the SDK, which this package
wraps; v0.3 is served by the SDK's compat adapter on the same URL
(`enable_v0_3_compat=True`) and chosen by its client factory when a card
offers only 0.3.

Importing this package costs about 0.2 s (protobuf, google-api-core), so the
app imports it lazily, never on the path to the first page (`core/a2a/routes.py`).

Divergences from the SDK's usual shape (don't "fix" these):

1. The JSON-RPC endpoint is one route with the agent id in its path, in front
   of one `JsonRpcDispatcher`, instead of `create_jsonrpc_routes` per agent:
   agents come and go at run time, and the route first checks the API key and
   the body size before the dispatcher sees the request.
2. SDK-internal helpers (`JsonRpcDispatcher`, `to_compat_agent_card`,
   `build_error_response`, `parse_agent_card`, `validate_proto_required_fields`)
   are used; they are importable but not in `__all__`, hence the exact pin.
3. A streamed answer's SSE events that are ready at the same moment are written
   to the socket as one chunk (`sse.coalesce_sse`), instead of one write per event.
   Every event stays its own SSE event; what changes is that a burst of tokens
   costs one pass through the ASGI stack (a dozen middlewares, NiceGUI's made
   pure ASGI by `ui/asgi_middlewares.py`, each with its own `send` wrapper)
   instead of one per token. The first event of a burst is never held back.
4. The v1.0 streams write the per-token event (a status update whose message
   holds text) as JSON field by field instead of through `MessageToDict`
   (`jsonrpc._Dispatcher`, which replaces the SDK's `_process_streaming_request`);
   the JSON is exactly the SDK's, and every other event goes the SDK's way.
   For them the request handler does not build that event as protobuf at all:
   it yields a `TextUpdate` (plain values) when the stream's context carries
   `PLAIN_TEXT_UPDATES`, which only `_Dispatcher` sets.
5. One error of the app's own, `errors.TooManyRunningTasksError` (-32029, a code in JSON-RPC's range for
   server errors that A2A, which uses -32001 to -32009, leaves free), is added to the SDK's maps of
   error types to codes, so its dispatcher answers it with that code instead of -32603. The v0.3
   compat adapter knows only v0.3's codes and still says -32603 for it, with the same message.
"""

from __future__ import annotations

from a2a.client import A2AClientError
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.tasks.task_store import TaskStore
from a2a.types import AgentCard, ListTasksRequest, ListTasksResponse, Task
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, VERSION_HEADER

from core.a2a.protocol.cards import CardSpec, SkillSpec, build_card, card_json
from core.a2a.protocol.errors import (
    TOO_MANY_RUNNING_TASKS_CODE,
    A2AError,
    ContentTypeNotSupportedError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    TooManyRunningTasksError,
    UnsupportedOperationError,
)
from core.a2a.protocol.jsonrpc import (
    TRACE_STATE,
    CallContextBuilder,
    check_rpc_body,
    create_dispatcher,
    invalid_request_body,
)
from core.a2a.protocol.parts import OutgoingFile, answer_parts, blocks_of, json_value, message_request
from core.a2a.protocol.push import (
    NOTIFICATION_TOKEN_HEADER,
    ask_for_push,
    get_task_request,
    offers_push,
    read_notification,
    task_response,
)
from core.a2a.protocol.remote import (
    CardError,
    RemoteStreamReader,
    cancel_request,
    card_from_fetched,
    card_from_json,
    card_location,
    card_summary,
    card_to_storage,
    check_card,
    endpoint_url,
    is_client_error,
    open_client,
    text_message_request,
)
from core.a2a.protocol.rest import RestEndpoint, check_rest_body, rest_error
from core.a2a.protocol.sse import coalesce_sse
from core.a2a.protocol.states import (
    DEMO_OUTPUT_MODES,
    HTTP_JSON,
    INPUT_MODES,
    JSONRPC,
    TEXT_MODES,
    our_state,
    state_name,
)
from core.a2a.protocol.tasks import (
    IncomingMessage,
    ListQuery,
    TaskEvents,
    TaskSnapshot,
    cursor_time,
    list_page_token,
    read_history_length,
    read_list_request,
    read_send_request,
    to_task,
)
from core.a2a.protocol.text_updates import PLAIN_TEXT_UPDATES, TextUpdate

__all__ = [
    "DEMO_OUTPUT_MODES",
    "INPUT_MODES",
    "TEXT_MODES",
    "AGENT_CARD_WELL_KNOWN_PATH",
    "HTTP_JSON",
    "JSONRPC",
    "NOTIFICATION_TOKEN_HEADER",
    "PLAIN_TEXT_UPDATES",
    "TOO_MANY_RUNNING_TASKS_CODE",
    "VERSION_HEADER",
    "A2AClientError",
    "A2AError",
    "AgentCard",
    "CallContextBuilder",
    "TRACE_STATE",
    "CardError",
    "CardSpec",
    "ContentTypeNotSupportedError",
    "IncomingMessage",
    "InvalidParamsError",
    "ListQuery",
    "ListTasksRequest",
    "ListTasksResponse",
    "OutgoingFile",
    "PushNotificationNotSupportedError",
    "RemoteStreamReader",
    "RequestHandler",
    "RestEndpoint",
    "ServerCallContext",
    "SkillSpec",
    "Task",
    "TaskEvents",
    "TaskNotCancelableError",
    "TaskNotFoundError",
    "TaskSnapshot",
    "TaskStore",
    "TextUpdate",
    "TooManyRunningTasksError",
    "UnsupportedOperationError",
    "ask_for_push",
    "answer_parts",
    "blocks_of",
    "build_card",
    "cancel_request",
    "card_from_fetched",
    "card_from_json",
    "card_json",
    "card_location",
    "card_summary",
    "card_to_storage",
    "check_card",
    "check_rest_body",
    "check_rpc_body",
    "coalesce_sse",
    "create_dispatcher",
    "cursor_time",
    "endpoint_url",
    "get_task_request",
    "invalid_request_body",
    "is_client_error",
    "json_value",
    "list_page_token",
    "offers_push",
    "message_request",
    "open_client",
    "our_state",
    "read_history_length",
    "read_list_request",
    "read_notification",
    "read_send_request",
    "rest_error",
    "state_name",
    "task_response",
    "text_message_request",
    "to_task",
]
