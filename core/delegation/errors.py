"""A delegation's refusals and failures as the caller reads them (the `DelegationService`'s errors)."""

from __future__ import annotations

from core.chat.errors import RUNNING_LIMIT_RETRY_AFTER_S
from core.errors import AppError

__all__ = ["TOO_MANY_RUNNING_TASKS", "DelegationRefusedError", "TooManyDelegatedTasksError", "failure_text"]

TOO_MANY_RUNNING_TASKS = "too_many_running_tasks"  # the refusal's code (a tool result's metadata `code`)


class DelegationRefusedError(AppError, ValueError):
    """A delegation that was not started (unknown agent, bad input, limits); the message says why."""

    code = "delegation_refused"


class TooManyDelegatedTasksError(DelegationRefusedError):
    """The user has as many delegated tasks running as one account may; try again in `retry_after_s`."""

    code = TOO_MANY_RUNNING_TASKS
    retry_after_s = RUNNING_LIMIT_RETRY_AFTER_S


def failure_text(callee_name: str, error: str | None) -> str:
    """The tool's error for a failed task: who failed and why, the name said once.

    A timeout's reason already names the callee ("Coding Assistant did not finish within 0.5 s…");
    prefixing "Coding Assistant failed:" made the chat say it twice (issue 40).
    """
    reason = (error or "").strip()
    if not reason:
        return f"{callee_name} failed."
    if reason.startswith(callee_name):
        return reason
    return f"{callee_name} failed: {reason}"
