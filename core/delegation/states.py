"""The one vocabulary of a delegated task's state, for every place that shows it.

The chat's card, the side panel's tab, `/audit` and the API (`state`) all say the
same word: the A2A task state itself. `TaskState` names them; `state_word` maps
anything else (an unknown or missing state) to a word a reader understands, and
`short_task_text` is the short form of a task's request that tabs and cards show.
"""

from __future__ import annotations

from core.delegation.tasks import CANCELED, COMPLETED, FAILED, SUBMITTED, TERMINAL_STATES, WORKING

__all__ = ["STATE_WORDS", "SHORT_TEXT_CHARS", "is_terminal", "short_task_text", "state_word"]

# The words, in a task's life order; the API's `state` values are the same strings.
STATE_WORDS: dict[str, str] = {
    SUBMITTED: "submitted",
    WORKING: "working",
    COMPLETED: "completed",
    FAILED: "failed",
    CANCELED: "canceled",
}
SHORT_TEXT_CHARS = 32


def state_word(state: str | None) -> str:
    """The word shown for a task state (`submitted` when it has none yet)."""
    if not state:
        return STATE_WORDS[SUBMITTED]
    return STATE_WORDS.get(state, state)


def is_terminal(state: str | None) -> bool:
    """Whether the task has ended (completed, failed or canceled)."""
    return state in TERMINAL_STATES


def short_task_text(text: str, limit: int = SHORT_TEXT_CHARS) -> str:
    """One line of at most `limit` characters of a task's request (an ellipsis when cut)."""
    line = " ".join((text or "").split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"
