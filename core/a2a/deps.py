"""Standard A2A's services as FastAPI dependencies, for the routes that use them (ground floor: `core.auth.deps`)."""

from __future__ import annotations

import asyncio
import importlib
import threading
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request, Response

from core.a2a.api_keys import ApiKeys
from core.a2a.remote_agents import RemoteAgentDirectory
from core.auth.deps import get_services

_server_lock = threading.Lock()


class A2AEndpoints(Protocol):
    """What the routes ask of the JSON-RPC server (`core.a2a.server.A2AServer`, not imported here: see below)."""

    async def card_response(self, agent_id: str, request: Request) -> Response:
        """The agent's card."""
        ...

    async def root_card_response(self, request: Request) -> Response:
        """The default agent's card."""
        ...

    async def rpc_response(self, agent_id: str, request: Request) -> Response:
        """One JSON-RPC call to the agent."""
        ...

    async def rest_response(self, agent_id: str, request: Request) -> Response:
        """One HTTP+JSON call to the agent."""
        ...


async def get_api_keys(request: Request) -> ApiKeys:
    """Users' API keys for A2A callers."""
    keys: ApiKeys = get_services(request).api_keys
    return keys


async def get_remote_agents(request: Request) -> RemoteAgentDirectory:
    """Remote A2A agents registered by card URL."""
    remote_agents: RemoteAgentDirectory = get_services(request).remote_agents
    return remote_agents


async def get_a2a_server(request: Request) -> A2AEndpoints:
    """The JSON-RPC server (`core.a2a.server.A2AServer`), built on first use."""
    server: A2AEndpoints = await a2a_server(get_services(request))
    return server


async def a2a_server(services: Any) -> Any:
    """The A2A server of these services, built on first use (For internal use only.).

    Its import (the a2a-sdk) is kept off the path to the first page, so the type is not named here.
    """
    if services.a2a_server is None:
        module = await asyncio.to_thread(importlib.import_module, "core.a2a.server")
        with _server_lock:
            if services.a2a_server is None:
                services.a2a_server = module.A2AServer(services)
    return services.a2a_server


ApiKeysDep = Annotated[ApiKeys, Depends(get_api_keys)]
RemoteAgentsDep = Annotated[RemoteAgentDirectory, Depends(get_remote_agents)]
A2AServerDep = Annotated[A2AEndpoints, Depends(get_a2a_server)]
