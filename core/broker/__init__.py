"""The A2A broker of seed 003.

Remote agents dial in over `/a2a`, chat systems dispatch over HTTP, progress
goes back as `inject_system_message` over Redis.

Modules: `wire` (line-delimited JSON-RPC and A2A shapes), `auth` (blacklist, JWT),
`connection` (one agent socket, also a registry `RemoteAgent`), `inject` (the
return path), `store` (tasks and their results in the database, so a stop loses
none), `service` (the `Broker`), `reload` (config hot reload), `routes`; and the
app's own chat as a chat system: `tools` (the `a2a_<id>` tools) and `inbox`
(injects back into the chat sessions). In cluster mode (docs/ARCHITECTURE.md,
"Cluster: the broker across replicas"): `cluster` (the agent directory in
Redis) and `replicas` (forwarding to the replica that holds an agent).

It may import `delegation`, `chat` and everything below them (the contracts in
pyproject.toml); within `core` only `services` and `routes` import it.
"""

from core.broker.service import Broker

__all__ = ["Broker"]
