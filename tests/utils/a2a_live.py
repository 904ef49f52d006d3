"""Helpers for the A2A tests: the app's routes on a live server, an API key, the official a2a-sdk client."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types import AgentCard, Message, Part, Role, SendMessageRequest
from fastapi import FastAPI

from core.a2a.routes import a2a_api_router, a2a_router
from core.routes import api_router
from core.services import Services
from core.web.errors import install_error_handlers
from tests.conftest import make_settings
from tests.utils.live_server import live_server, services_app
from tests.utils.ports import free_port


def build_a2a_app(services: Services) -> FastAPI:
    """The REST API plus the A2A routes, with the services' lifespan."""
    return services_app(services, api_router(), a2a_router(), a2a_api_router())


@dataclass(slots=True)
class LiveApp:
    """A running app: its URL, its services and an API key of the `local` user."""

    url: str
    services: Services
    key: str

    def agent_url(self, agent_id: str) -> str:
        """The agent's A2A base URL (its card is below it)."""
        return f"{self.url}/a2a/agents/{agent_id}"


def create_key(url: str, name: str = "tests") -> str:
    """A new API key, made through the API (single-user mode needs no login)."""
    response = httpx.post(f"{url}/api/a2a/keys", json={"name": name}, timeout=10)
    response.raise_for_status()
    return response.json()["key"]


@contextmanager
def live_a2a_app(
    tmp_path: Path, *, data_dir: Path | None = None, port: int | None = None, error_codes: bool = False, **settings
) -> Iterator[LiveApp]:
    """Serve the app on a free port whose URL is also its `PUBLIC_BASE_URL` (the cards' absolute URLs).

    With `error_codes` the API's errors carry their `code`, as app.py serves them (`install_error_handlers`).
    """
    port = port or free_port()
    values = {
        "database_url": f"sqlite:///{(data_dir or tmp_path / 'data') / 'app.db'}",
        "public_base_url": f"http://127.0.0.1:{port}",
        "port": port,
        **settings,
    }
    services = Services.build(make_settings(tmp_path, **values))
    services.prepare()
    served = build_a2a_app(services)
    if error_codes:
        install_error_handlers(served)
    with live_server(served, port=port) as url:
        yield LiveApp(url=url, services=services, key=create_key(url))


@asynccontextmanager
async def sdk_client(
    agent_url: str,
    key: str | None,
    *,
    streaming: bool = True,
    only_v03: bool = False,
    on_request: Callable[[httpx.Request], None] | None = None,
) -> AsyncIterator[tuple[Client, AgentCard]]:
    """The official client for an agent, from its resolved card.

    Args:
        agent_url: the agent's base URL.
        key: the API key to send, if any.
        streaming: whether the client streams.
        only_v03: keep only the card's 0.3 interface (the SDK then uses its compat transport).
        on_request: sees every JSON-RPC request the client sends.
    """
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def record(request: httpx.Request) -> None:
        if on_request is not None and request.method == "POST":
            on_request(request)

    async with httpx.AsyncClient(headers=headers, timeout=30, event_hooks={"request": [record]}) as http:
        card = await A2ACardResolver(http, agent_url).get_agent_card()
        if only_v03:
            keep = [i for i in card.supported_interfaces if i.protocol_version == "0.3"]
            del card.supported_interfaces[:]
            card.supported_interfaces.extend(keep)
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=streaming)).create(card)
        try:
            yield client, card
        finally:
            await client.close()


def user_message(text: str) -> SendMessageRequest:
    """A `SendMessage` request with one text part."""
    message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[Part(text=text)])
    return SendMessageRequest(message=message)


def rpc(
    url: str,
    key: str | None,
    method: str,
    params: dict | None = None,
    *,
    version: str | None = "1.0",
    request_id: str = "r1",
) -> httpx.Response:
    """A raw JSON-RPC POST (for the bad-input cases the SDK client would never send)."""
    headers = {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if version:
        headers["A2A-Version"] = version
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}
    return httpx.post(url, json=body, headers=headers, timeout=10)
