"""Questions back (issue 36): a delegated task that waits for its caller's answer, and the `ask_user` tool.

A callee may need more from its caller before it can go on: a remote A2A agent answers
`input-required` (or `auth-required`, "sign in first"), and a local agent calls the `ask_user`
tool. The task then waits, in the state the callee named, with its question:

- `TaskQuestions.ask` records the state and the question (the task row's `state`, a `state`
  event with `message` = the question in the task's buffer, so the side panel shows it with an
  answer box), then waits for the answer. The caller's turn waits with it (the `agent_invoke`
  call stays open), so Stop and the callee's timeout still end the task, canceled or failed.
- `TaskQuestions.answer` takes the answer (the panel's box, `POST /api/tasks/{id}/messages`, or an
  A2A caller's next message in the task), puts the task back to `working` and hands the answer
  to the waiting callee, which goes on in the same task (a remote agent: same taskId/contextId).

The questions wait in this process (a task runs where it started); an answer sent to a replica
that does not run the task finds none (409 `task_not_waiting`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from core.chat import sessions as sessions_store
from core.chat.prompts import ASK_USER_TOOL
from core.chat.tools import ToolContext, ToolResult
from core.delegation.registry import Asker
from core.delegation.tasks import INPUT_REQUIRED, WAITING_STATES, WORKING, TaskRecords
from core.errors import AppError

log = logging.getLogger(__name__)

__all__ = ["ASK_USER", "MAX_ANSWER_CHARS", "AskUserTool", "Question", "TaskNotWaitingError", "TaskQuestions"]

ASK_USER = "ask-user"  # the tool's type (a delegated local callee is always given it)
MAX_ANSWER_CHARS = 20_000  # as a delegation's input (core.delegation.tool.MAX_INPUT_CHARS)
MAX_QUESTION_CHARS = 4_000


class TaskNotWaitingError(AppError, ValueError):
    """An answer for a task that asks nothing now (it runs, has ended, or waits on another server)."""

    code = "task_not_waiting"


@dataclass(slots=True)
class Question:
    """A task's open question: who waits, in which state, for what."""

    task_id: str
    state: str
    text: str
    answer: asyncio.Future[str]
    session_id: str | None = None  # the task's hidden session, where the exchange is saved (None: not saved)
    fields: dict[str, Any] | None = None  # the columns of the saved messages (`runs.message_fields`)


class TaskQuestions:
    """The open questions of the tasks running in this process, by task id."""

    def __init__(self, records: TaskRecords) -> None:
        self.records = records
        self._open: dict[str, Question] = {}

    def pending(self, task_id: str) -> Question | None:
        """The task's open question, if it waits for an answer here."""
        return self._open.get(task_id)

    async def ask(
        self,
        task_id: str,
        question: str,
        *,
        state: str = INPUT_REQUIRED,
        session_id: str | None = None,
        fields: dict[str, Any] | None = None,
    ) -> str:
        """Put the task in `state` with `question` and wait for the answer (cancellation passes).

        With `session_id` and `fields`, the question and the answer are saved in the task's hidden
        session as the callee's and the caller's messages (a remote callee's exchange; a local
        callee's is in its tool call already).
        """
        state = state if state in WAITING_STATES else INPUT_REQUIRED
        question = question.strip()[:MAX_QUESTION_CHARS]
        waiting = Question(task_id, state, question, asyncio.get_running_loop().create_future(), session_id, fields)
        if session_id is not None and fields is not None:
            await self._save(session_id, [{"role": "assistant", "content": question, "status": "complete", **fields}])
        self._open[task_id] = waiting
        try:
            await self.records.set_state(task_id, state, WORKING, message=question)
            return await waiting.answer
        finally:
            if self._open.get(task_id) is waiting:
                del self._open[task_id]

    def asker(self, task_id: str, session_id: str, fields: dict[str, Any]) -> Asker:
        """How a remote run of the task asks back (`RemoteAgent.stream`'s `ask`), its exchange saved."""

        async def ask(state: str, question: str) -> str:
            return await self.ask(task_id, question, state=state, session_id=session_id, fields=fields)

        return ask

    async def answer(self, task_id: str, content: str) -> None:
        """Give the waiting task its answer: it is `working` again when this returns.

        Raises:
            TaskNotWaitingError: the task asks nothing here now.
        """
        waiting = self._open.pop(task_id, None)
        if waiting is None or waiting.answer.done():
            raise TaskNotWaitingError(f"Task {task_id} is not waiting for an answer.")
        if waiting.session_id is not None and waiting.fields is not None:
            await self._save(waiting.session_id, [{"role": "user", "content": content, **waiting.fields}])
        if waiting.answer.done():  # stopped meanwhile (Stop, its timeout): its end is recorded, not `working`
            raise TaskNotWaitingError(f"Task {task_id} was stopped before the answer reached it.")
        # Working again before the callee goes on: its end, however soon, is written after this.
        await self.records.set_state(task_id, WORKING, waiting.state)
        if not waiting.answer.done():
            waiting.answer.set_result(content)

    async def _save(self, session_id: str, rows: list[dict[str, Any]]) -> None:
        try:
            async with self.records.db.session() as s:
                await sessions_store.append_messages(s, session_id=session_id, messages=rows)
                await s.commit()
        except Exception:  # the exchange goes on; only its record is missing
            log.exception("could not save a question's exchange in session %s", session_id)


class AskUserTool:
    """`ask_user`: a delegated agent asks its caller (the person, or the calling agent) and waits for the answer."""

    tool_type = ASK_USER
    name = ASK_USER_TOOL
    description = (
        "Ask whoever gave you this task a question and wait for the answer, when you cannot go on "
        "without it (for example which of two things they mean). Ask one short, clear question."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"question": {"type": "string", "description": "The question, in one or two sentences"}},
        "required": ["question"],
        "additionalProperties": False,
    }

    def __init__(self, questions: TaskQuestions) -> None:
        self.questions = questions

    async def execute(self, arguments: Any, config: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Ask and wait (see `TaskQuestions.ask`); outside a delegated task there is nobody to ask this way."""
        question = arguments.get("question") if isinstance(arguments, dict) else None
        if not isinstance(question, str) or not question.strip():
            return ToolResult(False, error='"question" is required: the question to ask, as a non-empty string')
        if ctx.task_id is None:
            return ToolResult(False, error="ask_user works only in a delegated task; here, ask in your reply.")
        answer = await self.questions.ask(ctx.task_id, question)
        return ToolResult(True, data=answer)
