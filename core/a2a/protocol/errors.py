"""The app's own JSON-RPC error (divergence 5), registered in the SDK's maps of error types to codes.

Importing this module registers it; `core.a2a.protocol` imports it, so every dispatcher knows it.
The SDK's errors that the app raises are re-exported from here.
"""

from __future__ import annotations

from a2a.server.jsonrpc_models import JSONRPCError
from a2a.server.request_handlers import response_helpers as _sdk_response_helpers
from a2a.utils import errors as _sdk_errors
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from core.errors import AppError

# The SDK's errors that this app raises (each maps to its JSON-RPC code in the SDK), and the app's own.
__all__ = [
    "TOO_MANY_RUNNING_TASKS_CODE",
    "A2AError",
    "ContentTypeNotSupportedError",
    "InvalidParamsError",
    "PushNotificationNotSupportedError",
    "TaskNotCancelableError",
    "TaskNotFoundError",
    "TooManyRunningTasksError",
    "UnsupportedOperationError",
]

TOO_MANY_RUNNING_TASKS_CODE = -32029


class TooManyRunningTasksError(AppError, A2AError):
    """The caller's user has as many delegated tasks running as one account may (divergence 5).

    `data` carries `{"code": "too_many_running_tasks", "retryAfterSeconds": n}` for scripts.
    """

    code = "a2a_too_many_running_tasks"

    message = "Too many running tasks"


def _register_app_error(error: type[A2AError], code: int, reason: str, http: tuple[int, str]) -> None:
    _sdk_errors.JSON_RPC_ERROR_CODE_MAP[error] = code
    _sdk_errors.A2A_ERROR_REASONS[error] = reason
    _sdk_errors.A2A_ERROR_MAPPING[error] = _sdk_errors.ErrorMapping(http[0], http[1], reason)  # HTTP+JSON's answer
    _sdk_response_helpers.EXCEPTION_MAP[error] = JSONRPCError


_register_app_error(
    TooManyRunningTasksError, TOO_MANY_RUNNING_TASKS_CODE, "TOO_MANY_RUNNING_TASKS", (429, "RESOURCE_EXHAUSTED")
)
