"""The chat page's messages: the saved ones, and the running turn's as its events arrive.

`ChatMessages` owns the `chat-messages` column and what is drawn in it: user messages (as written,
`ui.chat_parts.user_text`), answers with their tool call cards, the notes of background tasks, the
running turn's bubble (typing indicator, streamed markdown, Stop and error lines). Each answer has a
menu (`answer-menu-btn`: copy it, and regenerate the last one) and the user's last message an edit
button (`user-edit-btn`); what they do is the page's (`MessageActions`). The page
(`ui/chat_page.py`) sends, follows the turn's stream and hands each event to `apply`; the cards'
task states come from the side panel (`ui/agent_invoke_panel.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nicegui import ui

from core.chat.artifacts import split_blocks
from core.delegation import TaskView
from core.i18n import _, format_number, format_usd
from core.streaming import events as ev
from core.streaming.hub import StreamEvent
from models import AgentMessage
from ui.agent_invoke_panel import AgentInvokePanel
from ui.chat_attachments import message_files, show_block
from ui.chat_parts import ToolCallCard, edit_message_dialog, parse_json, quote_attr, user_text
from ui.frame import testid
from ui.streaming import StreamingMarkdown


@dataclass(frozen=True, slots=True)
class MessageActions:
    """What the controls on the messages do (the page's: it calls the engine).

    Attributes:
        regenerate: answer the last message again.
        resend: give the user's last message (by id) a new text and answer it; True when it started.
        running: whether a turn runs now (regenerate is then not offered).
        max_chars: the longest message the editor takes.
    """

    regenerate: Callable[[], Awaitable[None]]
    resend: Callable[[int, str], Awaitable[bool]]
    running: Callable[[], bool]
    max_chars: int


class ChatMessages:
    """The messages of one chat page.

    Args:
        column: the element the messages go in (it becomes `chat-messages`).
        welcome: the new chat's welcome, hidden once a message is shown.
        panel: the side panel (task states of delegation cards, opening a task).
        agent_names: agent names by slug (delegation cards name their callee).
        agent_name: the name of the chat's agent, as answers are signed.
        actions: what the answers' menus and the edit button do.
    """

    def __init__(
        self,
        column: ui.element,
        welcome: ui.element,
        panel: AgentInvokePanel,
        agent_names: dict[str, str],
        agent_name: Callable[[], str],
        actions: MessageActions,
    ) -> None:
        self.column = testid(column, "chat-messages").props("role=log aria-label='" + _("Messages") + "'")
        self.welcome = welcome
        self.panel = panel
        self.agent_names = agent_names
        self.agent_name = agent_name
        self.actions = actions
        self.has_messages = False
        self._shown: list[ui.element] = []  # what `clear` takes away (the welcome stays)
        self._last_answer: ui.element | None = None
        self._edit_row: ui.element | None = None  # the edit button of the user's last message
        self._views: dict[str, StreamingMarkdown] = {}
        self._tool_cards: dict[str, ToolCallCard] = {}
        self._cards_by_task: dict[str, ToolCallCard] = {}
        self._bubble: ui.element | None = None
        self._typing: ui.element | None = None
        panel.state_listeners.append(self._on_task_state)

    # -- saved messages --------------------------------------------------------------

    def render_saved(self, message: AgentMessage) -> None:
        """Show a saved message at the end of the chat."""
        self.has_messages = True
        self.welcome.set_visibility(False)
        with self.column:
            if message.role == "user":
                sent = ui.chat_message(name=_("You"), sent=True).classes("w-full").props("data-testid=user-message")
                with sent:
                    user_text(message.content)
                    message_files(message.attachments or [])
                    self._edit_button(message)
                self._shown.append(sent)
                return
            if message.role == "system" and message.inject_mode:
                self._render_note(message)
                return
            if message.role != "assistant":
                return
            with (
                ui.chat_message(name=self.agent_name())
                .classes("w-full")
                .props("data-testid=assistant-message") as answer
            ):
                if message.content:
                    shown, blocks = split_blocks(message.content)
                    ui.markdown(shown).classes("w-full")
                    for block in blocks:
                        show_block(block)
                results = {r.get("toolCallId"): r for r in message.tool_results or []}
                for call in message.tool_calls or []:
                    card = ToolCallCard(
                        call["name"], parse_json(call.get("arguments")), self.agent_names, self.panel.show_task
                    )
                    self._tool_cards[call["id"]] = card
                    result = results.get(call["id"])
                    if result is not None:
                        metadata = result.get("metadata") or {}
                        card.finish(result.get("output"), metadata, bool(result.get("isError")))
                        if isinstance(metadata.get("taskId"), str):
                            self._link_card(card, metadata["taskId"])
                if message.status == "canceled":
                    ui.label(_("Stopped.")).classes("text-grey-7 text-caption")
                elif message.status == "interrupted":
                    ui.label(_("Interrupted by a server restart.")).classes("text-grey-7 text-caption").props(
                        "data-testid=turn-interrupted"
                    ).mark("turn-interrupted")
                elif message.status == "error" and message.error:
                    ui.label(message.error).classes("text-negative text-caption").props("data-testid=turn-error")
                usage = (message.input_tokens, message.output_tokens, message.cost_usd)
                self._answer_menu(answer, lambda: message.content, usage)
            self._shown.append(answer)

    def _render_note(self, message: AgentMessage) -> None:
        """A background task's inject: a quiet line in the chat; a click opens the task in the side panel."""
        icon = "check_circle" if message.inject_mode == "auto" else "more_horiz"
        with (
            ui.row()
            .classes("w-full items-start gap-2 no-wrap text-grey-7 text-caption q-px-md")
            .props(f"data-testid=inject-note data-mode={message.inject_mode}") as note
        ):
            ui.icon(icon, size="xs")
            ui.label(message.content).classes("whitespace-pre-wrap").props("data-testid=inject-note-text")
        note.mark("inject-note")
        self._shown.append(note)
        if message.a2a_task_id:
            task_id = message.a2a_task_id
            note.classes("cursor-pointer").on("click", lambda: self.panel.show_task(task_id))

    # -- delegation cards and their tasks ---------------------------------------------

    def _link_card(self, card: ToolCallCard, task_id: str) -> None:
        card.link_task(task_id)
        self._cards_by_task[task_id] = card
        state = self.panel.state_of(task_id)
        if state is not None:
            card.show_state(state, reason=self.panel.reason_of(task_id))

    def show_task_states(self, tasks: list[TaskView]) -> None:
        """After a load: each delegation card says its task's saved state (found by its tool call)."""
        for task in tasks:
            card = self._cards_by_task.get(task.id) or self._tool_cards.get(task.tool_call_id or "")
            if card is not None:
                if card.task_id is None:
                    self._link_card(card, task.id)
                card.show_state(task.state, task.duration_ms)

    def _on_task_state(self, task_id: str, state: str) -> None:
        card = self._cards_by_task.get(task_id)
        if card is not None:
            card.show_state(state, reason=self.panel.reason_of(task_id))

    # -- the running turn --------------------------------------------------------------

    def flush(self) -> None:
        """Render what streamed since the last flush (the answer's text and the side panel's)."""
        for view in self._views.values():
            view.flush()
        self.panel.flush()

    def finalize(self) -> None:
        """The turn's stream ended: its text is rendered whole."""
        for view in self._views.values():
            view.finalize()
        self._views = {}

    def hide_typing(self) -> None:
        """Take the typing indicator away."""
        if self._typing is not None:
            self._typing.delete()
            self._typing = None

    async def apply(self, event: StreamEvent) -> None:
        """Show one event of the running turn."""
        try:
            typed = ev.from_stream(event.type, event.data)
        except ev.EventFormatError:
            return  # a kind this page does not show (or a malformed event): the saved answer has the turn
        if isinstance(typed, ev.Start):
            self._views, self._tool_cards = {}, dict(self._tool_cards)
            with self.column:
                self._bubble = (
                    ui.chat_message(name=self.agent_name())
                    .classes("w-full")
                    .props("data-testid=assistant-message aria-live=polite aria-busy=true")
                )
            self._shown.append(self._bubble)
            with self._bubble:
                self._typing = testid(
                    ui.spinner("dots", size="md")
                    .classes("typing-indicator")
                    .props("aria-label='" + _("The agent is writing") + "'"),
                    "typing-indicator",
                )
            return
        if self._bubble is None:
            return  # joined mid-way without the start (should not happen: replay begins at the turn's start)
        if isinstance(typed, ev.TextDelta | ev.ToolInput | ev.Error | ev.Finish):
            self.hide_typing()
        match typed:
            case ev.TextDelta(id=text_id, delta=delta):
                if "```artifact-" in delta:  # a file or data of the answer (the demo model's /file, /data)
                    delta, blocks = split_blocks(delta)
                    with self._bubble:
                        for block in blocks:
                            show_block(block)
                view = self._views.get(text_id)
                if view is None:
                    with self._bubble:
                        view = StreamingMarkdown()
                        view.container.props("data-testid=assistant-text")
                    self._views[text_id] = view
                view.append(delta)
            case ev.ToolInput():
                self.flush()
                self.panel.note_tool_input(typed.tool_call_id, typed.input)
                with self._bubble:
                    self._tool_cards[typed.tool_call_id] = ToolCallCard(
                        typed.tool_name, typed.input, self.agent_names, self.panel.show_task
                    )
            case ev.TaskStarted():
                card = self._tool_cards.get(typed.tool_call_id)
                if card is not None:
                    card.set_callee(typed.callee_agent_name)
                    self._link_card(card, typed.task_id)
                await self.panel.task_started(typed)
            case ev.ToolOutput():
                card = self._tool_cards.get(typed.tool_call_id)
                if card is not None:
                    card.finish(typed.output, typed.metadata, typed.is_error)
                    if card.task_id is not None and (state := self.panel.state_of(card.task_id)):
                        card.show_state(state, reason=self.panel.reason_of(card.task_id))
            case ev.Error(error_text=text):
                self.flush()
                text = text or _("Something went wrong.")
                with self._bubble:
                    ui.label(text).classes("text-negative text-caption").props("data-testid=turn-error role=alert")
                    ui.notify(text, color="negative")
            case ev.Finish(finish_reason=reason):
                self.flush()
                usage = (typed.input_tokens, typed.output_tokens, typed.cost_usd)
                self._bubble.props("aria-busy=false")
                if reason == "canceled":
                    with self._bubble:
                        ui.label(_("Stopped.")).classes("text-grey-7 text-caption")
                views = list(self._views.values())
                self._answer_menu(self._bubble, lambda: "\n\n".join(v.text for v in views if v.text), usage)

    # -- the controls on the messages ------------------------------------------------------

    def clear(self) -> None:
        """Take every message away (the chat was rewound: the page shows it again from its saved messages)."""
        for element in self._shown:
            element.delete()
        self._shown, self._views, self._tool_cards, self._cards_by_task = [], {}, {}, {}
        self._bubble = self._typing = self._last_answer = self._edit_row = None
        self.has_messages = False

    def _edit_button(self, message: AgentMessage) -> None:
        """The edit button of the user's last message (the one before it loses its own)."""
        if self._edit_row is not None:
            self._edit_row.delete()
        message_id, text = message.id, message.content
        assert message_id is not None  # a saved row

        async def edit() -> None:
            await edit_message_dialog(text, self.actions.max_chars, lambda new: self.actions.resend(message_id, new))

        with ui.row().classes("w-full justify-end turn-action") as self._edit_row:
            testid(
                ui.button(icon="edit", on_click=edit).props(
                    "flat round dense size=sm aria-label='" + quote_attr(_("Edit and send again")) + "'"
                ),
                "user-edit-btn",
            )

    def _answer_menu(self, answer: ui.element, text: Callable[[], str], usage: Usage) -> None:
        """An answer's ⋮ menu: copy it; regenerate when it is the last answer and nothing runs; its usage."""
        self._last_answer = answer
        with answer, ui.row().classes("w-full justify-end"):
            button = testid(
                ui.button(icon="more_horiz").props(
                    "flat round dense size=sm aria-label='" + quote_attr(_("Answer actions")) + "'"
                ),
                "answer-menu-btn",
            )
        # The menu is made as it opens: whether this is still the last answer is known then.
        button.on("click", lambda: self._open_answer_menu(button, answer, text, usage))

    def _open_answer_menu(self, button: ui.button, answer: ui.element, text: Callable[[], str], usage: Usage) -> None:
        for child in list(button.default_slot.children):
            if isinstance(child, ui.menu):
                child.delete()
        with button, ui.menu() as menu:
            ui.menu_item(_("Copy"), lambda: self._copy(text())).props("data-testid=answer-copy")
            if answer is self._last_answer and not self.actions.running():
                ui.menu_item(_("Regenerate"), self.actions.regenerate).props("data-testid=answer-regenerate")
            line = usage_line(*usage)
            if line:  # folded here: read when wanted, not beside every answer
                ui.separator()
                ui.label(line).classes("q-px-md q-py-sm text-caption text-grey-7").props("data-testid=answer-usage")
        menu.open()

    def _copy(self, text: str) -> None:
        ui.clipboard.write(text)
        ui.notify(_("Copied."), position="bottom")


Usage = tuple[int | None, int | None, float | None]  # an answer's input and output tokens, and its price


def usage_line(input_tokens: int | None, output_tokens: int | None, cost_usd: float | None) -> str:
    """An answer's usage, `Tokens 60 in / 11 out · $0.00001650` (empty when nothing was counted)."""
    if not input_tokens and not output_tokens:
        return ""
    line = _("Tokens {input} in / {output} out").format(
        input=format_number(input_tokens or 0), output=format_number(output_tokens or 0)
    )
    return line if cost_usd is None else f"{line} · {format_usd(cost_usd)}"
