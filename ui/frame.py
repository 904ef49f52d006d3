"""The one page frame every page enters: header, left drawer, navigation, dark mode.

    with page_frame(auth, title="Delegated tasks", active="/audit") as frame:
        ...  # the page's content; `frame.drawer` is the left drawer (below the navigation)

The header fits one row at any width: the app name shortens below 600 px, the
navigation sits in the left drawer, which is a sidebar from 900 px up and a
closed overlay below. Dark mode follows the system until the user picks light
or dark with the header's toggle; the choice is kept per user
(`app.storage.user`). The header's language switch (`ui/language.py`) changes the
page's language in place. A page adds itself to the navigation with one line in
`NAV_ITEMS`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from nicegui import app, ui

from core.auth.deps import AuthState
from core.i18n import N_, _
from ui.auth import current_user_id
from ui.language import language_switch

E = TypeVar("E", bound=ui.element)  # testid gives back the element as it came (an input stays an input)

APP_NAME = N_("A2A Delegation Chat")
SHORT_APP_NAME = N_("A2A Chat")
DRAWER_BREAKPOINT_PX = 900  # below it, the drawers are overlays (assets/app.css uses the same width)
DARK_MODE_KEY = "dark_mode"  # app.storage.user: None (follow the system), True or False
DARK_MODE_CYCLE: dict[bool | None, bool | None] = {None: True, True: False, False: None}
DARK_MODE_ICONS = {None: "brightness_auto", True: "dark_mode", False: "light_mode"}
DARK_MODE_NAMES = {None: N_("Theme: follows the system"), True: N_("Theme: dark"), False: N_("Theme: light")}


@dataclass(frozen=True, slots=True)
class NavItem:
    """One entry of the navigation: its label, path, icon and `data-testid` (`nav-<key>`)."""

    label: str
    path: str
    icon: str
    key: str
    admins_only: bool = False


NAV_ITEMS: list[NavItem] = [
    NavItem(N_("Chat"), "/", "chat", "chat"),
    NavItem(N_("Agents"), "/agents", "smart_toy", "agents"),
    NavItem(N_("Delegated tasks"), "/audit", "fact_check", "audit"),
    NavItem(N_("A2A broker"), "/broker", "hub", "broker"),
    NavItem(N_("Remote agents"), "/remote-agents", "travel_explore", "remote-agents"),
    NavItem(N_("API keys"), "/api-keys", "key", "api-keys"),
    NavItem(N_("Admin"), "/admin", "admin_panel_settings", "admin", admins_only=True),
]


def testid(element: E, name: str) -> E:
    """Give an element both a server-side marker (User tests) and a DOM test id (Playwright); returns it."""
    element.mark(name).props(f"data-testid={name}")
    return element


@dataclass(slots=True)
class Frame:
    """What a page may add to: the left drawer, and the header's right-hand row."""

    drawer: ui.left_drawer
    actions: ui.row
    dark: ui.dark_mode


def _page_user_id(auth: AuthState) -> int | None:
    try:
        return current_user_id(auth)
    except (RuntimeError, AssertionError, KeyError):  # no storage secret (some unit tests), no session
        return None


def stored_dark_mode() -> bool | None:
    """The reader's theme (True dark, False light, None follows the system), for a page or a plain route."""
    try:
        value = app.storage.user.get(DARK_MODE_KEY)
    except (RuntimeError, AssertionError, KeyError):  # no storage secret (some unit tests), no session
        return None
    return value if isinstance(value, bool) else None


@contextmanager
def page_frame(auth: AuthState, *, title: str, active: str) -> Iterator[Frame]:
    """Lay out the header, the drawer with the navigation and dark mode; the block adds the page's content.

    `title` is the browser tab's title; `active` the path of the navigation entry to highlight. Add to
    the drawer with `with frame.drawer:` (below the navigation).
    """
    yield build_frame(auth, title=title, active=active)


def build_frame(auth: AuthState, *, title: str, active: str) -> Frame:
    """`page_frame` as a plain call, for pages that lay out their content after it."""
    ui.page_title(title)
    mode = stored_dark_mode()
    dark = ui.dark_mode(mode)
    drawer: ui.left_drawer  # made below the header; the menu button opens it
    with ui.header().classes("items-center justify-between bg-primary no-wrap q-px-sm app-header") as header:
        header.props("data-testid=app-header")
        with ui.row().classes("items-center gap-1 no-wrap min-w-0"):
            testid(
                ui.button(icon="menu", on_click=lambda: drawer.toggle()).props(
                    "flat round color=white aria-label='" + _("Menu") + "'"
                ),
                "menu-btn",
            )
            with ui.link(target="/").classes("text-white no-underline row items-center no-wrap min-w-0"):
                ui.label(_(APP_NAME)).classes("text-h6 ellipsis gt-xs")
                ui.label(_(SHORT_APP_NAME)).classes("text-h6 xs")
        with ui.row().classes("items-center gap-1 no-wrap") as actions:
            language_switch(ui.context.client)
            toggle = testid(
                ui.button(icon=DARK_MODE_ICONS[mode]).props(
                    f"flat round color=white aria-label='{_(DARK_MODE_NAMES[mode])}'"
                ),
                "dark-mode-btn",
            )
            toggle.tooltip(_(DARK_MODE_NAMES[mode]))

            def cycle_dark_mode() -> None:
                new = DARK_MODE_CYCLE[dark.value]
                dark.set_value(new)
                toggle.props(f"icon={DARK_MODE_ICONS[new]} aria-label='{_(DARK_MODE_NAMES[new])}'")
                toggle.props(f"data-mode={'auto' if new is None else 'dark' if new else 'light'}")
                try:
                    app.storage.user[DARK_MODE_KEY] = new
                except RuntimeError:
                    pass

            toggle.on("click", cycle_dark_mode)
            toggle.props(f"data-mode={'auto' if mode is None else 'dark' if mode else 'light'}")
            if auth.multi_user:
                testid(
                    ui.button(icon="logout", on_click=lambda: ui.navigate.to("/logout")).props(
                        "flat round color=white aria-label='" + _("Log out") + "'"
                    ),
                    "logout-btn",
                )
    drawer = (
        ui.left_drawer(value=None, bordered=True, bottom_corner=True)
        .props(f"breakpoint={DRAWER_BREAKPOINT_PX - 1} width=280")
        .classes("app-drawer q-pa-sm column no-wrap")
    )
    with drawer:
        testid(drawer, "app-drawer")
        with ui.column().classes("w-full gap-0").props("role=navigation aria-label='" + _("Pages") + "'") as nav:
            testid(nav, "app-nav")
            admin = auth.is_admin(_page_user_id(auth))
            for item in NAV_ITEMS:
                if item.admins_only and not admin:
                    continue
                is_active = item.path == active
                with ui.row().classes(
                    "w-full items-center no-wrap gap-3 q-px-sm q-py-xs rounded-borders nav-row"
                    + (" nav-row--active text-primary" if is_active else "")
                ):
                    ui.icon(item.icon, size="sm").props("aria-hidden=true")
                    link = (
                        ui.link(_(item.label), item.path)
                        .classes("col no-underline text-inherit nav-link")
                        .props(f"data-testid=nav-{item.key} data-path={item.path}")
                        .mark(f"nav-{item.key}")
                    )
                    if is_active:
                        link.props("aria-current=page")
        ui.separator().classes("q-my-sm")
    return Frame(drawer=drawer, actions=actions, dark=dark)
