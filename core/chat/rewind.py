"""What a user's turn saves as it starts: a new message, or the chat rewound to its last message.

`ChatEngine` (`core.chat.engine`) claims the session's turn, reads the chat and its history, then
calls one of these in the same unit of work; each returns what the turn runs on. A refusal raises
before anything is written, so a refused request changes nothing.

- `new_message`: sending. The user's message and the turn's draft answer are appended.
- `answer_again` (regenerate): the assistant rows after the user's last message are removed (the
  whole last answer: every step of it, with the tool calls and their results, a delegation's
  `agent_invoke` too) and the turn answers that message again. The delegated tasks' records stay
  (`a2a_tasks` and their hidden sessions: the audit trail), and so do the notes of background tasks
  saved after the message (system rows: the chat inbox's position in each task is read from them).
- `edit_last_message` (edit and send again): the user's last message gets its new text, everything
  after it is removed but the notes of background tasks that have a position (as in regenerate: the
  chat inbox's position in each task), and the turn answers it. Only that message may be edited.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlmodel.ext.asyncio.session import AsyncSession

from core.chat import sessions as sessions_store
from core.chat.drafts import draft_fields
from core.chat.errors import MessageNotFoundError, NothingToAnswerAgainError, NotLastMessageError
from core.i18n import _
from models import Agent, AgentMessage

__all__ = ["NewMessage", "PrepareTurn", "PreparedTurn", "answer_again", "edit_last_message", "new_message"]


@dataclass(frozen=True, slots=True)
class PreparedTurn:
    """What a turn runs on: the history the model reads, the message it answers, its draft answer.

    Attributes:
        history: the saved messages the model reads, in order.
        anchor: the user message the turn answers.
        draft: the turn's draft answer (status `streaming`).
        rewound: the history was cut (pages show the chat again from its saved messages).
    """

    history: list[AgentMessage]
    anchor: AgentMessage
    draft: AgentMessage
    rewound: bool = False


# Called with the unit of work, the chat's id, its agent, its history and the check its draft's append runs
# (the per-user limit of running turns in a cluster: `turn_starts.RunningTurnsLimit`), if any.
PrepareTurn = Callable[
    [AsyncSession, str, Agent, list[AgentMessage], sessions_store.CountedCheck | None], Awaitable[PreparedTurn]
]


@dataclass(frozen=True, slots=True)
class NewMessage:
    """Sending: the user's message (already validated) and the draft appended (a `PrepareTurn`).

    Called, it appends them in the unit of work it is given and commits (`add_messages`); on SQLite the
    new messages of turns that start together are written together instead (`core.chat.turn_starts`),
    with `rows` and `prepared`.
    """

    text: str
    files: list[dict[str, Any]] | None = None

    def rows(self, agent: Agent) -> list[dict[str, Any]]:
        """The fields of the two rows: the user's message, the turn's draft answer."""
        return [
            {"role": "user", "content": self.text, "source": "user", "attachments": self.files or None},
            draft_fields(agent),
        ]

    def prepared(self, history: list[AgentMessage], rows: list[AgentMessage]) -> PreparedTurn:
        """What the turn runs on, once `rows` are saved."""
        user_row, draft = rows
        return PreparedTurn([*history, user_row], user_row, draft)

    async def __call__(
        self,
        s: AsyncSession,
        session_id: str,
        agent: Agent,
        history: list[AgentMessage],
        check: sessions_store.CountedCheck | None = None,
    ) -> PreparedTurn:
        """Append both rows in the unit of work `s` (`check` first) and commit."""
        rows = await sessions_store.add_messages(s, session_id=session_id, messages=self.rows(agent), check=check)
        return self.prepared(history, rows)


def new_message(text: str, files: list[dict[str, Any]] | None = None) -> NewMessage:
    """Append the user's message (already validated) and the draft (`add_messages` commits, as each of these)."""
    return NewMessage(text, files)


def answer_again() -> PrepareTurn:
    """Remove the last answer (the assistant rows after the user's last message) and answer that message again."""

    async def prepare(
        s: AsyncSession,
        session_id: str,
        agent: Agent,
        history: list[AgentMessage],
        check: sessions_store.CountedCheck | None,
    ) -> PreparedTurn:
        anchor = last_user_message(history)
        if anchor is None:
            raise NothingToAnswerAgainError(_("This chat has no message of yours to answer again."))
        dropped = [m for m in history if m.sort_order > anchor.sort_order and m.role == "assistant"]
        await sessions_store.remove_messages_after(
            s, session_id=session_id, sort_order=anchor.sort_order, role="assistant"
        )
        [draft] = await sessions_store.add_messages(
            s, session_id=session_id, messages=[draft_fields(agent)], check=check
        )
        return PreparedTurn([m for m in history if m not in dropped], anchor, draft, rewound=True)

    return prepare


def edit_last_message(message_id: int, text: str) -> PrepareTurn:
    """Give the user's last message the new text (already validated), remove what follows it, answer it."""

    async def prepare(
        s: AsyncSession,
        session_id: str,
        agent: Agent,
        history: list[AgentMessage],
        check: sessions_store.CountedCheck | None,
    ) -> PreparedTurn:
        anchor = last_user_message(history)
        if not any(m.id == message_id and m.role == "user" for m in history):
            raise MessageNotFoundError(_("This chat has no message of yours with that id."))
        if anchor is None or anchor.id != message_id:
            raise NotLastMessageError(
                _("Only your last message can be edited and sent again; answers and messages follow this one.")
            )
        await sessions_store.remove_messages_after(s, session_id=session_id, sort_order=anchor.sort_order)
        anchor.content = text
        s.add(anchor)
        [draft] = await sessions_store.add_messages(
            s, session_id=session_id, messages=[draft_fields(agent)], check=check
        )
        return PreparedTurn([m for m in history if m.sort_order <= anchor.sort_order], anchor, draft, rewound=True)

    return prepare


def last_user_message(history: list[AgentMessage]) -> AgentMessage | None:
    """The user's last message in a chat's history (in order), if any."""
    return next((m for m in reversed(history) if m.role == "user"), None)
