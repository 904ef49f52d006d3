"""The A2A broker of seed 003.

Remote agents dial in over `/a2a`, chat systems dispatch over HTTP, progress
goes back as `inject_system_message` over Redis.

Modules: `wire` (line-delimited JSON-RPC and A2A shapes), `auth` (blacklist, JWT),
`connection` (one agent socket, also a registry `RemoteAgent`), `inject` (the
return path), `service` (the `Broker`), `reload` (config hot reload), `routes`.
"""

from core.broker.service import Broker

__all__ = ["Broker"]
