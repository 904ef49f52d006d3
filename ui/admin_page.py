"""`/admin`: the admin area (issue 39): accounts, running turns, the global model connection, the server's health.

Admins only (and `local` in single-user mode): anyone else sees a refusal and nothing of the area. The
rules are `core.admin`'s and `core.auth.user_admin`'s; this page calls them and shows their refusals.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from nicegui import ui

from core.admin import AdminArea
from core.admin.model_connection import ConnectionRuleError
from core.admin.service import SingleUserModeError
from core.auth.accounts import AccountError
from core.auth.deps import AuthState
from core.auth.user_admin import AccountRuleError, UnknownAccountError
from core.i18n import _, format_datetime
from ui.auth import current_user_id
from ui.frame import build_frame, testid
from ui.language import page

REFUSALS = (AccountError, AccountRuleError, UnknownAccountError, SingleUserModeError)


def register_admin_page(*, area: AdminArea, auth: AuthState) -> None:
    """`/admin`, for admins."""

    @page("/admin", title="Admin")
    async def admin_page() -> None:
        user_id = current_user_id(auth)
        build_frame(auth, title=_("Admin"), active="/admin")
        with ui.column().classes("w-full max-w-5xl mx-auto q-pa-md gap-4"):
            ui.label(_("Admin")).classes("text-h5")
            if not auth.is_admin(user_id):
                testid(
                    ui.label(_("The admin area is for admins; an admin can make you one.")).classes("text-negative"),
                    "admin-refused",
                )
                return
            with ui.tabs().classes("w-full").props("align=left mobile-arrows outside-arrows") as tabs:
                users_tab = testid(ui.tab(_("Users"), icon="group"), "admin-tab-users")
                model_tab = testid(ui.tab(_("Model"), icon="psychology"), "admin-tab-model")
                health_tab = testid(ui.tab(_("Health"), icon="monitor_heart"), "admin-tab-health")
            with ui.tab_panels(tabs, value=users_tab).classes("w-full"):
                with ui.tab_panel(users_tab).classes("q-px-none"):
                    await UsersPanel(area, auth, user_id).build()
                with ui.tab_panel(model_tab).classes("q-px-none"):
                    await ModelPanel(area).build()
                with ui.tab_panel(health_tab).classes("q-px-none"):
                    await health_panel(area)


class UsersPanel:
    """Accounts (create, promote, disable, reset a password) and every running turn (stop one)."""

    def __init__(self, area: AdminArea, auth: AuthState, user_id: int | None) -> None:
        self.area = area
        self.auth = auth
        self.user_id = user_id

    async def build(self) -> None:
        """Lay out the form, the accounts and the running turns."""
        if self.auth.multi_user:
            with ui.row().classes("w-full items-end gap-2"):
                self.new_name = testid(ui.input(_("Username")), "admin-new-username").props("dense outlined")
                self.new_password = testid(
                    ui.input(_("Password"), password=True, password_toggle_button=True), "admin-new-password"
                ).props("dense outlined")
                self.new_admin = testid(ui.checkbox(_("Admin")), "admin-new-is-admin")
                testid(ui.button(_("Create account"), icon="person_add", on_click=self.create), "admin-create-user")
        else:
            ui.label(
                _(
                    "The app runs without accounts (single-user mode): create the first one on the command line "
                    "(python app.py users add NAME --admin), then restart the app to log in with it."
                )
            ).classes("text-grey-8")
        self.accounts = ui.refreshable(self._accounts)
        await self.accounts()
        ui.label(_("Running turns")).classes("text-h6 q-mt-md")
        self.turns = ui.refreshable(self._turns)
        await self.turns()
        testid(ui.button(_("Refresh"), icon="refresh", on_click=self.refresh).props("flat"), "admin-refresh")

    async def refresh(self) -> None:
        """Read the accounts and the turns again."""
        self.accounts.refresh()
        self.turns.refresh()

    async def _accounts(self) -> None:
        rows = await self.area.accounts() if self.auth.multi_user else []
        with testid(ui.column().classes("w-full gap-1"), "admin-users"):
            for row in rows:
                with (
                    ui.row()
                    .classes("w-full items-center gap-x-3 gap-y-1 q-py-xs")
                    .props(f"data-testid=admin-user data-username={row['username']}")
                ):
                    ui.label(row["username"]).classes("text-weight-medium min-w-32 break-all")
                    if row["admin"]:
                        ui.badge(_("admin"), color="primary")
                    if row["disabled"]:
                        ui.badge(_("disabled"), color="grey-7").props("data-testid=admin-user-disabled")
                    ui.label(
                        _("{count} running").format(count=row["runningTurns"]) if row["runningTurns"] else ""
                    ).classes("text-grey-7")
                    ui.space()
                    if row["id"] == self.user_id:
                        ui.label(_("(you)")).classes("text-grey-7")
                        continue
                    ui.button(
                        _("Remove admin") if row["admin"] else _("Make admin"),
                        on_click=lambda r=row: self.change(r["id"], {"admin": not r["admin"]}),
                    ).props("flat dense data-testid=admin-toggle-admin")
                    ui.button(
                        _("Enable") if row["disabled"] else _("Disable"),
                        on_click=lambda r=row: self.change(r["id"], {"disabled": not r["disabled"]}),
                    ).props(
                        f"flat dense {'' if row['disabled'] else 'color=negative'} data-testid=admin-toggle-disabled"
                    )
                    ui.button(_("Reset password"), on_click=lambda r=row: self.ask_password(r)).props(
                        "flat dense data-testid=admin-reset-password"
                    )

    async def _turns(self) -> None:
        turns = await self.area.running_turns()
        with testid(ui.column().classes("w-full gap-1"), "admin-turns"):
            if not turns:
                ui.label(_("No turn is running.")).classes("text-grey-7")
            for turn in turns:
                with (
                    ui.row()
                    .classes("w-full items-center gap-x-3 gap-y-1")
                    .props(f"data-testid=admin-turn data-session-id={turn['sessionId']}")
                ):
                    ui.label(turn["username"]).classes("text-weight-medium")
                    ui.label(turn["title"]).classes("ellipsis min-w-0 col")
                    ui.label(turn["agentId"]).classes("font-mono text-grey-8")
                    ui.button(_("Stop"), icon="stop", on_click=lambda t=turn: self.stop(t["sessionId"])).props(
                        "flat dense color=negative data-testid=admin-stop-turn"
                    )

    async def create(self) -> None:
        """Create the account the form describes."""
        if not _still_admin(self.auth):
            return
        try:
            row = await self.area.create_account(
                username=(self.new_name.value or "").strip(),
                password=self.new_password.value or "",
                admin=bool(self.new_admin.value),
            )
        except REFUSALS as exc:
            ui.notify(_sentence(exc), color="negative")
            return
        self.new_name.value = self.new_password.value = ""
        ui.notify(_("Created {name!r}.").format(name=row["username"]))
        self.accounts.refresh()

    async def change(self, user_id: int, changes: dict[str, Any]) -> bool:
        """Apply `changes` to an account; False (and a notice) when a rule refuses them."""
        user = await self.area.account(self.user_id)
        if user is None or not _still_admin(self.auth):
            return False
        try:
            await self.area.change_account(user, user_id, changes)
        except REFUSALS as exc:
            ui.notify(_sentence(exc), color="negative")
            return False
        self.accounts.refresh()
        return True

    def ask_password(self, row: dict[str, Any]) -> None:
        """Ask for a new password for the account of `row`, and set it."""
        with ui.dialog() as dialog, ui.card().classes("w-96 max-w-full"):
            ui.label(_("New password for {name}").format(name=row["username"])).classes("text-h6 break-all")
            password = testid(
                ui.input(_("Password"), password=True, password_toggle_button=True), "admin-password-input"
            ).props("outlined autofocus")

            async def save() -> None:
                if await self.change(row["id"], {"password": password.value or ""}):
                    ui.notify(_("The password of {name} was changed.").format(name=row["username"]))
                    dialog.close()

            with ui.row().classes("w-full justify-end"):
                ui.button(_("Cancel"), on_click=dialog.close).props("flat")
                testid(ui.button(_("Save"), on_click=save), "admin-password-save")
        dialog.open()

    async def stop(self, session_id: str) -> None:
        """Stop a running turn."""
        if not _still_admin(self.auth):
            return
        stopped = await self.area.stop_turn(session_id)
        ui.notify(_("Stopped.") if stopped else _("No turn of that chat is running (it may have ended)."))
        self.turns.refresh()
        self.accounts.refresh()


class ModelPanel:
    """The global model connection: default model, base URL, key (write-only); Test and Save."""

    def __init__(self, area: AdminArea) -> None:
        self.area = area

    async def build(self) -> None:
        """Lay out the form with the values in force (never the key)."""
        view = await self.area.model.view()
        ui.label(
            _(
                "The connection agents use when they name no base URL of their own. Empty fields use the "
                "environment's (DEFAULT_MODEL, LLM_API_BASE, LLM_API_KEY)."
            )
        ).classes("text-grey-8")
        self.model = testid(ui.input(_("Default model"), value=view["defaultModel"]), "admin-model-name").props(
            "outlined dense"
        )
        self.base = testid(
            ui.input(_("Base URL"), value=view["apiBase"] or "", placeholder="https://…/v1"), "admin-model-base"
        ).props("outlined dense")
        self.key = testid(
            ui.input(
                _("API key"),
                password=True,
                placeholder=_("a key is set; type to replace it") if view["hasApiKey"] else _("no key"),
            ),
            "admin-model-key",
        ).props("outlined dense autocomplete=off")
        with ui.row().classes("gap-2"):
            testid(ui.button(_("Test"), icon="science", on_click=self.test).props("outline"), "admin-model-test")
            testid(ui.button(_("Save"), icon="save", on_click=self.save), "admin-model-save")
        self.result = testid(ui.label("").classes("break-all"), "admin-model-result")

    def _fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"defaultModel": self.model.value or "", "apiBase": self.base.value or ""}
        if self.key.value:
            fields["apiKey"] = self.key.value
        return fields

    async def test(self) -> None:
        """Send one prompt through the form's connection, unsaved."""
        if not _still_admin(self.area.auth):
            return
        self.result.text = _("Testing…")
        outcome = await self.area.model.test(self._fields())
        self.result.text = outcome.text
        self.result.classes(replace="break-all " + ("text-positive" if outcome.ok else "text-negative"))

    async def save(self) -> None:
        """Save the form's connection and apply it."""
        if not _still_admin(self.area.auth):
            return
        user = await self.area.account(current_user_id(self.area.auth))
        try:
            view = await self.area.model.save(self._fields(), user_id=user.id if user and user.id else 0)
        except ConnectionRuleError as exc:
            self.result.text = exc.message
            self.result.classes(replace="break-all text-negative")
            return
        self.key.value = ""
        self.key.props(f"placeholder='{_('a key is set; type to replace it') if view['hasApiKey'] else _('no key')}'")
        self.result.text = _("Saved.")
        self.result.classes(replace="break-all text-positive")


async def health_panel(area: AdminArea) -> None:
    """The database, Redis, the broker and this replica, each with its state."""

    @ui.refreshable
    async def report() -> None:
        health = await area.health()
        with testid(ui.column().classes("w-full gap-2"), "admin-health").props(f"data-status={health['status']}"):
            _health_row(_("Database"), health["database"]["ok"], health["database"].get("url", ""), health["database"])
            redis = health["redis"]
            if redis["configured"]:
                _health_row(_("Redis"), redis.get("ok", False), redis["url"], redis)
            else:
                _health_row(_("Redis"), True, _("not used (one process)"), redis)
            broker = health["broker"]
            if broker is not None:
                detail = _("{agents} agents online, {tasks} tasks running").format(
                    agents=broker["agentsOnline"], tasks=broker["tasksRunning"]
                )
                _health_row(_("Broker"), broker["status"] == "ok", detail, broker)
            replica = health["replica"]
            detail = _("{id}: {count} turns running here").format(id=replica["id"], count=replica["turnsRunningHere"])
            _health_row(_("Replica"), True, detail, replica)
            ui.label(_("checked {when}").format(when=format_datetime(datetime.now(UTC), format="medium"))).classes(
                "text-grey-7"
            )

    await report()
    testid(ui.button(_("Check again"), icon="refresh", on_click=report.refresh).props("flat"), "admin-health-refresh")


def _health_row(name: str, ok: bool, detail: str, raw: dict[str, Any]) -> None:
    with (
        ui.row()
        .classes("w-full items-center gap-3 no-wrap")
        .props(f"data-testid=admin-health-row data-ok={str(ok).lower()}")
    ):
        ui.icon("check_circle" if ok else "error", color="positive" if ok else "negative")
        ui.label(name).classes("text-weight-medium min-w-24")
        ui.label(detail if ok else raw.get("error") or detail).classes("text-grey-8 break-all min-w-0")


def _still_admin(auth: AuthState) -> bool:
    """An action of the area runs only while its visitor is still an admin (one demoted keeps the page open)."""
    if auth.is_admin(current_user_id(auth)):
        return True
    ui.notify(_("The admin area is for admins; an admin can make you one."), color="negative")
    return False


def _sentence(exc: Exception) -> str:
    text = str(exc)
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."
