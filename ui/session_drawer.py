"""The chat page's part of the left drawer: New chat, search, and the list of chats with rename and delete.

The list is grouped under Today, Yesterday, Previous 7 days and Older (`core/chat/day_groups.py`).

Rename and delete ask in a dialog and call the workspace (`core/chat/workspace.py`), which owns the
rules (blank titles refused, a running answer stopped before its chat is deleted). The ⋮ menu of an
item is made when it is opened, since the list is re-rendered after every answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from nicegui import ui

from core.chat.day_groups import GROUP_TITLES, group_by_day
from core.chat.engine import ChatError
from core.chat.workspace import Workspace
from core.i18n import _, format_datetime
from models import AgentSession
from ui.frame import testid


class HasWorkspace(Protocol):
    """What the drawer uses: the chats as people see them (`core.services.Services` has it)."""

    @property
    def workspace(self) -> Workspace:
        """The user's chats: list, rename, delete."""
        ...


class SessionDrawer:
    """Create it inside the frame's drawer; `current` says which chat the page shows (None: a new one)."""

    def __init__(
        self,
        services: HasWorkspace,
        user_id: int | None,
        current: Callable[[], str | None],
        on_new_chat: Callable[[], None],
    ) -> None:
        self.services = services
        self.user_id = user_id
        self.current = current
        self.search_text = ""
        testid(ui.button(_("New chat"), icon="add", on_click=on_new_chat), "new-session-btn").classes("w-full")
        self.search = testid(
            ui.input(placeholder=_("Search chats"), on_change=self._on_search).props(
                "dense outlined clearable debounce=250 aria-label='" + _("Search chats") + "'"
            ),
            "session-search",
        ).classes("w-full q-mt-sm")
        with self.search.add_slot("prepend"):
            ui.icon("search", size="xs")
        self.session_list = testid(ui.list().props("dense separator"), "session-list").classes("w-full mt-2")

    async def render(self) -> None:
        """List the user's chats (those matching the search) under their day's heading; title the tab.

        Newest first, under Today, Yesterday, Previous 7 days and Older (`core.chat.day_groups`): the
        reader's local day, in the browser's time zone once it has said, else UTC.
        """
        sessions = await self.services.workspace.sessions(self.user_id, self.search_text) if self.user_id else []
        self.session_list.clear()
        with self.session_list:
            if not sessions:
                ui.item_label(_("No chats match.") if self.search_text else _("No chats yet")).props("caption").classes(
                    "q-pa-md"
                ).props("data-testid=session-list-empty")
            for group, rows in group_by_day(sessions):
                ui.item_label(_(GROUP_TITLES[group])).props(
                    f"header data-testid=session-group data-group={group}"
                ).classes("text-weight-medium q-pt-sm q-pb-xs")
                for row in rows:
                    self._session_item(row)
                    if row.id == self.current():
                        ui.page_title(row.title)

    async def _on_search(self, event: Any) -> None:
        self.search_text = (event.value or "").strip()
        await self.render()

    def _session_item(self, row: AgentSession) -> None:
        active = row.id == self.current()
        item = (
            ui.item(on_click=lambda r=row: ui.navigate.to(f"/chat/{r.id}"))
            .props(f"clickable {'active' if active else ''} data-testid=session-item data-session-id={row.id}")
            .mark("session-item")
        )
        with item:
            with ui.item_section():
                ui.item_label(row.title).classes("ellipsis").props("data-testid=session-title")
                ui.item_label(format_datetime(row.updated_at, format="short")).props("caption")
            with ui.item_section().props("side"):
                actions = _quote(_("Chat actions: {title}").format(title=row.title))
                menu_btn = ui.button(icon="more_vert").props(
                    f"flat round dense size=sm aria-label='{actions}' data-testid=session-menu-btn"
                )
                # The menu is made when it is first opened: the list is re-rendered after every answer.
                menu_btn.on("click.stop", lambda b=menu_btn, r=row: self._session_menu(b, r))

    def _session_menu(self, button: ui.button, row: AgentSession) -> None:
        for child in list(button.default_slot.children):
            if isinstance(child, ui.menu):
                child.delete()
        with button, ui.menu() as menu:
            ui.menu_item(_("Rename"), lambda: self._rename_dialog(row)).props("data-testid=session-rename")
            ui.menu_item(_("Delete"), lambda: self._delete(row)).props("data-testid=session-delete")
        menu.open()

    def _rename_dialog(self, row: AgentSession) -> None:
        with ui.dialog() as dialog, ui.card().classes("w-80 max-w-full"):
            ui.label(_("Rename chat")).classes("text-h6")
            name = testid(
                ui.input(_("Title"), value=row.title).props("autofocus outlined dense"), "session-rename-input"
            ).classes("w-full")

            async def save() -> None:
                assert self.user_id is not None  # (only a user's chats are listed)
                try:
                    await self.services.workspace.rename(self.user_id, row.id, name.value or "")
                except ChatError as exc:
                    ui.notify(exc.message, color="negative")
                    return
                dialog.close()
                await self.render()

            name.on("keydown.enter", save)
            with ui.row().classes("w-full justify-end"):
                ui.button(_("Cancel"), on_click=dialog.close).props("flat data-testid=session-rename-cancel")
                testid(ui.button(_("Save"), on_click=save), "session-rename-save")
        dialog.open()

    def _delete(self, row: AgentSession) -> None:
        """Ask, then delete a chat (its running answer is stopped first)."""
        with ui.dialog() as dialog, ui.card().classes("w-80 max-w-full").props("data-testid=session-delete-dialog"):
            ui.label(_("Delete this chat?")).classes("text-h6")
            ui.label(row.title).classes("text-grey-8 ellipsis w-full")

            async def confirm() -> None:
                dialog.close()
                assert self.user_id is not None  # (only a user's chats are listed)
                if not await self.services.workspace.delete(self.user_id, row.id):
                    ui.notify(_("That chat is already gone."), color="warning")
                if row.id == self.current():
                    ui.navigate.to("/")
                    return
                await self.render()

            with ui.row().classes("w-full justify-end"):
                ui.button(_("Cancel"), on_click=dialog.close).props("flat data-testid=session-delete-cancel")
                testid(ui.button(_("Delete"), on_click=confirm, color="negative"), "session-delete-confirm")
        dialog.open()


def _quote(text: str) -> str:
    return text.replace("'", "’").replace('"', "”")
