"""The chat page: session list, messages streaming in, input, agent picker, Stop.

`/` is a new, not yet saved chat (it is created on the first message);
`/chat/{session_id}` opens one. A running turn is followed through a hub
subscription owned by this page; the turn itself belongs to the chat engine,
so reloading or closing the page never stops it, and a reloaded page replays
the turn so far and then follows it live.

Issue 14: the page sits in the shared frame (`ui/frame.py`); the chat follows the
newest message while the reader is at the bottom (`assets/app.js`, with a "jump to
latest" button); a new chat shows a welcome with the agents and example prompts;
the left drawer renames, deletes (with undo) and searches chats; the browser tab
is titled after the chat; Esc stops a reply, or closes the side panel. The user's
text is shown as written: plain text with its line breaks, and only fenced code
blocks (```) rendered as code. Its pieces are in `ui/chat_messages.py` (the
messages, saved and streaming), `ui/chat_parts.py` (welcome, tool call cards, the
user's text) and `ui/session_drawer.py` (the chat list).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from nicegui import Client, background_tasks, ui
from nicegui.events import ValueChangeEventArguments

from core.chat.engine import ChatError, SessionChange
from core.i18n import N_, _
from core.streaming.backend import HubSubscription
from core.streaming.hub import SubscriberOverflowError, UnknownStreamError
from core.web.errors import REDIS_UNREACHABLE, redis_down_text
from ui.agent_invoke_panel import AgentInvokePanel
from ui.agent_picker import AgentPicker
from ui.auth import current_user_id
from ui.chat_attachments import ComposerFiles
from ui.chat_messages import ChatMessages, MessageActions
from ui.chat_parts import welcome
from ui.chat_services import ChatServices
from ui.frame import page_frame, testid
from ui.language import on_rebuild, page, set_rebuild
from ui.session_drawer import SessionDrawer

FLUSH_INTERVAL_S = 0.08  # coalesces streamed chunks into at most ~12 renders per second
NEW_CHAT_TITLE = N_("New chat")
DRAFT_ATTR = "app_chat_draft"  # on the page's client: the input's text across a rebuild (ui/language.py)


def register_chat_pages(services: ChatServices) -> None:
    """`/` (new chat) and `/chat/{session_id}`."""

    @page("/", title="New chat")
    async def new_chat_page(client: Client, agent: str | None = None) -> None:
        await ChatPage(services, client, session_id=None, agent_slug=agent).build()

    @page("/chat/{session_id}", title="Chat")
    async def chat_page(client: Client, session_id: str) -> None:
        await ChatPage(services, client, session_id=session_id).build()


class ChatPage:
    """One browser tab's chat screen and its live subscription.

    Its layout, sending, and following the turn's stream; the messages and how each event of the
    stream is shown are `ui.chat_messages.ChatMessages`, the other pieces `ui.chat_parts`,
    `ui.session_drawer` and `ui.agent_invoke_panel`.

    Over 300 lines on purpose: one page's life cycle (layout, sending, editing and sending again,
    following the turn's stream and its end) over the same elements and the same subscription.
    """

    def __init__(
        self, services: ChatServices, client: Client, *, session_id: str | None, agent_slug: str | None = None
    ) -> None:
        self.services = services
        self.client = client
        self.session_id = session_id
        self.agent_slug = agent_slug
        self._user_id = current_user_id(services.auth)
        self._follow_task: asyncio.Task[None] | None = None
        self._running = False
        self.agent_names: dict[str, str] = {}
        self._unwatch: Callable[[], None] | None = None
        client.on_delete(self._stop_following)
        client.on_delete(self._stop_watching)
        on_rebuild(client, self._stop_following)
        on_rebuild(client, self._stop_watching)

    @property
    def user_id(self) -> int:
        """The signed-in user: `build` leaves for /login before anything reads it without one."""
        assert self._user_id is not None
        return self._user_id

    # -- layout; then messages, sending and following, and navigation ------------------

    async def build(self) -> None:
        """Lay out the page and load the chat."""
        if self._user_id is None:  # the login middleware sends such requests to /login; a login lost since
            ui.navigate.to("/login")
            return
        agents = await self.services.workspace.agents()
        self.agent_names = {a.slug: a.name for a in agents}
        view = None
        if self.session_id is not None:
            try:
                view = await self.services.workspace.open(self.user_id, self.session_id)
            except ChatError as exc:
                with page_frame(self.services.auth, title=_("Chat not found"), active="/"):
                    with ui.column().classes("absolute-center items-center"):
                        ui.label(exc.message).classes("text-h6")
                        ui.button(_("Start a new chat"), on_click=lambda: ui.navigate.to("/"))
                return
            self.agent_slug = view.agent.slug
        elif self.agent_slug not in self.agent_names:
            default = await self.services.workspace.default_agent()
            self.agent_slug = default.slug if default else None

        title = view.session.title if view is not None else _(NEW_CHAT_TITLE)
        with page_frame(self.services.auth, title=title, active="/") as frame:
            with frame.drawer:
                self.sessions = SessionDrawer(self.services, self.user_id, lambda: self.session_id, self._new_chat)
            self.frame = frame
        await self.sessions.render()
        self.panel = AgentInvokePanel(self.services.delegation, self.services.hub, self.client, self.user_id, self.stop)
        on_rebuild(self.client, self.panel.stop_following)

        with ui.column().classes("w-full max-w-3xl mx-auto pb-4 chat-column") as column:
            self.messages = ChatMessages(
                column,
                welcome(agents, self._try_example),
                self.panel,
                self.agent_names,
                self._agent_name,
                MessageActions(
                    self.regenerate, self.resend, lambda: self._running, self.services.settings.max_message_chars
                ),
            )
            if view is not None:
                for message in view.messages:
                    self.messages.render_saved(message)
            self.messages.welcome.set_visibility(not self.messages.has_messages)

        with ui.page_sticky(position="bottom", y_offset=12):
            testid(
                ui.button(_("Jump to latest"), icon="arrow_downward").props(
                    "rounded unelevated color=primary size=sm no-caps "
                    "aria-label='" + _("Jump to the latest message") + "'"
                ),
                "jump-latest",
            ).classes("jump-latest").on("click", js_handler="() => window.appChat.jumpToLatest()")

        with ui.footer().classes("border-t chat-footer").props("data-testid=chat-footer"):
            with ui.column().classes("w-full max-w-3xl mx-auto gap-1"):
                with ui.row().classes("w-full items-center gap-2 no-wrap"):
                    self.agent_picker = testid(
                        AgentPicker(agents, value=self.agent_slug, on_change=self._on_agent_change).props(
                            "dense outlined options-dense"
                        ),
                        "agent-picker",
                    ).classes("w-56 agent-picker")
                    self.generating = testid(ui.row().classes("items-center gap-1 text-grey-7 no-wrap"), "generating")
                    with self.generating:
                        ui.spinner(size="sm")
                        ui.label(_("Generating…"))
                    self.generating.set_visibility(False)
                self.files = ComposerFiles(self.services.chat, self.services.settings, self.user_id)
                self.files.chips_row()
                with ui.row().classes("w-full items-end gap-2 no-wrap"):
                    self.files.button.move(target_container=ui.row().classes("items-center"))
                    self.input = testid(
                        ui.textarea(placeholder=_("Message (Enter to send, Shift+Enter for a new line)")).props(
                            "autogrow outlined dense rows=1 autofocus aria-label='" + _("Message") + f"' maxlength="
                            f"{self.services.settings.max_message_chars}"
                        ),
                        "msg-input",
                    ).classes("flex-grow min-w-0")
                    self.input.on("keydown.enter.exact.prevent", self.send)
                    # A language switch builds the page again: what was being typed stays.
                    self.input.value = getattr(self.client, DRAFT_ATTR, None) or ""
                    setattr(self.client, DRAFT_ATTR, None)
                    on_rebuild(self.client, lambda: setattr(self.client, DRAFT_ATTR, self.input.value))
                    self.send_btn = testid(ui.button(icon="send", on_click=self.send), "send-btn").props(
                        "aria-label='" + _("Send") + "'"
                    )
                    self.stop_btn = testid(
                        ui.button(icon="stop", on_click=self.stop, color="negative"), "stop-btn"
                    ).props("aria-label='" + _("Stop") + "'")
        self._set_generating(False)
        ui.on("app-escape", self._on_escape)
        ui.timer(FLUSH_INTERVAL_S, self._flush)
        if view is not None and self.session_id is not None:
            tasks = await self.services.delegation.tasks_of_session(self.user_id, self.session_id)
            self.messages.show_task_states(tasks)
            await self.panel.restore(tasks)
        if view is not None and view.live_turn:
            self._follow(after=None)
        if self.session_id is not None:
            self._watch()

    async def _try_example(self, prompt: str) -> None:
        self.input.value = prompt
        await self.send()

    def _agent_name(self) -> str:
        return self.agent_names.get(self.agent_slug or "", self.agent_slug or _("Agent"))

    # -- sending and following ---------------------------------------------------------

    async def send(self) -> None:
        """Send the input as a message and follow the answer."""
        text = self.input.value or ""
        is_new = self.session_id is None
        try:
            text = self.services.chat.validate_text(text)
            session_id = self.session_id
            if session_id is None:
                created = await self.services.workspace.create(self.user_id, self.agent_slug or "")
                session_id = self.session_id = created.id
                ui.navigate.history.replace(f"/chat/{session_id}")
                new_id: str = session_id
                set_rebuild(self.client, lambda: ChatPage(self.services, self.client, session_id=new_id).build())
                self._watch()
            # The watcher shows the saved message and follows the answer, as for a turn started elsewhere.
            files = await self.files.store(session_id)
            await self.services.chat.start_turn(session_id=session_id, user_id=self.user_id, text=text, files=files)
        except ChatError as exc:
            ui.notify(exc.message, color="negative")
            return
        except REDIS_UNREACHABLE:  # a cluster's Redis is out of reach: nothing was saved, the text stays to resend
            ui.notify(redis_down_text(), color="negative")
            return
        self.input.value = ""
        self.files.clear()
        if is_new:  # the new chat joins the list now; an existing one moves up when its answer ends
            await self.sessions.render()

    async def regenerate(self) -> None:
        """Answer the last message again (the watcher shows the chat rewound, then follows the new answer)."""
        if self.session_id is None:
            return
        try:
            await self.services.chat.regenerate(session_id=self.session_id, user_id=self.user_id)
        except ChatError as exc:
            ui.notify(exc.message, color="negative")
        except REDIS_UNREACHABLE:
            ui.notify(redis_down_text(), color="negative")

    async def resend(self, message_id: int, text: str) -> bool:
        """Give the user's last message a new text and answer it anew; False (and why) when refused."""
        if self.session_id is None:
            return False
        try:
            await self.services.chat.resend(
                session_id=self.session_id, user_id=self.user_id, message_id=message_id, text=text
            )
        except ChatError as exc:
            ui.notify(exc.message, color="negative")
            return False
        except REDIS_UNREACHABLE:
            ui.notify(redis_down_text(), color="negative")
            return False
        return True

    async def stop(self) -> None:
        """Stop the running answer (it keeps what it said)."""
        if self.session_id and not await self.services.chat.cancel(self.session_id):
            self._set_generating(False)

    def _follow(self, after: int | None) -> None:
        self._stop_following()
        if self.session_id is None:
            return
        try:
            subscription = self.services.hub.subscribe(self.session_id, after=after)
        except UnknownStreamError:
            return
        self._set_generating(True)
        self._follow_task = background_tasks.create(
            self._consume(subscription), name=f"follow {self.session_id}", context=self.client
        )

    def _watch(self) -> None:
        """Show the session's turns and notes as they start or are saved, whoever started them."""
        self._stop_watching()
        if self.session_id is None:
            return
        self._unwatch = self.services.chat.watch(self.session_id, self._on_session_change)

    def _stop_watching(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None

    def _on_session_change(self, change: SessionChange) -> None:
        if self.client.is_deleted:
            return
        # Called from the engine's task: build elements in a task of this page's client.
        background_tasks.create(self._show_change(change), name=f"change {change.session_id}", context=self.client)

    async def _show_change(self, change: SessionChange) -> None:
        if change.rewound and self.session_id is not None:  # regenerate, or edit and send again: show it anew
            self._stop_following()
            try:
                view = await self.services.workspace.open(self.user_id, self.session_id)
            except ChatError:
                return
            self.messages.clear()
            for message in view.messages:
                self.messages.render_saved(message)
            self.messages.show_task_states(
                await self.services.delegation.tasks_of_session(self.user_id, self.session_id)
            )
        for message in change.messages:
            self.messages.render_saved(message)
        if change.turn is not None:
            self._follow(after=change.turn.after_event_id)

    def _stop_following(self) -> None:
        if self._follow_task is not None and not self._follow_task.done():
            self._follow_task.cancel()
        self._follow_task = None

    async def _consume(self, subscription: HubSubscription) -> None:
        try:
            async for event in subscription:
                if self.client.is_deleted:
                    break
                await self.messages.apply(event)
        except SubscriberOverflowError:
            # Fell behind (a very fast stream and a slow browser): the saved answer has it all.
            with self.messages.column:
                ui.notify(_("The page fell behind the stream; reload to see the full answer."), color="warning")
        finally:
            subscription.close()
            # A follower that was replaced (or whose page is gone) leaves the page alone.
            if self._follow_task is asyncio.current_task() and not self.client.is_deleted:
                self.messages.finalize()
                self._set_generating(False)
                with contextlib.suppress(Exception):
                    await self.sessions.render()

    def _flush(self) -> None:
        self.messages.flush()

    def _set_generating(self, running: bool) -> None:
        self._running = running
        self.generating.set_visibility(running)
        # While a turn runs, the edit button of the last message is hidden (assets/app.css, `.turn-action`).
        self.messages.column.classes(**{"add" if running else "remove": "turn-running"})
        self.stop_btn.set_visibility(running)
        self.panel.show_running(running)
        self.send_btn.set_enabled(not running)
        if not running:
            self.messages.hide_typing()

    async def _on_escape(self) -> None:
        """Esc stops a running reply; with nothing running it closes the side panel."""
        if self._running:
            await self.stop()
        elif self.panel.drawer.value:
            self.panel.close()

    def _new_chat(self) -> None:
        ui.navigate.to(f"/?agent={self.agent_slug}" if self.agent_slug else "/")

    async def _on_agent_change(self, event: ValueChangeEventArguments[str]) -> None:
        slug = event.value
        if slug == self.agent_slug:
            return
        if self.session_id is None:
            self.agent_slug = slug
            return
        try:
            changed = await self.services.workspace.change_agent(self.user_id, self.session_id, slug)
        except ChatError as exc:
            ui.notify(exc.message, color="negative")
            return
        if changed:
            self.agent_slug = slug
            return
        # A chat keeps the agent it started with: another agent means a new chat, so ask first.
        with ui.dialog() as dialog, ui.card().classes("w-96 max-w-full").props("data-testid=agent-change-dialog"):
            ui.label(_("Start a new chat with {name}?").format(name=self.agent_names.get(slug, slug))).classes(
                "text-h6"
            )
            ui.label(_("This chat stays with {name}; it is kept in the list.").format(name=self._agent_name())).classes(
                "text-grey-8"
            )
            with ui.row().classes("w-full justify-end"):
                testid(
                    ui.button(_("Stay here"), on_click=lambda: dialog.submit(False)).props("flat"),
                    "agent-change-cancel",
                )
                testid(ui.button(_(NEW_CHAT_TITLE), on_click=lambda: dialog.submit(True)), "agent-change-confirm")
        confirmed = await dialog
        dialog.delete()
        if confirmed:
            ui.navigate.to(f"/?agent={slug}")
        else:
            self.agent_picker.set_value(self.agent_slug)
