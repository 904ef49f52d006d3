"""A dispatched task's relay (seed 003): the agent's events to the task's log, its injects and its observer.

- text of a working event -> `delay` inject, at most one per task per
  `inject_min_interval` (leading edge; the rest are dropped, not deferred);
- the terminal event -> `auto` inject with the result (never throttled), saved
  with the task's end before it is sent (`core.broker.store`);
- every event's text and the end -> the task's hub stream `a2a_<taskId>`
  (`core.broker.task_log`), readable and resumable by id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import Literal

from core import metrics, tracing
from core.broker import wire
from core.broker.connection import TaskIdleError
from core.broker.inject import AUTO, DELAY, Inject, InjectPublisher
from core.broker.store import BrokerStore
from core.broker.task import BrokerTask
from core.delegation.registry import RemoteAgentError
from core.i18n import N_, _
from core.settings import Settings

log = logging.getLogger(__name__)

RECENT_TASKS = 100
TIMEOUT = "timeout"  # a task state of the broker's own, next to A2A's
STOPPED = N_("The task was stopped: the broker is shutting down.")


class TaskRelay:
    """The running tasks, the last finished ones, and the relay of each (`run`)."""

    def __init__(
        self, settings: Settings, store: BrokerStore, injects: InjectPublisher, stopping: Callable[[], bool]
    ) -> None:
        self.settings = settings
        self.store = store
        self.injects = injects
        self.stopping = stopping  # the broker is stopping: a cut-off task was stopped, not canceled or failed
        self.tasks: dict[str, BrokerTask] = {}
        self.recent: deque[BrokerTask] = deque(maxlen=RECENT_TASKS)
        self.injects_throttled = 0
        self.tasks_finished: Counter[str] = Counter()

    async def _inject(self, record: BrokerTask, text: str, mode: Literal["delay", "auto"]) -> None:
        inject = Inject(
            agent_id=record.chat_agent_id,
            chat_id=record.chat_id,
            text=f"[{record.agent.name}] {text}",
            mode=mode,
            task_id=record.id,
            session_id=record.session_id,
            position=None if mode == AUTO else record.events,  # a result's is RESULT_POSITION (`log_position`)
        )
        if mode == AUTO:  # the result is saved with the task's end before it is sent
            try:
                await self.store.finish_task(record.id, record.state, inject.text, sent=not self.injects.configured)
            except Exception:  # the database is down: send it anyway, it just is not durable
                log.exception("could not save the result of task %s", record.id)
        await self.injects.publish(inject)
        record.injects += 1
        if record.first_inject_at is None:
            record.first_inject_at = time.time()

    async def run(self, record: BrokerTask) -> None:
        """Relay the task's events to its log, its injects and its observer until it ends (or is canceled)."""
        attributes = {"a2a.task.id": record.id, "agent.id": record.agent.id, "broker.chat.id": record.chat_id}
        with tracing.span("broker.task", kind=tracing.SpanKind.CLIENT, attributes=attributes):
            await self._run(record)  # the agent gets the span's `traceparent` with the task (core/tracing.py)

    async def _run(self, record: BrokerTask) -> None:
        stream = record.agent.open_task(record.text, task_id=record.id)
        result = wire.Answer()
        state, final_text = "failed", ""
        try:
            async with contextlib.aclosing(stream.events()) as events:
                async for event in events:
                    record.events += 1
                    record.updated_at = time.time()
                    record.remote_task_id = stream.remote_task_id
                    if event.state:
                        record.state = event.state
                    if event.text and record.task_log is not None:
                        await record.task_log.text(wire.answer_piece(event))
                    if event.text and record.observer is not None:
                        await self._observe(record, record.observer.on_text(wire.answer_piece(event)))
                    if event.kind == "artifact":
                        result.add_artifact(event)
                        if event.text:  # seed 003: each event's text is injected, artifacts' too (throttled)
                            record.last_text = event.text
                            await self._progress(record, event.text)
                        continue
                    if event.final:
                        # Interrupted states (input-required, auth-required) end the relay too, under their name.
                        state = (
                            "failed"
                            if event.state == "rejected"
                            else (
                                event.state
                                if event.state in wire.TERMINAL_STATES | wire.INTERRUPTED_STATES
                                else "completed"
                            )
                        )
                        final_text = result.text(event)
                        break
                    if event.text:
                        record.last_text = result.last_progress = event.text
                        await self._progress(record, event.text)
        except asyncio.CancelledError:
            state = "canceled"
            final_text = _("The task was canceled.") if record.cancel_requested or not self.stopping() else _(STOPPED)
            await asyncio.shield(self.finish(record, state, final_text))
            raise
        except TaskIdleError as exc:
            state, final_text = TIMEOUT, _("The task timed out: {reason}.").format(reason=exc)
        except ConnectionError:
            # The server closes agents' sockets first when it stops: that is not the agent's failure.
            state, final_text = (
                ("canceled", _(STOPPED))
                if self.stopping()
                else ("failed", _("The task failed: the agent disconnected."))
            )
        except RemoteAgentError as exc:
            state, final_text = "failed", _("The task failed: {reason}.").format(reason=exc)
        except Exception as exc:  # a bug here must still tell the chat the task is over
            log.exception("relay of task %s failed", record.id)
            state, final_text = "failed", f"The task failed in the broker: {type(exc).__name__}."
        else:
            if state == "failed":
                final_text = (
                    _("The task failed: {reason}").format(reason=final_text) if final_text else _("The task failed.")
                )
            elif state == "canceled":
                final_text = (
                    _("The task was canceled: {reason}").format(reason=final_text)
                    if final_text
                    else _("The task was canceled.")
                )
            elif state in wire.INTERRUPTED_STATES:
                final_text = final_text or _("The agent needs more from you ({state}).").format(state=state)
            final_text = final_text or _("The task completed.")
        await self.finish(record, state, final_text)

    async def _progress(self, record: BrokerTask, text: str) -> None:
        now = time.monotonic()
        if (now - record._last_delay) * 1000 < self.settings.inject_min_interval:
            record.throttled += 1
            self.injects_throttled += 1
            return
        record._last_delay = now
        await self._inject(record, text, DELAY)

    async def finish(self, record: BrokerTask, state: str, text: str) -> None:
        """End the task once: its result inject, its log's end, its observer's `on_end`."""
        if record.finished_at is not None:
            return
        record.state, record.finished_at = state, time.time()
        record.runner = None
        self.tasks.pop(record.id, None)
        self.recent.append(record)
        self.tasks_finished[state] += 1
        metrics.BROKER_TASKS.labels(state).inc()
        try:
            await self._inject(record, text, AUTO)
        except Exception:
            log.exception("the final inject of task %s failed", record.id)
        if record.task_log is not None:
            await record.task_log.end(state, text)
        if record.observer is not None:
            await self._observe(record, record.observer.on_end(state, text))

    @staticmethod
    async def _observe(record: BrokerTask, call: Awaitable[None]) -> None:
        """An observer's failure is logged; it never stops the relay or the injects."""
        try:
            await call
        except Exception:
            log.exception("the observer of task %s failed", record.id)
