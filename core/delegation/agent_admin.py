"""Agents as people edit them (issue 15): the list of every agent, one agent's settings, and the rules an edit follows.

Every route of `/api/agents` and the `/agents` page go through `AgentAdmin`; the rows are
`core.chat.agents`'. The rules, each an `AgentRuleError` with the field it concerns and the HTTP
status it answers with:

- the id is immutable and unique across local agents (deleted ones included: their chats and audit
  records keep it), remote HTTP agents (registered, online or not) and broker agents online now (409);
- `allowedAgents` names only agents that exist, and not the agent itself (422);
- a model string LiteLLM does not know is refused unless the agent has an `apiBase` (422);
- an `apiBase` is an outbound fetch: refused on a loopback, private or link-local address not in
  `OUTBOUND_ALLOW_HOSTS`, on a cloud metadata address always, and for a provider whose credentials
  LiteLLM takes from the environment (bedrock, vertex_ai, ...; `core.chat.model_route`) (422);
- a stored key goes only to the endpoint it was saved for (its `apiBase`; without one, its model's
  provider): changing `apiBase`, or the model to another provider, without giving the key again (or
  removing it) is refused (422 on `apiKey`), and "Try it" towards another endpoint does not use it;
- an agent with running tasks (as caller or callee) cannot be deleted (409 naming them); deleting
  one takes it out of every other agent's `allowedAgents`, and says where.

Who may call these (admins) is the routes' and the page's check (`accounts.may_change_agents`);
"Try it" checks it itself (`try_model`), since it sends the stored key and shows the reply.
A change is read by the next turn: a running turn keeps the agent row it started with.
"""

from __future__ import annotations

import asyncio
import builtins  # `list` is also a method of AgentAdmin
from collections.abc import Awaitable, Callable
from typing import Any

from sqlmodel import col, select

from core.auth import accounts
from core.chat import agents as agents_store
from core.chat import running_turns as running_turns_store
from core.chat.llm import DEMO_PROVIDER, LLMError, LLMGateway, model_problem
from core.db import Database
from core.delegation.agent_rules import (
    AgentConflictError,
    AgentRuleError,
    Loc,
    NotAllowedError,
    UnknownAgentError,
    allowed_loc,
    invoke_config,
    key_stays_with_its_endpoint,
    parse_api_base,
    parse_tools,
    stored_key_elsewhere,
)
from core.delegation.agent_views import (
    KIND_BROKER,
    KIND_HTTP,
    KIND_LOCAL,
    AgentView,
    Deleted,
    Edge,
    TryResult,
    local_view,
)
from core.delegation.registry import AgentRegistry
from core.delegation.tasks import AUTH_REQUIRED, INPUT_REQUIRED, SUBMITTED, WORKING
from core.i18n import _, format_number
from core.secret_box import LazySecretBox
from models import A2ATaskSession, Agent, RemoteA2AAgent

# The rule errors live in core.delegation.agent_rules; they are named here too, where callers have always found them.
__all__ = [
    "KIND_BROKER",
    "KIND_HTTP",
    "KIND_LOCAL",
    "LOCAL_AGENT",
    "TRY_PROMPT",
    "AgentAdmin",
    "AgentConflictError",
    "AgentRuleError",
    "AgentView",
    "Deleted",
    "Edge",
    "NotAllowedError",
    "TryResult",
    "UnknownAgentError",
]

LOCAL_AGENT = "agent"  # the kind of registry notice an edit sends (core/db_events.py)

TRY_PROMPT = "Say hello and, in one short sentence, what you can do."
TRY_TIMEOUT_S = 30.0


class AgentAdmin:
    """Reads and edits agents under the rules of `core.delegation.agent_rules`.

    Over 300 lines on purpose: one method per operation an admin has on agents (list, read,
    create, change, delete, try), each a short transaction; the rules and the views they return
    are in their own modules (`agent_rules`, `agent_views`).
    """

    def __init__(
        self, db: Database, registry: AgentRegistry, llm: LLMGateway, secrets: LazySecretBox, default_model: str
    ) -> None:
        self.db = db
        self.registry = registry
        self.llm = llm
        self.secrets = secrets
        self.default_model = default_model
        # Cluster mode: tells the other replicas an agent was created, edited or deleted (`core.db_events`,
        # kind "agent"); they pass it to their registry's listeners (`AgentRegistry.changed`).
        self.notify: Callable[[str, str, str], Awaitable[None]] | None = None

    async def _told(self, agent_id: str, op: str) -> None:
        await self.registry.changed(agent_id, op)  # this process's listeners (`AgentCache.forget`)
        if self.notify is not None:
            await self.notify(LOCAL_AGENT, agent_id, op)

    async def may_change(self, user_id: int | None, *, multi_user: bool) -> bool:
        """Whether that user may create, change and delete agents (for the page; routes use `AdminUser`)."""
        if not multi_user:
            return True
        async with self.db.session() as s:
            user = await accounts.get_user(s, user_id) if user_id is not None else None
        return user is not None and accounts.may_change_agents(user, multi_user=multi_user)

    # -- reading -------------------------------------------------------------------------

    async def list(self) -> list[AgentView]:
        """Every agent: local ones by name, then remote ones (online or registered) by id."""
        async with self.db.session() as s:
            rows = await agents_store.list_agents(s)
            tools = await agents_store.tools_by_agent(s)
            registered = list((await s.exec(select(RemoteA2AAgent).order_by(col(RemoteA2AAgent.id)))).all())
        views = [local_view(a, tools.get(a.id, {}) if a.id is not None else {}) for a in rows]
        online = {r.id: r for r in self.registry.remote_agents()}
        for remote in online.values():
            views.append(
                AgentView(
                    id=remote.id,
                    name=remote.name,
                    description=remote.description or "",
                    kind=KIND_BROKER if remote.kind == "ws" else KIND_HTTP,
                    online=True,
                )
            )
        for row in registered:
            if row.id not in online:
                card = row.card or {}
                views.append(
                    AgentView(
                        id=row.id,
                        name=str(card.get("name") or row.id),
                        description=str(card.get("description") or ""),
                        kind=KIND_HTTP,
                        online=False,
                    )
                )
        return views

    async def get(self, agent_id: str) -> AgentView:
        """One agent (local or remote).

        Raises:
            UnknownAgentError: no agent has that id.
        """
        view = next((v for v in await self.list() if v.id == agent_id), None)
        if view is None:
            raise UnknownAgentError(_("There is no agent {name!r}.").format(name=agent_id))
        return view

    async def edges(self, views: builtins.list[AgentView] | None = None) -> builtins.list[Edge]:
        """Who may call whom.

        An edge per allowed delegation (`agent-invoke`; to every agent when it has no list) and per
        broker agent offered to an agent with `a2a-dispatch`.
        """
        views = views if views is not None else await self.list()
        ids = {v.id for v in views}
        edges = []
        for caller in (v for v in views if v.is_local):
            invoke = caller.tool(agents_store.AGENT_INVOKE)
            if invoke is not None:
                allowed = invoke.get("allowedAgents")
                if allowed is None:
                    edges += [
                        Edge(caller.id, v.id, agents_store.AGENT_INVOKE, any=True)
                        for v in views
                        if v.id != caller.id and self._may_reach(v, caller)
                    ]
                else:
                    edges += [Edge(caller.id, a, agents_store.AGENT_INVOKE) for a in allowed if a in ids]
            if caller.tool(agents_store.A2A_DISPATCH) is not None:
                edges += [
                    Edge(caller.id, v.id, agents_store.A2A_DISPATCH)
                    for v in views
                    if v.kind == KIND_BROKER and self._may_reach(v, caller)
                ]
        return edges

    def _may_reach(self, callee: AgentView, caller: AgentView) -> bool:
        remote = self.registry.remote(callee.id) if not callee.is_local else None
        return remote is None or remote.visible_to(caller.id)

    # -- writing -------------------------------------------------------------------------

    async def create(self, fields: dict[str, Any]) -> AgentView:
        """A new local agent from API-shaped fields (snake_case names; see `core.delegation.agent_routes`).

        Raises:
            AgentRuleError: a rule refuses it (`AgentConflictError` for a taken id).
        """
        slug = str(fields.get("id") or "")
        if not agents_store.SLUG_PATTERN.fullmatch(slug):
            raise AgentRuleError(
                _("An agent id is 1-64 lowercase letters, digits, '-' or '_', starting with a letter or digit."),
                ("id",),
            )
        if not str(fields.get("name") or "").strip():
            raise AgentRuleError(_("An agent needs a name."), ("name",))
        await self._check_id_free(slug)
        model = (fields.get("model") or "").strip() or self.default_model
        api_base = parse_api_base(fields.get("api_base"))
        await self._check_model(model, api_base)
        tools = parse_tools(fields.get("tools"))
        if fields.get("can_delegate") and agents_store.AGENT_INVOKE not in tools:
            tools[agents_store.AGENT_INVOKE] = invoke_config(fields.get("delegation") or {}, ("delegation",))
        await self._check_allowed(slug, tools, allowed_loc(fields))
        settings = {
            "api_base": api_base,
            "temperature": fields.get("temperature"),
            "max_output_tokens": fields.get("max_output_tokens"),
        }
        if fields.get("api_key"):
            settings["api_key"] = self.secrets.seal(fields["api_key"])
        async with self.db.session() as s:
            try:
                agent = await agents_store.create_agent(
                    s,
                    slug=slug,
                    name=fields["name"],
                    model=model,
                    description=fields.get("description") or "",
                    system_prompt=fields.get("system_prompt") or "",
                    tools=tools,
                    **settings,
                )
            except agents_store.AgentExistsError as exc:
                raise AgentConflictError(_("Cannot create the agent: {reason}.").format(reason=exc), ("id",)) from exc
            except agents_store.AgentError as exc:
                raise AgentRuleError(_("Cannot create the agent: {reason}.").format(reason=exc), ()) from exc
        await self._told(agent.slug, "created")
        return await self.get(agent.slug)

    async def update(self, agent_id: str, fields: dict[str, Any]) -> AgentView:
        """Change any subset of a local agent's writable fields (only the keys present in `fields`).

        `api_key`: a value replaces the stored key, None or "" removes it, absent keeps it. `tools`
        replaces the whole list.

        Raises:
            UnknownAgentError: no local agent with that id.
            AgentRuleError: a rule refuses the change.
        """
        if "id" in fields and fields["id"] != agent_id:
            raise AgentRuleError(_("The id of an agent cannot be changed; create a new agent instead."), ("id",))
        async with self.db.session() as s:
            agent = await agents_store.get_agent_by_slug(s, agent_id)
        if agent is None:
            raise UnknownAgentError(_("There is no local agent {name!r}.").format(name=agent_id))
        changes: dict[str, Any] = {}
        if "name" in fields:
            if not str(fields["name"] or "").strip():
                raise AgentRuleError(_("An agent needs a name."), ("name",))
            changes["name"] = fields["name"].strip()
        for name in ("description", "system_prompt"):
            if name in fields:
                changes[name] = fields[name] or ""
        for name in ("temperature", "max_output_tokens"):
            if name in fields:
                changes[name] = fields[name]
        if "model" in fields:
            changes["model"] = (fields["model"] or "").strip()
        if "api_base" in fields:
            changes["api_base"] = parse_api_base(fields["api_base"])
        if agent.api_key and "api_key" not in fields and ("api_base" in fields or "model" in fields):
            new_model, new_base = changes.get("model", agent.model), changes.get("api_base", agent.api_base)
            if not await key_stays_with_its_endpoint(agent.model, agent.api_base, new_model, new_base):
                raise AgentRuleError(stored_key_elsewhere(agent.model, agent.api_base), ("apiKey",))
        if "model" in fields or "api_base" in fields:
            await self._check_model(changes.get("model", agent.model), changes.get("api_base", agent.api_base))
        if "api_key" in fields:
            changes["api_key"] = self.secrets.seal(fields["api_key"]) if fields["api_key"] else None
        tools = None
        if "tools" in fields:
            tools = parse_tools(fields["tools"])
            await self._check_allowed(agent_id, tools, allowed_loc(fields))
        async with self.db.session() as s:
            row = await agents_store.get_agent_by_slug(s, agent_id)
            if row is None:
                raise UnknownAgentError(_("There is no local agent {name!r}.").format(name=agent_id))
            await agents_store.update_agent(s, row, changes, tools)
        await self._told(agent_id, "updated")
        return await self.get(agent_id)

    async def delete(self, agent_id: str) -> Deleted:
        """Delete a local agent: its chats and audit records stay readable, marked "agent deleted".

        Raises:
            UnknownAgentError: no local agent with that id.
            AgentConflictError: it has running tasks (the message names them), or a chat turn runs on it.
        """
        async with self.db.session() as s:
            agent = await agents_store.get_agent_by_slug(s, agent_id)
            if agent is None:
                raise UnknownAgentError(_("There is no local agent {name!r}.").format(name=agent_id))
            running = list(
                (
                    await s.exec(
                        select(A2ATaskSession.id)
                        .where(
                            col(A2ATaskSession.state).in_([SUBMITTED, WORKING, INPUT_REQUIRED, AUTH_REQUIRED]),
                            (A2ATaskSession.callee_agent_id == agent.id) | (A2ATaskSession.caller_agent_id == agent.id),
                        )
                        .order_by(col(A2ATaskSession.created_at))
                    )
                ).all()
            )
            if running:
                raise AgentConflictError(
                    _("{name} has running tasks ({tasks}); wait until they end or stop them, then delete it.").format(
                        name=agent.name, tasks=", ".join(running)
                    )
                )
            # A chat answering with it, on any replica: its turn's draft is in the database from the turn's start.
            answering = (
                await running_turns_store.sessions_answering_with(s, agent_id=agent.id) if agent.id is not None else []
            )
            if answering:
                raise AgentConflictError(
                    _(
                        "{name} is answering in chats right now (running answers: {count}); wait until those "
                        "answers end or stop them, then delete it."
                    ).format(name=agent.name, count=format_number(len(answering)))
                )
            removed_from = await agents_store.delete_agent(s, agent)
        await self._told(agent_id, "deleted")
        return Deleted(agent_id, removed_from)

    # -- trying --------------------------------------------------------------------------

    async def try_model(
        self,
        fields: dict[str, Any],
        agent_id: str | None = None,
        prompt: str = TRY_PROMPT,
        *,
        user_id: int | None,
        multi_user: bool,
    ) -> TryResult:
        """Send one short prompt through the model the fields describe, for a user who may change agents.

        Nothing is saved. Missing fields come from the stored agent; its stored key too, unless the
        fields say `api_key`, and only when the base URL is the one the key was saved with.
        Returns its reply, or the provider's error in plain words.

        Raises:
            NotAllowedError: the user may not change agents (the reply of whatever address the form names, sent the
                agent's key, is not for everyone to read).
        """
        if not await self.may_change(user_id, multi_user=multi_user):
            raise NotAllowedError(_("Only admins may try an agent's model."))
        stored: Agent | None = None
        if agent_id:
            async with self.db.session() as s:
                stored = await agents_store.get_agent_by_slug(s, agent_id)
        model = (fields.get("model") or "").strip() or (stored.model if stored else self.default_model)
        try:
            api_base = parse_api_base(
                fields["api_base"] if "api_base" in fields else (stored.api_base if stored else None)
            )
        except AgentRuleError as exc:
            return TryResult(False, exc.message)
        problem = await model_problem(model, api_base=api_base)
        if problem is not None:
            return TryResult(False, problem[0].upper() + problem[1:] + ".")
        api_key = fields.get("api_key") or None
        if api_key is None and stored is not None and stored.api_key and "api_key" not in fields:
            if not await key_stays_with_its_endpoint(stored.model, stored.api_base, model, api_base):
                return TryResult(False, stored_key_elsewhere(stored.model, stored.api_base), field="apiKey")
            api_key = self.secrets.open(stored.api_key)
        system = fields.get("system_prompt") if "system_prompt" in fields else (stored.system_prompt if stored else "")
        messages = [*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": prompt}]
        text: list[str] = []
        try:
            async with asyncio.timeout(TRY_TIMEOUT_S):
                async for event in self.llm.stream(
                    model,
                    messages,
                    max_tokens=200,
                    api_base=api_base,
                    api_key=api_key,
                    temperature=fields.get("temperature"),
                ):
                    if hasattr(event, "tool_calls"):
                        text = [event.text or "".join(text)]
                    else:
                        text.append(event.text)
        except LLMError as exc:
            return TryResult(False, exc.message)
        except TimeoutError:
            return TryResult(False, f"The model {model!r} did not answer within {TRY_TIMEOUT_S:g} s.")
        reply = "".join(text).strip()
        return TryResult(True, reply or "(the model answered with no text)")

    # -- rules ---------------------------------------------------------------------------

    async def _check_id_free(self, slug: str) -> None:
        remote = self.registry.remote(slug)
        if remote is not None:
            message = (
                _("{id!r} is the id of a broker agent; choose another id.")
                if remote.kind == "ws"
                else _("{id!r} is the id of a remote HTTP agent; choose another id.")
            )
            raise AgentConflictError(message.format(id=slug), ("id",))
        async with self.db.session() as s:
            if await s.get(RemoteA2AAgent, slug) is not None:
                raise AgentConflictError(
                    _("{id!r} is the id of a registered remote HTTP agent; choose another id.").format(id=slug), ("id",)
                )

    async def _check_model(self, model: str, api_base: str | None) -> None:
        problem = await model_problem(model, api_base=api_base)
        if problem is not None:
            raise AgentRuleError(problem[0].upper() + problem[1:] + ".", ("model",))
        if api_base and not model.startswith(f"{DEMO_PROVIDER}/"):  # the demo model fetches nothing
            problem = await self.llm.api_base_problem(model, api_base)
            if problem is not None:
                raise AgentRuleError(_("This apiBase cannot be used: {reason}.").format(reason=problem), ("apiBase",))

    async def _check_allowed(self, slug: str, tools: dict[str, dict[str, Any]], loc: Loc) -> None:
        allowed = (tools.get(agents_store.AGENT_INVOKE) or {}).get("allowedAgents")
        if not allowed:
            return
        if slug in allowed:
            raise AgentRuleError(_("An agent cannot call itself; take its own id out of allowedAgents."), loc)
        known = {v.id for v in await self.list()}
        unknown = [a for a in allowed if a not in known]
        if unknown:
            raise AgentRuleError(
                _(
                    "allowedAgents names agents that do not exist: {ids} "
                    "(a broker agent must be connected to be named)."
                ).format(ids=", ".join(unknown)),
                loc,
            )
