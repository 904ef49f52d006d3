"""The record of one callee's run, local or remote, as `DelegationService` saves it; and `BackgroundTask`.

`LocalRun` wraps the chat engine's `AgentRun` of a local callee; `RemoteRun` relays a
remote callee's stream into the task buffer and collects its chunks (`relay`). Both tell
the service how the run ended (`result`), take a stop (`mark_stopped`), and give the rows
to save in the task's hidden session (`rows`, each with `message_fields`: `source='a2a'` and the caller's context).
`BackgroundTask` is a `RemoteRun` fed from elsewhere: the broker's relay.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from core import tracing
from core.chat.run import AgentRun
from core.chat.tools import ToolContext
from core.delegation.notes import ANSWER_TEXT_ID, STATUS_TEXT_ID, layout
from core.delegation.registry import Asker, RemoteAgent, RemoteAgentError
from core.delegation.states import CONNECTION_LOST
from core.delegation.tasks import CANCELED, COMPLETED, FAILED, TERMINAL_STATES, task_stream_key
from core.i18n import _
from core.streaming import events as ev
from core.streaming.backend import StreamHubBackend

logger = logging.getLogger(__name__)

__all__ = ["BackgroundTask", "LocalRun", "RemoteRun", "RunRecord", "estimate_tokens", "message_fields"]

CHARS_PER_TOKEN = 4  # the usual rule of thumb for English text with BPE tokenizers


def estimate_tokens(text: str) -> int:
    """A token count for text whose real count never arrived (a stopped stream): about 4 characters a token."""
    return max(1, round(len(text) / CHARS_PER_TOKEN)) if text else 0


class LocalRun:
    """The record of a local callee's run (the chat engine's `AgentRun`)."""

    def __init__(self, run: AgentRun) -> None:
        self.run = run

    @property
    def input_tokens(self) -> int:
        """Prompt tokens over the run."""
        return self.run.input_tokens

    @property
    def output_tokens(self) -> int:
        """Completion tokens over the run.

        For a run stopped before the model reported usage: an estimate from the text it streamed
        (`estimate_tokens`), so a stopped task does not read as 0 tokens.
        """
        if self.run.output_tokens == 0 and self.text():
            return estimate_tokens(self.text())
        return self.run.output_tokens

    @property
    def cost_usd(self) -> float | None:
        """The run's price at LiteLLM's list prices (None: its model has none)."""
        return self.run.cost_usd

    def result(self) -> tuple[str, str | None]:
        """(the task's end state, its error) from how the run ended."""
        outcome = self.run.outcome
        return (
            (COMPLETED, None)
            if outcome is not None and outcome.status == "complete"
            else (FAILED, outcome.error if outcome else "the agent did not answer")
        )

    def mark_stopped(self, *, status: str, error: str | None) -> None:
        """The task was stopped (timeout: `error`; cancel: kept as the engine saved it)."""
        outcome = self.run.outcome
        if outcome is None or status == "canceled":
            return
        outcome.status, outcome.error = status, error
        for row in outcome.rows:
            if row.get("status") == "canceled":
                row["status"], row["error"] = status, error

    def rows(self) -> list[dict[str, Any]]:
        """The assistant rows to save in the task's hidden session."""
        return self.run.outcome.rows if self.run.outcome else []

    def text(self) -> str:
        """What the callee said."""
        return self.run.outcome.text if self.run.outcome else ""


@dataclass(slots=True)
class RemoteRun:
    """The record of a remote callee's answer: its stream relayed chunk by chunk, and its result."""

    agent_id: str
    fields: dict[str, Any]
    chunks: list[tuple[str, str]] = field(default_factory=list)  # (text part id, text): `notes.layout`
    answer: str | None = None  # the agent's answer, when it said which (else: what it streamed)
    state: str | None = None
    error: str | None = None
    status: str = "complete"
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None  # a remote agent's price is its own

    def result(self) -> tuple[str, str | None]:
        """(the task's end state, its error) from what the remote agent reported."""
        if self.state == COMPLETED:
            return COMPLETED, None
        if self.state == CANCELED:
            return CANCELED, self.error or _("the remote agent canceled the task")
        self.status = "error"
        return FAILED, self.error or _("the remote agent failed")

    def mark_stopped(self, *, status: str, error: str | None) -> None:
        """The task was stopped: its saved answer carries `status` and `error`."""
        self.status, self.error = status, error

    def rows(self) -> list[dict[str, Any]]:
        """The assistant row to save in the task's hidden session (none for an empty, complete answer)."""
        if not self.chunks and self.answer is None and self.status == "complete":
            return []
        return [
            {
                "role": "assistant",
                "content": self.text(),
                "model_id": f"a2a/{self.agent_id}",
                "status": self.status,
                "error": self.error,
                **self.fields,
            }
        ]

    def text(self) -> str:
        """The remote agent's answer: what it gave as its result, else all it streamed (notes on their own lines)."""
        return self.answer if self.answer is not None else layout(self.chunks)

    async def relay(
        self,
        hub: ev.EventSink,
        key: str,
        remote: RemoteAgent,
        text: str,
        task_id: str,
        files: list[Any] | None = None,
        *,
        ask: Asker | None = None,
    ) -> None:
        """Ask `remote` for `text` and relay its events into the task buffer `key` until it reports a terminal state.

        `files` go along as file parts to an agent that takes them (`takes_files`), else they are named in the text.

        The run's chunks, answer, state and error are recorded here; an unreachable agent is a failure.
        `ask` answers the agent's questions back (`core.delegation.questions`).
        """
        code = None  # the error event's machine code (states.py): the panel says "connection lost" for it
        try:
            if files and getattr(remote, "takes_files", False):
                events = remote.stream(text, task_id=task_id, ask=ask, files=files)  # type: ignore[call-arg]
            else:
                named = "".join(f"\n\nAttached file: {f.name} ({f.mime})" for f in files or [])
                events = remote.stream(text + named, task_id=task_id, ask=ask)
            async for event in events:
                if event.text:
                    part = STATUS_TEXT_ID if event.status_text else ANSWER_TEXT_ID
                    self.chunks.append((part, event.text))
                    await ev.publish(hub, key, ev.TextDelta(part, event.text))
                if event.answer is not None:  # the result, not the progress notes around it
                    self.answer = event.answer
                if event.error:
                    self.error = event.error
                if event.final or (event.state in TERMINAL_STATES):
                    self.state = event.state if event.state in TERMINAL_STATES else COMPLETED
                    if self.state == FAILED and not self.error:
                        self.error = _("{name} reported that the task failed.").format(name=remote.name)
                    break
            else:
                self.state, self.error = (
                    FAILED,
                    _("{name} ended the stream without a final state.").format(name=remote.name),
                )
        except (ConnectionError, OSError) as exc:
            # The reader's words (the turn's language); the socket's own English goes to the log.
            logger.info("delegation to %s lost its connection: %s", remote.name, exc)
            reason = _("the connection failed or was lost")
            self.state, self.error = (
                FAILED,
                _("{name} is unreachable: {reason}").format(name=remote.name, reason=reason),
            )
            code = CONNECTION_LOST
        except RemoteAgentError as exc:
            self.state, self.error = FAILED, _("{name} is unreachable: {reason}").format(name=remote.name, reason=exc)
        if self.state == FAILED and self.error:
            await ev.publish(hub, key, ev.Error(self.error, code))


RunRecord = LocalRun | RemoteRun


def message_fields(task_id: str, ctx: ToolContext) -> dict[str, Any]:
    """The columns every message of a delegated task carries (seed 000 §3.1)."""
    return {
        "source": "a2a",
        "a2a_task_id": task_id,
        "caller_agent_id": ctx.agent_id,
        "caller_session_id": ctx.session_id,
    }


class TaskEnds(Protocol):
    """Where a background task's events and end go: the `DelegationService` (a protocol: no import cycle)."""

    @property
    def hub(self) -> StreamHubBackend:
        """The hub holding the task's stream."""
        ...

    async def finish_task(
        self, task_id: str, session_id: str, record: RunRecord, state: str, error: str | None, started: float
    ) -> None:
        """Save the task's end, once."""
        ...


class BackgroundTask:
    """The record of a task that runs elsewhere (see `DelegationService.open_background_task`).

    `on_text` appends to the task's stream and saved answer; `on_end` records how it ended
    (once). Both are what the broker's relay calls (`core.broker.service.TaskObserver`).
    """

    # The broker's end states, as task states: a timeout is a failure, an agent that needs
    # more input has ended its turn (its text says what it needs).
    _STATES = {"completed": COMPLETED, "canceled": CANCELED, "input-required": COMPLETED, "auth-required": COMPLETED}

    def __init__(self, service: TaskEnds, task_id: str, session_id: str, record: RemoteRun) -> None:
        self.service = service
        self.task_id = task_id
        self.session_id = session_id  # the task's hidden session, which keeps the answer
        self.record = record
        self.ended = False
        self._started = time.monotonic()

    async def on_text(self, text: str) -> None:
        """A piece of the agent's answer."""
        if self.ended or not text:
            return
        self.record.chunks.append((ANSWER_TEXT_ID, text))
        await ev.publish(self.service.hub, task_stream_key(self.task_id), ev.TextDelta(ANSWER_TEXT_ID, text))

    async def on_end(self, state: str, text: str) -> None:
        """The work is over: `state` as the broker names it, `text` its closing words."""
        if self.ended:
            return
        self.ended = True
        final = self._STATES.get(state, FAILED)
        error: str | None = None
        self.record.state = final
        if final != COMPLETED:
            error = text or f"the task ended as {state}"
            self.record.mark_stopped(status="canceled" if final == CANCELED else "error", error=error)
            if final == FAILED:
                await ev.publish(self.service.hub, task_stream_key(self.task_id), ev.Error(error))
        await self.service.finish_task(self.task_id, self.session_id, self.record, final, error, self._started)


def hop_span(task_id: str, agent_id: str, depth: int, *, remote: bool) -> AbstractContextManager[Any]:
    """The `delegation.task` span of one hop (core/tracing.py): a client span when the callee is remote."""
    return tracing.span(
        "delegation.task",
        kind=tracing.SpanKind.CLIENT if remote else tracing.SpanKind.INTERNAL,
        attributes={"a2a.task.id": task_id, "agent.id": agent_id, "delegation.depth": depth},
    )
