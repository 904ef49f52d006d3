"""Remote A2A agents registered by the URL of their card: kept in `a2a_remote_agents`, live in the registry.

`register` fetches and checks the card, claims the id in `AgentRegistry`
and saves the registration, in that order; when a step fails, the steps
before it are undone, so a failed registration leaves nothing behind. On
start, `restore` puts every saved registration back into the registry from
its stored card, without calling the remote agent (it may be down; a call
then fails with its reason, as a delegation error).

Cards and calls go through the outbound policy (`core/a2a/outbound.py`): only
public addresses, or those in `OUTBOUND_ALLOW_HOSTS`. A bearer token goes
only to the card's origin, so a card whose endpoint is on another origin is
refused when a token is given (the calls would go without it, or the token
would follow the card to wherever it points).

The SDK-based adapter (`core/a2a/client.py`) is imported on first use, off
the path to the first page.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import httpx
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from core.a2a import outbound
from core.a2a.remote_push import RemotePushWaits
from core.chat.agents import SLUG_PATTERN
from core.db import Database
from core.delegation.registry import AgentRegistry, IdTakenError
from core.errors import AppError
from core.secret_box import SecretBox, SecretUnreadableError
from core.settings import Settings
from core.web.outbound_policy import AllowList, OutboundError, checked_addresses

if TYPE_CHECKING:  # the client imports the a2a-sdk (about 0.2 s): loaded lazily at run time
    from core.a2a.client import HttpRemoteAgent
from models import RemoteA2AAgent

log = logging.getLogger(__name__)

REMOTE_AGENT = "remote-agent"  # the kind of registry notice this module sends and applies (core/db_events.py)


class RegistrationError(AppError, ValueError):
    """A remote agent that cannot be registered; `status_code` for the API, the message for people."""

    code = "registration_error"

    status_code = 422


class RegistrationConflictError(RegistrationError):
    """The id is taken (a local agent, or another remote agent)."""

    code = "registration_conflict"

    status_code = 409


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteAgentView:
    """A registered remote agent as the API and the UI show it."""

    id: str
    name: str
    description: str
    card_url: str
    url: str | None
    protocol_version: str | None
    streaming: bool
    skills: list[dict[str, Any]]
    online: bool
    owner_id: int | None = None  # who registered it: only they change or remove it (None: registered before owners)


class NotYourAgentError(RegistrationError):
    """A registration someone else made: every user may delegate to it, only its owner removes it."""

    code = "not_your_agent"

    status_code = 403


class RemoteAgentDirectory:
    """Registrations of remote HTTP A2A agents, and their adapters in the registry."""

    def __init__(
        self, db: Database, registry: AgentRegistry, settings: Settings, secrets: SecretBox | None = None
    ) -> None:
        self.db = db
        self.registry = registry
        self.settings = settings
        self._secrets = secrets
        #: Remote tasks that end by push to this app (`A2A_REMOTE_PUSH`), and the webhook's work.
        self.push = RemotePushWaits(db, settings)
        # Cluster mode: tells the other replicas a registration came or went (`core.db_events`, "remote-agent").
        self.notify: Callable[[str, str, str], Awaitable[None]] | None = None

    @property
    def secrets(self) -> SecretBox:
        """The box that seals bearer tokens (its key file is made on first use, not when the services are built)."""
        if self._secrets is None:
            self._secrets = SecretBox.for_data_dir(self.settings.data_dir, self.settings.secret_key)
        return self._secrets

    def _allow(self) -> AllowList:
        return AllowList.parse(self.settings.outbound_allow_hosts)

    async def register(
        self, card_url: str, *, agent_id: str | None = None, bearer_token: str | None = None, user_id: int | None = None
    ) -> RemoteAgentView:
        """Fetch the card, add the agent to the registry and save the registration.

        Args:
            card_url: the card's URL (…/.well-known/agent-card.json) or the agent's base URL.
            agent_id: the id to use; default: made from the card's name.
            bearer_token: sent to the remote agent on every call, if it needs one.
            user_id: who registers it.

        Raises:
            RegistrationError: the card cannot be fetched or used, its endpoint is not allowed or (with a token)
                is on another origin than the card, or the id is malformed.
            RegistrationConflictError: the id is taken.
        """
        client = await _client_module()
        card_url = card_url.strip()
        allow = self._allow()
        try:
            card = await client.fetch_card(card_url, allow=allow, bearer_token=bearer_token)
        except client.wire.CardError as exc:
            raise RegistrationError(str(exc)) from None
        await _check_endpoint(client.wire.endpoint_url(card), card_url, allow=allow, with_token=bool(bearer_token))
        agent_id = (agent_id or "").strip() or slug_from_name(card.name)
        if not SLUG_PATTERN.fullmatch(agent_id):
            raise RegistrationError(
                f"{agent_id!r} cannot be an agent id: use 1-64 lowercase letters, digits, "
                "'-' or '_', starting with a letter or digit."
            )
        agent = client.HttpRemoteAgent(
            agent_id=agent_id, card=card, card_url=card_url, allow=allow, bearer_token=bearer_token, push=self.push
        )
        try:
            await self.registry.claim(agent)
        except IdTakenError as exc:
            await agent.aclose()
            raise RegistrationConflictError(f"Cannot register {card.name!r} as {agent_id!r}: {exc}.") from exc
        try:
            async with self.db.session() as s:
                s.add(
                    RemoteA2AAgent(
                        id=agent_id,
                        card_url=card_url,
                        card=client.wire.card_to_storage(card),
                        bearer_token=self.secrets.seal(bearer_token) if bearer_token else None,
                        created_by=user_id,
                    )
                )
                await s.commit()
        except IntegrityError as exc:
            await self._drop(agent_id, agent)
            raise RegistrationConflictError(f"A remote agent is already registered as {agent_id!r}.") from exc
        except BaseException:
            await self._drop(agent_id, agent)
            raise
        log.info("registered remote A2A agent %s from %s", agent_id, outbound.shorten(card_url))
        if self.notify is not None:
            await self.notify(REMOTE_AGENT, agent_id, "registered")
        return _view(agent, user_id)

    async def unregister(self, agent_id: str, user_id: int | None = None) -> bool:
        """Remove a registration and its agent from the registry; False when there is none.

        Raises:
            NotYourAgentError: `user_id` is given and another user registered it.
        """
        async with self.db.session() as s:
            row = await s.get(RemoteA2AAgent, agent_id)
            if row is None:
                return False
            if user_id is not None and row.created_by is not None and row.created_by != user_id:
                raise NotYourAgentError(f"@{agent_id} was registered by another user; only they can remove it.")
            await s.delete(row)
            await s.commit()
        agent = self.registry.remote(agent_id)
        if agent is not None and getattr(agent, "kind", None) == "http":
            await self._drop(agent_id, agent)
        if self.notify is not None:
            await self.notify(REMOTE_AGENT, agent_id, "removed")
        return True

    async def sync(self, agent_id: str, _op: str = "") -> None:
        """Another replica registered or removed `agent_id`: make this registry match the database."""
        async with self.db.session() as s:
            row = await s.get(RemoteA2AAgent, agent_id)
        current = self.registry.remote(agent_id)
        if row is None:
            if current is not None and getattr(current, "kind", None) == "http":
                await self._drop(agent_id, current)
            return
        if current is None:
            await self._restore_row(row, await _client_module(), self._allow())

    async def sync_all(self) -> None:
        """Make every registration match the database (after notices may have been missed)."""
        async with self.db.session() as s:
            saved = set((await s.exec(select(RemoteA2AAgent.id))).all())
        here = {a.id for a in self.registry.remote_agents() if getattr(a, "kind", None) == "http"}
        for agent_id in sorted(saved ^ here):
            await self.sync(agent_id)

    async def list(self) -> list[RemoteAgentView]:
        """Every registration, by id (`online`: in the registry and reachable).

        Reachability is what the agent's last call said, or a check of its card when that is
        older than `REACHABILITY_MAX_AGE_S` (made here, all agents at once, a few seconds at most).
        """
        async with self.db.session() as s:
            rows = list((await s.exec(select(RemoteA2AAgent).order_by(col(RemoteA2AAgent.id)))).all())
        # 'http' agents are the client's (`core/a2a/client.py`), imported only once one is registered.
        http_agents = [
            cast("HttpRemoteAgent", a)
            for a in (self.registry.remote(r.id) for r in rows)
            if getattr(a, "kind", None) == "http"
        ]
        await asyncio.gather(*(a.check_reachable() for a in http_agents))
        views = []
        for row in rows:
            agent = self.registry.remote(row.id)
            if agent is not None and getattr(agent, "kind", None) == "http":
                views.append(_view(agent, row.created_by))
            else:
                summary = row.card or {}
                views.append(
                    RemoteAgentView(
                        id=row.id,
                        name=str(summary.get("name") or row.id),
                        description=str(summary.get("description") or ""),
                        card_url=row.card_url,
                        url=None,
                        protocol_version=None,
                        streaming=False,
                        skills=[],
                        online=False,
                        owner_id=row.created_by,
                    )
                )
        return views

    async def seal_stored_tokens(self) -> int:
        """Encrypt the bearer tokens saved before they were encrypted; returns how many (at start: makes the key)."""
        box = self.secrets
        async with self.db.session() as s:
            rows = list(await s.exec(select(RemoteA2AAgent).where(col(RemoteA2AAgent.bearer_token).is_not(None))))
            plain = [
                (row, token) for row in rows if (token := row.bearer_token) is not None and not box.is_sealed(token)
            ]
            for row, token in plain:
                row.bearer_token = box.seal(token)
                s.add(row)
            await s.commit()
        return len(plain)

    async def restore(self) -> int:
        """Put every saved registration back into the registry; returns how many joined."""
        async with self.db.session() as s:
            rows = list((await s.exec(select(RemoteA2AAgent).order_by(col(RemoteA2AAgent.id)))).all())
        if not rows:
            return 0
        client = await _client_module()
        allow = self._allow()
        joined = 0
        for row in rows:
            joined += await self._restore_row(row, client, allow)
        waiting = await self.push.resume(self.registry)  # tasks that end by push, cut off by the last stop
        if waiting:
            log.info("%d delegated tasks wait for their remote agents' push again", waiting)
        return joined

    async def _restore_row(self, row: RemoteA2AAgent, client: ModuleType, allow: AllowList) -> bool:
        """Put one saved registration into the registry; False when it cannot be (the log says why)."""
        try:
            card = client.wire.card_from_json(row.card)
        except client.wire.CardError as exc:
            log.warning("remote agent %s is not restored: %s (register it again)", row.id, exc)
            return False
        try:
            token = self.secrets.open(row.bearer_token) if row.bearer_token else None
        except SecretUnreadableError as exc:
            log.warning("remote agent %s is not restored: its bearer token: %s", row.id, exc)
            return False
        endpoint = client.wire.endpoint_url(card)
        if token and endpoint and outbound.origin(endpoint) != outbound.origin(row.card_url):
            log.warning(
                "remote agent %s: its endpoint is on another origin than its card, so its bearer token "
                "is not sent (register it again from the endpoint's origin)",
                row.id,
            )
        agent = client.HttpRemoteAgent(
            agent_id=row.id, card=card, card_url=row.card_url, allow=allow, bearer_token=token, push=self.push
        )
        try:
            await self.registry.claim(agent)
        except IdTakenError as exc:
            await agent.aclose()
            log.warning("remote agent %s is not restored: %s", row.id, exc)
            return False
        return True

    async def close(self) -> None:
        """Release every HTTP agent from the registry and close its connections (tasks waiting for a push stay so)."""
        await self.push.close()
        for agent in self.registry.remote_agents():
            if getattr(agent, "kind", None) == "http":
                await self._drop(agent.id, agent)

    async def _drop(self, agent_id: str, agent: Any) -> None:
        await self.registry.release(agent_id, agent)
        await agent.aclose()


async def _check_endpoint(endpoint: str | None, card_url: str, *, allow: AllowList, with_token: bool) -> None:
    """Refuse a card whose endpoint the policy does not allow, or that is on another origin when a token is given.

    Raises:
        RegistrationError: which, and what to do.
    """
    if endpoint is None:  # card_from_fetched has made sure there is one
        return
    if with_token and outbound.origin(endpoint) != outbound.origin(card_url):
        raise RegistrationError(
            f"The card's endpoint ({outbound.shorten(endpoint, 80)}) is on another origin than the card; the bearer "
            "token is sent only to the card's origin. Register the agent by a card URL on its endpoint's origin, "
            "or without a token if it needs none."
        )
    try:
        await checked_addresses(httpx.URL(endpoint), allow)
    except (OutboundError, httpx.InvalidURL) as exc:
        category = exc.category if isinstance(exc, OutboundError) else "not a valid URL"
        raise RegistrationError(f"The card's endpoint cannot be called: {category}.") from None


def slug_from_name(name: str) -> str:
    """A registry id from a card's name: `Weather Agent` → `weather-agent`."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:64].strip("-")
    return slug or "remote-agent"


def _view(agent: Any, owner_id: int | None) -> RemoteAgentView:
    info = agent.card()
    return RemoteAgentView(
        id=agent.id,
        name=agent.name,
        description=agent.description,
        card_url=agent.card_url,
        url=info.get("url"),
        protocol_version=info.get("protocolVersion"),
        streaming=bool(info.get("streaming")),
        skills=list(info.get("skills") or []),
        online=agent.reachable,
        owner_id=owner_id,
    )


async def _client_module() -> ModuleType:
    # The SDK import takes ~0.2 s: keep it off the event loop.
    return await asyncio.to_thread(importlib.import_module, "core.a2a.client")
