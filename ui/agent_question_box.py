"""The answer box of a delegated task that asks back (issue 36), in its tab of the side panel.

A task in `input-required` (or `auth-required`) shows what the callee asks, an input and a
Send button; the answer goes into the same task (`DelegationService.questions.answer`) and
the callee goes on, so the box hides again once the task is `working`. The caller's turn
waits meanwhile; the panel's Stop still ends it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from nicegui import ui

from core.delegation.tasks import AUTH_REQUIRED
from core.i18n import _

__all__ = ["QuestionBox"]


class QuestionBox:
    """The question and the answer input of one task; hidden unless the task waits for an answer.

    Args:
        task_id: the task (its id is on the elements, for tests and scripts).
        on_send: sends the answer; raises nothing the person should see (it tells them itself).
    """

    def __init__(self, task_id: str, on_send: Callable[[str], Awaitable[bool]]) -> None:
        self.on_send = on_send
        self.state: str | None = None
        with (
            ui.column()
            .classes("w-full gap-1 q-my-sm q-pa-sm rounded-borders agent-question")
            .style("border: 1px solid var(--q-warning); max-width: 100%")
            .props(f"data-testid=agent-panel-question-box data-task-id={task_id}") as box
        ):
            self.box = box
            self.title = (
                ui.label("").classes("text-caption text-weight-medium").props("data-testid=agent-panel-question-title")
            )
            self.question = (
                ui.label("")
                .classes("text-body2 whitespace-pre-wrap")
                .style("overflow-wrap: anywhere")
                .props("data-testid=agent-panel-question")
            )
            with ui.row().classes("w-full items-center no-wrap gap-1"):
                self.input = (
                    ui.input(placeholder=_("Your answer"))
                    .props("dense outlined data-testid=agent-panel-answer-input")
                    .props("aria-label='" + _("Your answer") + "'")
                    .classes("col min-w-0")
                )
                self.input.on("keydown.enter", self._send)
                self.send = ui.button(icon="send", on_click=self._send).props(
                    "dense unelevated color=primary data-testid=agent-panel-answer-send "
                    "aria-label='" + _("Send the answer") + "'"
                )
        box.set_visibility(False)

    def show(self, state: str, question: str) -> None:
        """The task waits: show what it asks (`auth-required`: what it needs to go on)."""
        self.state = state
        self.title.set_text(_("The agent needs you to sign in:") if state == AUTH_REQUIRED else _("The agent asks:"))
        self.question.set_text(question or _("(no question text)"))
        self.input.enable()
        self.send.enable()
        self.box.set_visibility(True)

    def hide(self) -> None:
        """The task goes on, or has ended."""
        self.state = None
        self.box.set_visibility(False)

    async def _send(self) -> None:
        text = (self.input.value or "").strip()
        if not text or self.state is None:
            return
        self.input.disable()
        self.send.disable()
        if await self.on_send(text):
            self.input.set_value("")
            self.hide()
        else:
            self.input.enable()
            self.send.enable()
