"""Everything that is not a page: one package per concern, plus the few modules every package shares.

    settings.py, db.py, secret_box.py   the ground floor: typed settings, the database, secrets at rest
    web/         the HTTP edge every router shares: request bodies, limits on input, host and origin guards, /docs
    streaming/   the stream hub, SSE, seed 002's task events, background tasks
    auth/        accounts and logins; who is asking (the routers' dependencies)
    chat/        a chat turn: engine, model gateway, demo model, tools, agents and sessions stores, pages' facade
    delegation/  agent_invoke: task records, running local and remote callees, the one agent registry
    a2a/         standard A2A: wire protocol (a2a-sdk), JSON-RPC server, HTTP client, API keys, remote agents by card
    broker/      seed 003's broker under /a2a, and the app's chat as one of its chat systems
    services.py  builds and starts/stops all of the above (the composition); routes.py: the `/api` router
    pipe.py      agent side: `python -m core.pipe` (stands alone: no import of the rest of `core`)

Imports go one way, from a package in this list to the ones above it, never back; `streaming` and
`web` import none of the others. `lint-imports` checks this (contracts in pyproject.toml), and
docs/ARCHITECTURE.md describes the parts and the paths between them.

This file imports nothing, so `python -m core.pipe` stays light.
"""
