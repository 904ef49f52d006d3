"""`/remote-agents`: register remote A2A agents by the URL of their card, and remove them.

A registered agent joins the registry under its id at once: mention it in a
chat with an agent that can delegate (`@<id> …`).
"""

from __future__ import annotations

from nicegui import ui

from core.a2a.remote_agents import RegistrationError, RemoteAgentDirectory
from core.auth.deps import AuthState
from core.i18n import _
from ui.auth import current_user_id
from ui.frame import build_frame, testid
from ui.language import page


def register_remote_agents_page(*, remote_agents: RemoteAgentDirectory, auth: AuthState) -> None:
    """`/remote-agents`."""

    @page("/remote-agents", title="Remote agents")
    async def remote_agents_page() -> None:
        build_frame(auth, title=_("Remote agents"), active="/remote-agents")

        @ui.refreshable
        async def agent_list() -> None:
            agents = await remote_agents.list()
            if not agents:
                testid(ui.label(_("No remote agents registered yet.")), "no-remote-agents").classes("text-grey-7")
                return
            for agent in agents:
                props = f"flat bordered data-testid=remote-agent data-agent-id={agent.id}"
                with ui.card().classes("w-full").props(props):
                    with ui.row().classes("w-full items-center justify-between"):
                        with ui.row().classes("items-center gap-2"):
                            ui.label(agent.name).classes("text-h6")
                            ui.label(f"@{agent.id}").classes("font-mono text-grey-8").mark(f"remote-{agent.id}").props(
                                "data-testid=remote-agent-id"
                            )
                            ui.badge(
                                _("online") if agent.online else _("not loaded"),
                                color="positive" if agent.online else "grey-7",
                            )
                        if agent.owner_id in (None, current_user_id(auth)):
                            ui.button(_("Remove"), on_click=lambda a=agent: remove(a.id)).props(
                                "flat color=negative dense data-testid=remove-remote-agent-btn"
                            ).mark(f"remove-{agent.id}")
                        else:
                            ui.label(_("registered by another user")).classes("text-caption text-grey-7")
                    if agent.description:
                        ui.label(agent.description)
                    details = [_("card: {url}").format(url=agent.card_url)]
                    if agent.url:
                        details.append(
                            _("A2A {version} at {url}").format(version=agent.protocol_version, url=agent.url)
                        )
                        details.append(_("streaming") if agent.streaming else _("no streaming"))
                    ui.label(" · ".join(details)).classes("text-caption text-grey-7 break-all")

        async def register() -> None:
            button.disable()
            try:
                view = await remote_agents.register(
                    card_url.value or "",
                    agent_id=agent_id.value or None,
                    bearer_token=token.value or None,
                    user_id=current_user_id(auth),
                )
            except RegistrationError as exc:
                ui.notify(str(exc), color="negative", multi_line=True)
                return
            finally:
                button.enable()
            ui.notify(_("Registered {name} as @{id}.").format(name=view.name, id=view.id), color="positive")
            card_url.value = agent_id.value = token.value = ""
            agent_list.refresh()

        async def remove(remote_id: str) -> None:
            try:
                removed = await remote_agents.unregister(remote_id, user_id=current_user_id(auth))
            except RegistrationError as exc:
                ui.notify(str(exc), color="negative")
                return
            ui.notify((_("Removed @{id}.") if removed else _("@{id} was not registered.")).format(id=remote_id))
            agent_list.refresh()

        with ui.column().classes("w-full max-w-4xl mx-auto q-pa-md gap-4"):
            ui.label(_("Remote A2A agents")).classes("text-h5")
            ui.label(
                _(
                    "Register an agent that speaks A2A over HTTP by the URL of its agent card (or its base URL). "
                    "It can then be delegated to like a local agent: @<id> in a chat."
                )
            ).classes("text-grey-8")
            with ui.row().classes("w-full items-end gap-2"):
                card_url = (
                    ui.input(_("Card URL"), placeholder="https://host/.well-known/agent-card.json")
                    .props("dense outlined data-testid=card-url")
                    .classes("grow min-w-0")
                    .style("min-width: 12rem")
                )
                card_url.mark("card-url")
                agent_id = (
                    ui.input(_("Id (optional)"), placeholder=_("from the card's name"))
                    .props("dense outlined")
                    .classes("w-48")
                    .mark("remote-id")
                    .props("data-testid=remote-id")
                )
                token = (
                    ui.input(_("Bearer token (optional)"), password=True)
                    .props("dense outlined")
                    .classes("w-56")
                    .mark("remote-token")
                    .props("data-testid=remote-token")
                )
                button = testid(ui.button(_("Register"), icon="add_link", on_click=register), "register-btn")
            await agent_list()
