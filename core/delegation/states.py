"""The one vocabulary of a delegated task's state, for every place that shows it.

The chat's card, the side panel's tab, `/audit` and the API (`state`) all say the
same word: the A2A task state itself. `TaskState` names them; `state_word` maps
anything else (an unknown or missing state) to a word a reader understands, and
`short_task_text` is the short form of a task's request that tabs and cards show.

The words are also the English labels people read; `state_label` gives the label in the
reader's language (core/i18n), and tells apart what the seeds word differently: waiting
before the first token, generating after it, a timeout and a lost connection (error codes
`TIMED_OUT` and `CONNECTION_LOST`, sent with the task's `error` event).
"""

from __future__ import annotations

from core.delegation.tasks import (
    AUTH_REQUIRED,
    CANCELED,
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    SUBMITTED,
    TERMINAL_STATES,
    WORKING,
)
from core.i18n import N_, _, pgettext

__all__ = [
    "CONNECTION_LOST",
    "STATE_WORDS",
    "SHORT_TEXT_CHARS",
    "TIMED_OUT",
    "is_terminal",
    "short_task_text",
    "state_label",
    "state_word",
]

# The words, in a task's life order; the API's `state` values are the same strings.
STATE_WORDS: dict[str, str] = {
    SUBMITTED: N_("submitted"),
    WORKING: N_("working"),
    INPUT_REQUIRED: N_("input-required"),
    AUTH_REQUIRED: N_("auth-required"),
    COMPLETED: N_("completed"),
    FAILED: N_("failed"),
    CANCELED: N_("canceled"),
}
# Why a task failed, when a reader is told in other words than "failed" (the `code` of its `error` event).
TIMED_OUT = "timeout"
CONNECTION_LOST = "connection_lost"
SHORT_TEXT_CHARS = 32


def state_word(state: str | None) -> str:
    """The word shown for a task state (`submitted` when it has none yet)."""
    if not state:
        return STATE_WORDS[SUBMITTED]
    return STATE_WORDS.get(state, state)


def state_label(state: str | None, *, has_text: bool = True, reason: str | None = None) -> str:
    """The label people read for a task state, in their language.

    English shows the state word itself. Chinese follows the seeds: 等待回复… until the first
    token (`has_text` False), 生成中… while text streams, 完成, 任务超时 for a timeout and 连接中断
    when the stream was lost (`reason`).
    """
    word = state_word(state)
    if word == WORKING and not has_text:
        return pgettext("task state, before the first token", "working")
    if word == FAILED and reason == TIMED_OUT:
        return pgettext("task state, timed out", "failed")
    if word == FAILED and reason == CONNECTION_LOST:
        return pgettext("task state, its stream was lost", "failed")
    return _(word) if word in STATE_WORDS.values() else word


def is_terminal(state: str | None) -> bool:
    """Whether the task has ended (completed, failed or canceled)."""
    return state in TERMINAL_STATES


def short_task_text(text: str, limit: int = SHORT_TEXT_CHARS) -> str:
    """One line of at most `limit` characters of a task's request (an ellipsis when cut)."""
    line = " ".join((text or "").split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"
