"""Pieces of the chat page: a new chat's welcome, a tool call's card, the user's text, the editor of a message."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from nicegui import ui

from core.broker.tools import TOOL_NAME_PREFIX
from core.delegation import is_terminal, short_task_text, state_label, state_word
from core.i18n import N_, _, format_number
from models import Agent
from ui.agent_invoke_panel import STATUS_COLORS
from ui.frame import testid
from ui.streaming import ChatMarkdown

# Shown on a new chat's welcome; each runs with the offline demo model (core/chat/demo_model.py).
EXAMPLE_PROMPTS = (
    N_("Hello! What can you do?"),
    N_("@coding-assistant write a function that greets"),
    N_("@planner plan a launch party and ask @@coding-assistant for the invitation script"),
)
_FENCED = re.compile(r"(^```[^\n]*\n.*?^```[ \t]*$)", re.MULTILINE | re.DOTALL)


def welcome(agents: list[Agent], try_example: Callable[[str], Awaitable[None]]) -> ui.element:
    """A new chat's first screen: the agents, what `@agent` and `/background` do, and example prompts."""
    with ui.column().classes("w-full gap-3 q-pa-md welcome-card").props("data-testid=welcome") as welcome:
        ui.label(_("Start a conversation")).classes("text-h5")
        ui.label(
            _(
                "Pick an agent below and write to it. Agents can hand part of the work to other agents: "
                "their answers stream into the side panel."
            )
        ).classes("text-grey-8")
        with ui.column().classes("w-full gap-2").props("data-testid=welcome-agents"):
            for agent in agents:
                with (
                    ui.row()
                    .classes("w-full items-start gap-2 no-wrap")
                    .props(f"data-testid=welcome-agent data-agent={agent.slug}")
                ):
                    ui.icon("smart_toy", size="sm").classes("text-primary q-mt-xs")
                    with ui.column().classes("gap-0 min-w-0"):
                        with ui.row().classes("items-baseline gap-2"):
                            ui.label(agent.name).classes("text-weight-medium")
                            ui.label(f"@{agent.slug}").classes("font-mono text-caption text-grey-7")
                        if agent.description:
                            ui.label(agent.description).classes("text-grey-8 text-body2")
        with ui.column().classes("gap-1 text-body2 text-grey-8").props("data-testid=welcome-help"):
            ui.markdown(
                _(
                    "**`@agent-id` …** hands that part of your message to another agent "
                    "(`@coding-assistant write a function`); the answer streams into the side panel."
                )
            )
            ui.markdown(
                _(
                    "**`/background @agent-id` …** sends a task to an agent connected to the broker; "
                    "it keeps working while you chat, and its progress shows as notes."
                )
            )
        ui.label(_("Try one:")).classes("text-weight-medium")
        with ui.row().classes("w-full gap-2"):
            for prompt in map(_, EXAMPLE_PROMPTS):
                ui.button(prompt, on_click=lambda p=prompt: try_example(p)).props(
                    "outline no-caps align=left data-testid=example-prompt"
                ).classes("text-left").mark("example-prompt")
    return welcome


class ToolCallCard:
    """A compact card for one tool call inside an assistant message.

    For a delegation it names the callee (display name) and the short request, and says the task's
    state in the same word as the side panel, `/audit` and the API; other tools say running/done/failed.
    A delegation card is a button (click, Enter or Space) that opens its task in the side panel.
    """

    def __init__(
        self, tool_name: str, arguments: Any, agent_names: dict[str, str], open_task: Callable[[str], Awaitable[None]]
    ) -> None:
        self.task_id: str | None = None
        self._open_task = open_task
        self._state: str | None = None
        args = arguments if isinstance(arguments, dict) else {}
        target = args.get("agentSlug")
        self.is_delegation = bool(target) and tool_name == "agent_invoke"
        self.background = tool_name.startswith(TOOL_NAME_PREFIX)  # a broker agent's tool (core/broker/tools.py)
        request = args.get("input") if self.is_delegation else args.get("task") if self.background else None
        if self.is_delegation:
            callee = agent_names.get(str(target), str(target))
            title, icon = _("Delegated to {name}").format(name=callee), "call_split"
        elif self.background:
            callee = tool_name.removeprefix(TOOL_NAME_PREFIX)
            title = _("Sent to {name} in the background").format(name=agent_names.get(callee, callee))
            icon = "schedule_send"
        else:
            title, icon = tool_name, "build"
        with (
            ui.card()
            .tight()
            .classes("w-full q-my-xs tool-call-card")
            .props("flat bordered data-testid=tool-call") as self.card
        ):
            with ui.row().classes("items-center gap-2 q-pa-sm no-wrap w-full"):
                ui.icon(icon, size="xs").classes("text-grey-7")
                with ui.column().classes("gap-0 min-w-0 col"):
                    self.title = (
                        ui.label(title)
                        .classes("text-weight-medium w-full ellipsis")
                        .props("data-testid=tool-call-title")
                    )
                    if isinstance(request, str) and request:
                        # As wide as the column, no wider: cut with an ellipsis before the state beside it.
                        ui.label(short_task_text(request, 80)).classes(
                            "text-caption text-grey-7 ellipsis w-full"
                        ).props("data-testid=tool-call-request")
                self.status = (
                    ui.label(state_label(None) if self.is_delegation else _("running…"))
                    .classes("text-grey-7 text-caption tool-call-state")
                    .props("data-testid=tool-call-status")
                )
                self.took = (
                    ui.label("")
                    .classes("text-grey-7 text-caption tool-call-state")
                    .props("data-testid=tool-call-duration")
                )
            self.detail = ui.label("").classes("text-caption q-px-sm q-pb-sm text-grey-8")
            self.detail.set_visibility(False)
        # Listeners are set once, here: adding them after the card is shown makes the browser re-render it.
        self.card.on("click", self._open)
        self.card.on("keydown.enter", self._open)
        self.card.on("keydown.space.prevent", self._open)

    async def _open(self) -> None:
        if self.task_id is not None:
            await self._open_task(self.task_id)

    def set_callee(self, name: Any) -> None:
        """The callee's display name, from the task's announcement."""
        if isinstance(name, str) and name and self.is_delegation:
            self.title.set_text(_("Delegated to {name}").format(name=name))

    def finish(self, output: Any, metadata: dict[str, Any], is_error: bool) -> None:
        """Show the call's outcome (a delegation's task state, once known, takes precedence)."""
        duration = metadata.get("durationMs")
        # A background call's own duration is the dispatch's (0.0 s): not the task's, which runs on.
        if isinstance(duration, int | float) and not (self.background and not is_error):
            self.took.set_text(_seconds(duration))
        if is_error:
            message = output.get("error") if isinstance(output, dict) else str(output)
            self.detail.set_text(str(message))
            self.detail.set_visibility(True)
        if self._state is None:
            if self.background and not is_error:  # running until its task ends (show_state)
                self.status.set_text(_("started; the result will follow"))
                self.card.props(f"data-state={state_word('working')}")
            elif self.is_delegation and not is_error:
                self.show_state("completed")
            elif self.is_delegation:
                self.show_state("failed")
            else:
                self.status.set_text(_("failed") if is_error else _("done"))
                if is_error:
                    self.status.classes(replace="text-negative text-caption tool-call-state")
        name = metadata.get("calleeAgentName")
        if isinstance(name, str) and name:
            self.title.set_text(
                (
                    _("Sent to {name} in the background") if metadata.get("background") else _("Delegated to {name}")
                ).format(name=name)
            )

    def show_state(self, state: str, duration_ms: int | None = None, reason: str | None = None) -> None:
        """The task's state, in the shared vocabulary (`reason`: a failure with its own words, states.py)."""
        if self.background and not is_terminal(state):
            return  # "started; the result will follow" says more than "working" for a background task
        word = state_word(state)
        self._state = state
        self.status.set_text(state_label(state, reason=reason))
        self.status.classes(replace=f"text-caption tool-call-state text-{STATUS_COLORS.get(word, 'grey-7')}")
        self.card.props(f"data-state={word}")
        if duration_ms is not None:
            self.took.set_text(_seconds(duration_ms))

    def link_task(self, task_id: str) -> None:
        """Clicking the card (or Enter on it) opens that task in the side panel."""
        self.task_id = task_id
        self.card.props(
            f"data-task-id={task_id} tabindex=0 role=button aria-label='" + _("Open this task in the side panel") + "'"
        ).classes("cursor-pointer")


def user_text(text: str) -> None:
    """The user's message as written: plain text with its line breaks; fenced code blocks as code."""
    with ui.column().classes("w-full gap-1 user-text-block").props("data-testid=user-text"):
        for i, part in enumerate(_FENCED.split(text)):
            if i % 2:
                ChatMarkdown(part).classes("w-full")
            elif part.strip("\n"):
                ui.label(part.strip("\n")).classes("user-text")


async def edit_message_dialog(text: str, max_chars: int, save: Callable[[str], Awaitable[bool]]) -> None:
    """Edit the user's last message and send it again: `save` gets the new text (True: sent, close)."""
    with (
        ui.dialog() as dialog,
        ui.card().classes("w-full max-w-xl").props("data-testid=user-edit-dialog"),
    ):
        ui.label(_("Edit your message")).classes("text-h6")
        ui.label(_("The answers after it are replaced by a new one.")).classes("text-grey-8 text-body2")
        area = testid(
            ui.textarea(value=text).props(
                f"autogrow outlined autofocus maxlength={max_chars} aria-label='" + quote_attr(_("Message")) + "'"
            ),
            "user-edit-input",
        ).classes("w-full")

        async def send() -> None:
            if await save(area.value or ""):
                dialog.close()

        with ui.row().classes("w-full justify-end"):
            ui.button(_("Cancel"), on_click=dialog.close).props("flat data-testid=user-edit-cancel")
            testid(ui.button(_("Send"), on_click=send), "user-edit-save")
    dialog.open()
    await dialog
    dialog.delete()


def quote_attr(text: str) -> str:
    """A text that goes inside a quoted attribute of `props` (an aria-label)."""
    return text.replace("'", "’").replace('"', "”")


def _seconds(duration_ms: float) -> str:
    """A duration in seconds, one decimal, written the reader's way."""
    return _("{seconds} s").format(seconds=format_number(duration_ms / 1000, decimals=1))


def parse_json(value: Any) -> Any:
    """A tool call's arguments as saved (JSON text) or as streamed (already parsed)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value
