"""What this app adds to the SDK's v0.3 compat layer.

Version refusals that name the method to call, and -32602 (not -32600) for v0.3 requests whose
`params` do not validate.

v0.3 itself is served and spoken by the SDK's adapter (`enable_v0_3_compat=True`); none of this
translates v0.3.
"""

from __future__ import annotations

from typing import Any

from a2a.server.request_handlers.response_helpers import build_error_response
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.utils.constants import (
    PROTOCOL_VERSION_0_3,
    PROTOCOL_VERSION_1_0,
)
from a2a.utils.errors import (
    InvalidParamsError,
    VersionNotSupportedError,
)
from pydantic import ValidationError

# Each v1.0 method's v0.3 name (ListTasks has none), for a refusal to point to the one to call.
V03_NAMES = {
    "SendMessage": "message/send",
    "SendStreamingMessage": "message/stream",
    "GetTask": "tasks/get",
    "CancelTask": "tasks/cancel",
    "SubscribeToTask": "tasks/resubscribe",
    "CreateTaskPushNotificationConfig": "tasks/pushNotificationConfig/set",
    "GetTaskPushNotificationConfig": "tasks/pushNotificationConfig/get",
    "ListTaskPushNotificationConfigs": "tasks/pushNotificationConfig/list",
    "DeleteTaskPushNotificationConfig": "tasks/pushNotificationConfig/delete",
    "GetExtendedAgentCard": "agent/getAuthenticatedExtendedCard",
}
V1_NAMES = {v03: v1 for v1, v03 in V03_NAMES.items()}


def version_refusal(method: str, is_v1: bool, asked: str | None, request_id: str | int | None) -> dict[str, Any] | None:
    """-32009 (VersionNotSupportedError) for a method asked for under a protocol version it is not of, or None.

    The version asked for is the `A2A-Version` header, 0.3 without one (the spec's rule); it fits a
    method when the major numbers agree, as in the SDK's `validate_version` (1.2 is served as 1.0).
    The SDK refuses the same requests, but its v0.3 adapter says -32603 (v0.3 had no -32009) and
    neither says which version the method is of. The answer names it, and the method's name in
    the version asked for.
    """
    sent = (asked or "").strip()
    asked = sent or PROTOCOL_VERSION_0_3
    own, other = (PROTOCOL_VERSION_1_0, PROTOCOL_VERSION_0_3) if is_v1 else (PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0)
    if _same_major(asked, own):
        return None
    message = f"{method} is a method of A2A {own}, but the request asks for A2A {asked[:20]!r}"
    if not _same_major(asked, other):
        message += f", which this server does not speak (it speaks {PROTOCOL_VERSION_1_0} and {PROTOCOL_VERSION_0_3})"
    elif not sent:
        message += " (no A2A-Version header means 0.3)"
    message += f". Expected version {own!r}: send 'A2A-Version: {own}'" + ("" if is_v1 else " or none")
    equivalent = (V03_NAMES if is_v1 else V1_NAMES).get(method)
    if equivalent and _same_major(asked, other):
        message += f", or call {equivalent}, its A2A {other} name"
    return build_error_response(request_id, VersionNotSupportedError(message=message + "."))


def _same_major(asked: str, version: str) -> bool:
    major = asked.split(".", 1)[0]
    return asked == version or (major.isascii() and major.isdigit() and int(major) == int(version.split(".")[0]))


def v03_invalid_params(
    dispatcher: JsonRpcDispatcher, method: str, obj: dict[str, Any], request_id: str | int | None
) -> dict[str, Any] | None:
    """-32602 for a v0.3 request whose `params` do not validate, or None.

    The SDK's v0.3 adapter validates the whole request with its pydantic model and answers
    any mistake with -32600 (invalid request) and a traceback in the log; JSON-RPC 2.0 §5.1
    says invalid method parameters are -32602. A mistake outside `params` (the envelope)
    stays the adapter's -32600.
    """
    compat = getattr(dispatcher, "_v03_adapter", None)
    model = getattr(compat, "METHOD_TO_MODEL", {}).get(method) if compat is not None else None
    if model is None:
        return None
    try:
        model.model_validate(obj)
    except ValidationError as exc:
        errors = exc.errors()
        if not errors or any(not e["loc"] or e["loc"][0] != "params" for e in errors):
            return None
        described = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in errors[:5])
        return build_error_response(
            request_id, InvalidParamsError(message=f"Invalid params for {method}: {described}.")
        )
    return None
