"""`/agents`: every agent, an editor for local ones, "Try it", and who may call whom as a graph.

The page calls `AgentAdmin` (`core/delegation/agent_admin.py`) for everything; the rules and
their messages are there, and a refusal is shown beside the field it names. Everyone sees the page;
only admins (`local` in single-user mode) get the editor's Save, Delete and Try it (which
`AgentAdmin.try_model` checks again itself).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from nicegui import ui

from core.auth.deps import AuthState
from core.chat.agents import A2A_DISPATCH, AGENT_INVOKE, DEFAULT_AGENT_INVOKE_CONFIG
from core.delegation.agent_admin import AgentAdmin, AgentRuleError, AgentView, Edge
from core.i18n import N_, _
from ui.auth import current_user_id
from ui.frame import build_frame
from ui.language import page
from ui.streaming import ChatMarkdown

# Suggestions for the model field: the demo model first, then common LiteLLM provider prefixes.
MODEL_SUGGESTIONS = [
    "local/demo",
    "openai/gpt-4o-mini",
    "openai/gpt-4o",
    "anthropic/claude-3-5-haiku-latest",
    "anthropic/claude-3-5-sonnet-latest",
    "gemini/gemini-1.5-flash",
    "groq/llama-3.1-8b-instant",
    "mistral/mistral-small-latest",
    "ollama/llama3.1",
    "openrouter/",
    "azure/",
    "bedrock/",
]
KIND_LABELS = {"local": N_("local"), "remote-http": N_("remote HTTP"), "broker": N_("broker")}
LIMITS = (
    ("maxRecursionDepth", N_("Max depth")),
    ("timeoutMs", N_("Timeout (ms)")),
    ("maxOutputTokens", N_("Max callee tokens")),
)


class AgentEditing(Protocol):
    """What the editor uses: the agents' rules and the login mode (`core.services.Services` has both)."""

    @property
    def agent_admin(self) -> AgentAdmin:
        """Agents as people list, create, change and delete them."""
        ...

    @property
    def auth(self) -> AuthState:
        """Single-user or multi-user mode."""
        ...


@dataclass(frozen=True, slots=True)
class _Editing:
    agent_admin: AgentAdmin
    auth: AuthState


def register_agents_page(*, admin: AgentAdmin, auth: AuthState) -> None:
    """`/agents`."""

    @page("/agents", title="Agents")
    async def agents_page(edit: str = "") -> None:
        build_frame(auth, title=_("Agents"), active="/agents")
        may_edit = await admin.may_change(current_user_id(auth), multi_user=auth.multi_user)
        editing = _Editing(agent_admin=admin, auth=auth)
        state: dict[str, Any] = {"selected": edit or None}

        @ui.refreshable
        async def agent_list(views: list[AgentView]) -> None:
            for view in views:
                props = f"flat bordered data-testid=agent-card data-agent-id={view.id}"
                with (
                    ui.card()
                    .classes("w-full cursor-pointer q-pa-sm")
                    .props(props)
                    .on("click", lambda v=view: open_editor(v.id))
                ):
                    with ui.row().classes("w-full items-center gap-2 no-wrap"):
                        ui.label(view.name).classes("text-subtitle1 text-weight-medium ellipsis")
                        ui.badge(_kind(view.kind), color="primary" if view.is_local else "teal")
                        if view.online is not None:
                            ui.badge(
                                _("online") if view.online else _("offline"),
                                color="positive" if view.online else "grey-7",
                            )
                    ui.label(f"@{view.id}" + (f" · {view.model}" if view.model else "")).classes(
                        "text-caption font-mono text-grey-8 break-all"
                    )
                    if view.description:
                        ui.label(view.description).classes("text-body2")
                    if view.tools:
                        ui.label(_("tools: {names}").format(names=", ".join(t["type"] for t in view.tools))).classes(
                            "text-caption text-grey-7"
                        )

        editor: ui.column  # made inside its card below; the handlers run after that

        async def open_editor(agent_id: str | None) -> None:
            state["selected"] = agent_id
            await render_editor()

        async def render_editor() -> None:
            views = await admin.list()
            editor.clear()
            with editor:
                selected = next((v for v in views if v.id == state["selected"]), None)
                if selected is not None and not selected.is_local:
                    _remote_details(selected)
                elif selected is not None or state["selected"] == "":
                    AgentEditor(editing, selected, views, may_edit, on_saved=after_change).render()
                else:
                    ui.label(
                        _("Pick an agent to see or change it, or make a new one.")
                        if may_edit
                        else _("Pick an agent to see or change it.")
                    ).classes("text-grey-7").props("data-testid=agent-editor-hint")

        async def after_change(agent_id: str | None) -> None:
            state["selected"] = agent_id
            await refresh_all()

        async def refresh_all() -> None:
            views = await admin.list()
            agent_list.refresh(views)
            graph.refresh(views, await admin.edges(views))
            await render_editor()

        @ui.refreshable
        def graph(views: list[AgentView], edges: list[Edge]) -> None:
            ids = {v.id: f"n{i}" for i, v in enumerate(views)}
            lines = ["flowchart LR"]
            for view in views:
                shape = ('["', '"]') if view.is_local else ('(["', '"])')
                lines.append(f"  {ids[view.id]}{shape[0]}{_mermaid_text(view.name)}{shape[1]}")
            for edge in edges:
                arrow = "-.->" if edge.any or edge.tool == A2A_DISPATCH else "-->"
                lines.append(f"  {ids[edge.caller]} {arrow} {ids[edge.callee]}")
            by_node = {node: agent_id for agent_id, node in ids.items()}
            ui.mermaid("\n".join(lines), on_node_click=lambda e: open_editor(by_node.get(e.node_id))).classes(
                "w-full overflow-x-auto"
            ).props("data-testid=agent-graph")
            names = {v.id: v.name for v in views}
            with ui.column().classes("gap-0").props("data-testid=agent-edges"):
                for edge in edges:
                    note = (
                        " " + _("(any agent)")
                        if edge.any
                        else " " + _("(background)")
                        if edge.tool == A2A_DISPATCH
                        else ""
                    )
                    ui.label(f"{names[edge.caller]} → {names[edge.callee]}{note}").classes("text-caption").props(
                        f"data-testid=agent-edge data-edge={edge.caller}--{edge.callee}"
                    )

        views = await admin.list()
        with ui.column().classes("w-full max-w-6xl mx-auto q-pa-md gap-4"):
            with ui.row().classes("w-full items-center justify-between"):
                ui.label(_("Agents")).classes("text-h5").props("data-testid=agents-heading")
                if may_edit:
                    ui.button(_("New agent"), icon="add", on_click=lambda: open_editor("")).props(
                        "data-testid=new-agent-btn"
                    )
            # The list, and the editor's card beside it (below it on a phone: the row wraps).
            with ui.row().classes("w-full gap-4 items-start wrap"):
                with ui.column().classes("gap-2 grow basis-72 min-w-0").props("data-testid=agent-list"):
                    await agent_list(views)
                with ui.card().classes("grow-[2] basis-80 min-w-0").props("flat bordered data-testid=agent-editor"):
                    editor = ui.column().classes("w-full")
                    await render_editor()
            ui.label(_("Who may call whom")).classes("text-h6")
            ui.label(
                _(
                    "An arrow for each allowed delegation; dotted: it may call any agent, or a background "
                    "dispatch. Click an agent to open it."
                )
            ).classes("text-caption text-grey-7")
            graph(views, await admin.edges(views))


def _mermaid_text(text: str) -> str:
    # Inside a quoted mermaid label: no quotes, no markup.
    return "".join(c if c.isalnum() or c in " -_.,()/" else " " for c in text)[:60] or "agent"


def _remote_details(view: AgentView) -> None:
    ui.label(view.name).classes("text-h6")
    online = _("online") if view.online else _("offline")
    ui.label(f"@{view.id} · {_kind(view.kind)} · {online}").classes("font-mono text-grey-8")
    if view.description:
        ui.label(view.description)
    ui.label(
        _("A remote agent: it is changed where it runs (remote HTTP agents are registered on Remote agents).")
    ).classes("text-caption text-grey-7")


def _kind(kind: str) -> str:
    return _(KIND_LABELS[kind]) if kind in KIND_LABELS else kind


#: Called with the id of the agent saved, or None after a delete.
OnSaved = Callable[[str | None], Awaitable[None]]


class AgentEditor:
    """The form of one local agent (or a new one): every writable field, Save, Delete and Try it."""

    def __init__(
        self,
        services: AgentEditing,
        view: AgentView | None,
        views: list[AgentView],
        may_edit: bool,
        on_saved: Callable[[str | None], Awaitable[None]],
    ) -> None:
        self.services = services
        self.view = view
        self.views = views
        self.may_edit = may_edit
        self.on_saved = on_saved
        self.inputs: dict[str, Any] = {}

    def render(self) -> None:
        """Build the form."""
        view = self.view
        invoke = view.tool(AGENT_INVOKE) if view else None
        with ui.column().classes("w-full gap-2"):
            ui.label(_("Edit {name}").format(name=view.name) if view else _("New agent")).classes("text-h6")
            with ui.row().classes("w-full gap-2"):
                self.inputs["id"] = self._input(
                    _("Id"), view.id if view else "", testid="agent-id", readonly=view is not None
                )
                self.inputs["name"] = self._input(_("Name"), view.name if view else "", testid="agent-name")
            self.inputs["description"] = self._input(
                _("Description"), view.description if view else "", testid="agent-description", full_width=True
            )
            self.inputs["model"] = (
                ui.input(_("Model"), value=view.model if view else "local/demo", autocomplete=MODEL_SUGGESTIONS)
                .props(
                    "dense outlined data-testid=agent-model "
                    "hint='" + _("LiteLLM model string, e.g. openai/gpt-4o-mini") + "'"
                )
                .classes("w-full")
            )
            with ui.row().classes("w-full gap-2"):
                self.inputs["apiBase"] = self._input(
                    _("API base URL (optional)"), (view.api_base or "") if view else "", testid="agent-api-base"
                )
                key_label = (
                    _("API key (stored; type to replace)") if view and view.has_api_key else _("API key (optional)")
                )
                self.inputs["apiKey"] = (
                    ui.input(key_label, password=True, password_toggle_button=True)
                    .props("dense outlined data-testid=agent-api-key")
                    .classes("grow basis-48")
                )
            self.remove_key = (
                ui.checkbox(_("Remove the stored key")).props("dense") if view and view.has_api_key else None
            )
            with ui.row().classes("w-full gap-2"):
                self.inputs["temperature"] = (
                    ui.number(
                        _("Temperature"),
                        value=view.temperature if view else None,
                        min=0,
                        max=2,
                        step=0.1,
                        placeholder=_("model default"),
                    )
                    .props("dense outlined data-testid=agent-temperature")
                    .classes("grow basis-32")
                )
                self.inputs["maxOutputTokens"] = (
                    ui.number(
                        _("Max output tokens"),
                        value=view.max_output_tokens if view else None,
                        min=1,
                        precision=0,
                        placeholder=_("model default"),
                    )
                    .props("dense outlined data-testid=agent-max-tokens")
                    .classes("grow basis-32")
                )
            self.inputs["systemPrompt"] = (
                ui.textarea(_("System prompt"), value=view.system_prompt if view else "")
                .props("outlined autogrow data-testid=agent-system-prompt")
                .classes("w-full")
            )

            ui.label(_("Tools")).classes("text-subtitle2 q-mt-sm")
            self.can_delegate = ui.checkbox(
                _("May delegate to other agents (agent-invoke)"), value=invoke is not None
            ).props("data-testid=agent-can-delegate")
            with ui.column().classes("w-full gap-2 q-pl-md").bind_visibility_from(self.can_delegate, "value"):
                others = {v.id: f"{v.name} (@{v.id})" for v in self.views if not view or v.id != view.id}
                allowed = (invoke or {}).get("allowedAgents")
                self.any_agent = ui.checkbox(_("Any agent"), value=allowed is None).props("dense data-testid=agent-any")
                self.inputs["allowedAgents"] = (
                    ui.select(
                        others,
                        multiple=True,
                        value=[a for a in (allowed or []) if a in others],
                        label=_("May call"),
                    )
                    .props("dense outlined use-chips data-testid=agent-allowed")
                    .classes("w-full")
                    .bind_visibility_from(self.any_agent, "value", backward=lambda v: not v)
                )
                with ui.row().classes("w-full gap-2"):
                    for key, label in LIMITS:
                        default = DEFAULT_AGENT_INVOKE_CONFIG[key]
                        self.inputs[key] = (
                            ui.number(
                                _("{label} (default {default})").format(label=_(label), default=default),
                                value=(invoke or {}).get(key, default),
                                min=1,
                                precision=0,
                            )
                            .props(f"dense outlined data-testid=agent-{key}")
                            .classes("grow basis-32")
                        )
            self.dispatch = ui.checkbox(
                _("May dispatch to broker agents in the background (a2a-dispatch)"),
                value=bool(view and view.tool(A2A_DISPATCH) is not None),
            ).props("data-testid=agent-dispatch")

            with ui.row().classes("w-full items-center gap-2 q-mt-sm"):
                if self.may_edit:
                    ui.button(_("Save"), icon="save", on_click=self.save).props("data-testid=agent-save")
                    if view is not None:
                        ui.button(_("Delete"), icon="delete", on_click=self.confirm_delete).props(
                            "flat color=negative data-testid=agent-delete"
                        )
                    ui.button(_("Try it"), icon="play_arrow", on_click=self.try_it).props(
                        "outline data-testid=agent-try"
                    )
                if view is not None:
                    ui.button(_("Chat"), icon="chat", on_click=lambda: ui.navigate.to(f"/?agent={view.id}")).props(
                        "flat data-testid=agent-chat"
                    )
            # The reply is Markdown, shown as the chat shows it (issue 40: it showed `**` and fences raw);
            # `decorate-code` gives its code blocks the chat's language label and Copy (assets/app.js).
            with ui.column().classes("w-full gap-1 decorate-code").props("data-testid=agent-try-out") as out:
                self.try_output = out
                self.try_status = ui.label("").classes("whitespace-pre-wrap text-body2")
                self.try_reply = ChatMarkdown("").classes("w-full")
                self.try_reply.set_visibility(False)
            if not self.may_edit:
                ui.label(_("Only admins change agents.")).classes("text-caption text-grey-7")

    @staticmethod
    def _input(label: str, value: str, testid: str, readonly: bool = False, full_width: bool = False) -> ui.input:
        # In a row a field grows beside its neighbour; alone in the column it takes the form's width
        # (`grow basis-48` there would grow it 12rem *down*, leaving blank space under it).
        width = "w-full" if full_width else "grow basis-48"
        element = ui.input(label, value=value).props(f"dense outlined data-testid={testid}").classes(width)
        if readonly:
            element.props("readonly")
        return element

    def fields(self) -> dict[str, Any]:
        """The form as the admin's fields (snake_case, API-shaped)."""

        def get(key: str) -> Any:
            return self.inputs[key].value

        fields: dict[str, Any] = {
            "name": get("name") or "",
            "description": get("description") or "",
            "model": get("model") or "",
            "api_base": get("apiBase") or None,
            "system_prompt": get("systemPrompt") or "",
            "temperature": get("temperature"),
            "max_output_tokens": int(get("maxOutputTokens")) if get("maxOutputTokens") else None,
        }
        if get("apiKey"):
            fields["api_key"] = get("apiKey")
        elif self.remove_key is not None and self.remove_key.value:
            fields["api_key"] = None
        tools: list[dict[str, Any]] = []
        if self.can_delegate.value:
            config: dict[str, Any] = {k: int(get(k)) for k, _ in LIMITS if get(k)}
            config["allowedAgents"] = None if self.any_agent.value else list(get("allowedAgents") or [])
            tools.append({"type": AGENT_INVOKE, "config": config})
        if self.dispatch.value:
            tools.append({"type": A2A_DISPATCH, "config": {}})
        fields["tools"] = tools
        return fields

    async def save(self) -> None:
        """Create or change the agent; a refusal is shown beside its field."""
        for element in self.inputs.values():
            if hasattr(element, "error"):
                element.error = None
        fields = self.fields()
        try:
            if self.view is None:
                saved = await self.services.agent_admin.create({**fields, "id": self.inputs["id"].value or ""})
            else:
                saved = await self.services.agent_admin.update(self.view.id, fields)
        except AgentRuleError as exc:
            self._show_error(exc)
            return
        ui.notify(_("Saved {name}; it applies from the next turn.").format(name=saved.name), color="positive")
        await self.on_saved(saved.id)

    def _show_error(self, exc: AgentRuleError) -> None:
        names = [str(part) for part in exc.loc if isinstance(part, str) and part not in {"tools", "config"}]
        target = next((self.inputs[n] for n in reversed(names) if n in self.inputs), None)
        if target is not None and hasattr(target, "error"):
            target.error = exc.message
        ui.notify(exc.message, color="negative", multi_line=True)

    async def confirm_delete(self) -> None:
        """Delete's button: ask first, as the chat list does before deleting a chat; Cancel keeps the agent."""
        if self.view is None:  # a new agent's form has no Delete button
            return
        view = self.view
        with ui.dialog() as dialog, ui.card().classes("w-96 max-w-full").props("data-testid=agent-delete-dialog"):
            ui.label(_("Delete {name}?").format(name=view.name)).classes("text-h6")
            ui.label(_("Its chats stay readable; other agents may no longer call it. This cannot be undone.")).classes(
                "text-grey-8"
            )
            with ui.row().classes("w-full justify-end"):
                ui.button(_("Cancel"), on_click=lambda: dialog.submit(False)).props(
                    "flat data-testid=agent-delete-cancel"
                )
                ui.button(_("Delete"), on_click=lambda: dialog.submit(True), color="negative").props(
                    "data-testid=agent-delete-confirm"
                )
        confirmed = await dialog
        dialog.delete()
        if confirmed:
            await self.delete()

    async def delete(self) -> None:
        """Delete the agent (its chats stay readable)."""
        if self.view is None:
            return
        view = self.view
        try:
            deleted = await self.services.agent_admin.delete(view.id)
        except AgentRuleError as exc:
            ui.notify(exc.message, color="negative", multi_line=True)
            return
        if deleted.removed_from:
            done = _("Deleted {name}; removed from the allowed agents of {agents}.").format(
                name=view.name, agents=", ".join(deleted.removed_from)
            )
        else:
            done = _("Deleted {name}.").format(name=view.name)
        ui.notify(done, color="positive")
        await self.on_saved(None)

    async def try_it(self) -> None:
        """Send one short prompt through the form's model and show the reply (as Markdown) or the error."""
        self._show_try(_("Asking the model…"))
        self.inputs["apiKey"].error = None
        try:
            result = await self.services.agent_admin.try_model(
                self.fields(),
                self.view.id if self.view else None,
                user_id=current_user_id(self.services.auth),
                multi_user=self.services.auth.multi_user,
            )
        except AgentRuleError as exc:
            self._show_try(_("Error: {text}").format(text=exc.message), failed=True)
            return
        if result.field in self.inputs:
            self.inputs[result.field].error = result.text
        if result.ok:
            self._show_try(_("Reply:"), reply=result.text)
        else:
            self._show_try(_("Error: {text}").format(text=result.text), failed=True)

    def _show_try(self, status: str, *, reply: str | None = None, failed: bool = False) -> None:
        self.try_status.text = status
        self.try_status.classes(replace="whitespace-pre-wrap text-body2 " + ("text-negative" if failed else ""))
        self.try_reply.set_content(reply or "")
        self.try_reply.set_visibility(reply is not None)
