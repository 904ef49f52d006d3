"""What a chat request can be refused for: `ChatError` and its kinds, each with a stable `code` and an HTTP status.

Raised by `ChatEngine` (`core.chat.engine`, which exports them too); the routes answer them with
`code` beside `detail`, the pages show `message` (docs/ARCHITECTURE.md, "Error codes of the REST API").
"""

from __future__ import annotations

from core.errors import AppError

__all__ = [
    "RUNNING_LIMIT_RETRY_AFTER_S",
    "AgentNotFoundError",
    "ChatError",
    "InvalidMessageError",
    "MessageNotFoundError",
    "NotLastMessageError",
    "NothingToAnswerAgainError",
    "SessionNotFoundError",
    "TooManyRunningTurnsError",
    "TurnInProgressError",
]

# How long a caller refused for too much running work (turns here, delegated tasks in `core.delegation`) is told
# to wait before it tries again (`Retry-After`): long enough not to be a busy loop, short enough that a turn that
# ended meanwhile is not waited for long (docs/ARCHITECTURE.md, "Running work per user").
RUNNING_LIMIT_RETRY_AFTER_S = 10


class ChatError(AppError):
    """A request the engine cannot carry out; `code` is stable, `message` is for people."""

    code = "chat_error"
    status_code = 400
    headers: dict[str, str] = {}  # read only: HTTP headers of the refusal (`Retry-After`)

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SessionNotFoundError(ChatError):
    """No such session for this user."""

    code = "session_not_found"
    status_code = 404


class AgentNotFoundError(ChatError):
    """No such agent."""

    code = "agent_not_found"
    status_code = 404


class InvalidMessageError(ChatError):
    """Empty or too long."""

    code = "invalid_message"
    status_code = 422


class MessageNotFoundError(ChatError):
    """No such message in the chat (edit and send again)."""

    code = "message_not_found"
    status_code = 404


class NotLastMessageError(ChatError):
    """Only the last message of the user may be edited and sent again: answers and messages follow this one."""

    code = "not_last_message"
    status_code = 409


class NothingToAnswerAgainError(ChatError):
    """A chat without a message of the user has no answer to write again."""

    code = "nothing_to_answer_again"
    status_code = 409


class TurnInProgressError(ChatError):
    """The session is already answering."""

    code = "turn_in_progress"
    status_code = 409


class TooManyRunningTurnsError(ChatError):
    """The user has as many turns running as one account may (`max_running_turns_per_user`)."""

    code = "too_many_running_turns"
    status_code = 429
    headers = {"Retry-After": str(RUNNING_LIMIT_RETRY_AFTER_S)}
