"""`/api-keys`: create and revoke the API keys that A2A clients send to `POST /a2a/agents/{id}`.

A new key is shown once, right after it is made; the app keeps only its hash.
"""

from __future__ import annotations

from datetime import datetime

from nicegui import ui

from core.a2a import api_keys
from core.auth.deps import AuthState
from core.i18n import _, format_datetime
from ui.auth import current_user_id
from ui.frame import build_frame, testid
from ui.language import page


def register_api_keys_page(*, keys: api_keys.ApiKeys, auth: AuthState, base_url: str) -> None:
    """`/api-keys`: the user's keys in `keys`; `base_url` is where callers reach the A2A endpoints."""

    @page("/api-keys", title="API keys")
    async def api_keys_page() -> None:
        user_id = current_user_id(auth) or 0
        build_frame(auth, title=_("API keys"), active="/api-keys")

        @ui.refreshable
        async def key_list() -> None:
            rows = await keys.list_keys(user_id=user_id)
            if not rows:
                ui.label(_("No keys yet.")).classes("text-grey-7").mark("no-keys").props("data-testid=no-keys")
                return
            for row in rows:
                with (
                    ui.row()
                    .classes("w-full items-center gap-x-4 gap-y-1")
                    .props(f"data-testid=api-key data-key-id={row.id}")
                ):
                    ui.label(row.name).classes("text-weight-medium min-w-40")
                    ui.label(f"{row.prefix}…").classes("font-mono text-grey-8 break-all")
                    ui.label(_("created {when}").format(when=_when(row.created_at))).classes("text-grey-7")
                    ui.label(_("last used {when}").format(when=_when(row.last_used_at))).classes("text-grey-7")
                    if row.revoked_at is not None:
                        ui.badge(_("revoked"), color="grey-7").mark(f"revoked-{row.name}").props(
                            "data-testid=key-revoked"
                        )
                    else:
                        ui.button(_("Revoke"), on_click=lambda r=row: revoke(r.id, r.name)).props(
                            "flat color=negative dense"
                        ).mark(f"revoke-{row.name}").props("data-testid=revoke-key-btn")

        async def create() -> None:
            try:
                _row, key = await keys.create_key(user_id=user_id, name=name.value or "")
            except api_keys.ApiKeyError as exc:
                ui.notify(_("Cannot create the key: {reason}.").format(reason=exc), color="negative")
                return
            name.value = ""
            new_key.clear()
            with new_key:
                ui.label(_("Copy this key now; it will not be shown again:"))
                with ui.row().classes("w-full items-center gap-2 no-wrap"):
                    testid(ui.label(key), "new-key").classes("font-mono bg-grey-2 q-pa-sm break-all min-w-0")
                    ui.button(icon="content_copy", on_click=lambda: ui.clipboard.write(key)).props(
                        "flat dense aria-label='" + _("Copy the key") + "' data-testid=copy-key-btn"
                    )
            new_key.set_visibility(True)
            key_list.refresh()

        async def revoke(key_id: int, key_name: str) -> None:
            done = await keys.revoke_key(user_id=user_id, key_id=key_id)
            ui.notify(_("Revoked {name!r}.").format(name=key_name) if done else _("That key was already revoked."))
            key_list.refresh()

        with ui.column().classes("w-full max-w-4xl mx-auto q-pa-md gap-4"):
            ui.label(_("API keys for A2A clients")).classes("text-h5")
            ui.markdown(
                _(
                    "Any A2A client can call this app's agents at "
                    "`{base_url}/a2a/agents/<agent-id>` (card: "
                    "`…/.well-known/agent-card.json`). JSON-RPC calls need one of your keys as "
                    "`Authorization: Bearer <key>`, in single-user mode too; the tasks they start are yours "
                    "and appear in the [audit view](/audit)."
                ).format(base_url=base_url)
            )
            with ui.row().classes("items-end gap-2"):
                name = testid(ui.input(_("Name"), placeholder=_("what will use the key")), "key-name").props(
                    "dense outlined"
                )
                name.on("keydown.enter", create)
                testid(ui.button(_("Create key"), icon="key", on_click=create), "create-key-btn")
            new_key = ui.card().classes("w-full bg-green-1")
            new_key.set_visibility(False)
            await key_list()


def _when(moment: datetime | None) -> str:
    return _("never") if moment is None else format_datetime(moment, format="short")
