"""Standard A2A (issue 6): every agent served over A2A JSON-RPC, remote A2A agents called over HTTP.

Owns: the A2A wire (`protocol/`, the only package that knows the a2a-sdk), the JSON-RPC server
and task store for every agent in the registry (`server.py`), the HTTP client adapter for remote
agents (`client.py`), the routes `/a2a/agents/{id}` and `/api/a2a/...` (`routes.py`), API keys
for A2A callers (`api_keys.py`), remote agents registered by card URL (`remote_agents.py`) and the
policy for every URL others name (`outbound.py`).

v0.3: served and spoken by the a2a-sdk's own compat layer, switched on at the edge
(`protocol.jsonrpc.create_dispatcher`, the client factory); none of our code translates v0.3. A
translation of our own would go in `core/a2a/compat/v0_3/`, as a2a-python keeps it.

May import: `core.delegation`, `core.chat`, `core.streaming`, `core.auth`, `core.web`, the
ground floor and `models`. `protocol`, `server` and `client` import the a2a-sdk (about 0.2 s),
so they are imported lazily (`routes.a2a_server`, `remote_agents`), never on the path to the
first page: this file exports only what is light.
"""

from core.a2a.remote_agents import RegistrationError, RemoteAgentDirectory
from core.a2a.routes import a2a_api_router, a2a_router

__all__ = ["RegistrationError", "RemoteAgentDirectory", "a2a_api_router", "a2a_router"]
