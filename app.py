"""The composition root and main command.

    python app.py                      start the app (HOST/PORT, default 127.0.0.1:3100)
    python app.py users add NAME       create an account (asks for the password; --admin: may change agents)
    python app.py users promote NAME   make an account an admin (the first account is one)
    python app.py users passwd NAME    change a password
    python app.py users list           list accounts
    python app.py migrate              upgrade the database and exit (a one-shot step before replicas start)

It reads settings, opens the database (running migrations), builds the
services, adds the routers to NiceGUI's app, registers the pages and calls
`ui.run`. Nothing here holds behaviour of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from urllib.parse import urlsplit

from core.settings import load_settings
from core.web.logtext import install_client_fault_filter, install_debug_detail_filter

ROOT = Path(__file__).resolve().parent
TITLE = "A2A Delegation Chat"
log = logging.getLogger("app")


def build(settings) -> object:
    """Build services, routes and pages on NiceGUI's app; returns the services."""
    from fastapi.exceptions import RequestValidationError
    from nicegui import app, ui

    from core.a2a.routes import a2a_api_router, a2a_router
    from core.a2a.routes import warm_up as warm_up_a2a
    from core.broker.routes import broker_router
    from core.chat.llm import warm_up
    from core.routes import api_router
    from core.services import Services
    from core.web.api_docs import add_api_docs
    from core.web.body_cap import BodyCapMiddleware
    from core.web.errors import install_error_handlers
    from core.web.full_collections import FullCollections
    from core.web.request_guards import RequestGuardMiddleware
    from core.web.schemas import validation_error_response
    from core.web.start_gate import StartGateMiddleware
    from ui import register_pages
    from ui.asgi_middlewares import use_pure_asgi_middlewares

    services = Services.build(settings)
    services.prepare()
    app.state.services = services
    add_api_docs(app, title=TITLE, description="The chat's REST API, the A2A endpoints and the broker.")
    public_origin = urlsplit(settings.base_url)
    app.add_middleware(
        RequestGuardMiddleware,
        trusted_hosts=settings.answering_hosts,
        trusted_origins=[f"{public_origin.scheme}://{public_origin.netloc}"],
    )
    # Bodies of the API and the broker's HTTP routes are capped before they are read whole (413); the A2A
    # JSON-RPC endpoints cap their own and answer in JSON-RPC (core/web/body_cap.py).
    app.add_middleware(
        BodyCapMiddleware, limit=settings.max_request_body_bytes, prefixes=("/api/", "/a2a/"), exempt=("/a2a/agents/",)
    )
    # Outermost: requests that arrive together start a few per pass of the event loop (core/web/start_gate.py).
    app.add_middleware(StartGateMiddleware)
    app.add_exception_handler(RequestValidationError, validation_error_response)
    install_error_handlers(app)  # API errors with a `code`, in the caller's Accept-Language
    app.include_router(api_router())
    app.include_router(a2a_router())  # /a2a/agents/{id}: standard A2A for every agent (issue 6)
    app.include_router(a2a_api_router())  # /api/a2a: API keys, remote agents by card URL
    app.include_router(broker_router())  # /a2a: the seed-003 broker
    app.add_static_files("/assets", str(ROOT / "assets"))
    ui.add_head_html('<link rel="stylesheet" href="/assets/app.css">', shared=True)
    ui.add_head_html('<script src="/assets/app.js" defer></script>', shared=True)  # scrolling, code blocks, Esc
    register_pages(services)
    # ui.run adds NiceGUI's middlewares after this: swap them for pure-ASGI ones before the first request,
    # and give API and A2A callers that bring no browser session none (ui/asgi_middlewares.py).
    app.on_startup(lambda: use_pure_asgi_middlewares(app, sessionless_prefixes=("/api/", "/a2a/")))
    app.on_startup(services.start)
    app.on_startup(lambda: stop_gracefully_on_stop_signals(services.stopping))
    app.on_startup(lambda: print_start_up_line(services, settings.base_url))
    app.on_startup(lambda: asyncio.get_running_loop().call_later(1.0, warm_up))
    app.on_startup(lambda: asyncio.get_running_loop().call_later(1.5, warm_up_a2a))
    app.on_startup(lambda: _start_soon(freeze_start_up_heap, 2.0))
    app.on_startup(share_the_gil_with_the_event_loop)

    def streams_live() -> bool:  # a hub buffer is being written: a turn, a delegation or a task streams
        return services.hub.live_streams() > 0

    # Full garbage collections between streams, not in the middle of them (core/web/full_collections.py).
    full_collections = FullCollections(busy=streams_live)
    app.on_startup(full_collections.start)
    app.on_shutdown(full_collections.stop)
    app.on_shutdown(services.stop)
    if settings.loop_probe:  # the capacity benchmark's event-loop probe; off unless LOOP_PROBE is set
        from core.web.loop_probe import LoopProbe

        probe = LoopProbe(busy=streams_live)  # "while streams run": the same test full collections wait for
        app.on_startup(probe.start)
        app.on_shutdown(probe.stop)
    return services


async def freeze_start_up_heap() -> None:
    """Once LiteLLM and the A2A SDK are loaded, move every object alive then out of the collector's sight.

    The start-up heap (LiteLLM alone is ~3,000 modules) is scanned by every full garbage
    collection, and a full collection runs on the event loop whenever enough objects
    survive: 200-300 ms during which no stream moves (docs/ARCHITECTURE.md, "The
    streaming hot path"). What start-up made lives as long as the process, so `gc.freeze()`
    lets the collector skip it; what turns create is still collected as before. LiteLLM
    builds much of itself on its first call, so one demo call (on this loop, like any turn)
    comes first.
    """
    import gc
    import importlib

    from core.chat.llm import LLMGateway, litellm_module

    await asyncio.to_thread(litellm_module)  # waits for the warm-up's import when it is still running
    await asyncio.to_thread(importlib.import_module, "core.a2a.server")
    async for _ in LLMGateway(demo_delay_s=0).stream("local/demo", [{"role": "user", "content": "/lorem 2"}]):
        pass
    gc.freeze()
    log.info("start-up heap frozen: %d objects left out of garbage collection", gc.get_freeze_count())


#: How soon a worker thread gives the event loop the GIL back (CPython's default is 5 ms).
GIL_SWITCH_INTERVAL_S = 0.001
#: Worker threads at once for `anyio.to_thread` (AnyIO's default is 40).
WORKER_THREADS = 4


def share_the_gil_with_the_event_loop() -> None:
    """Worker threads hold up the event loop less: they hand the GIL back sooner, and fewer run at once.

    At the end of every stream LiteLLM builds its usage figures in an AnyIO worker thread. With
    100 streams ending together, dozens of such threads started and took turns with the loop for
    the GIL, 5 ms at a time: the loop stood still for 20-50 ms (docs/ARCHITECTURE.md, "The
    streaming hot path"). Pure-Python work gains nothing from more threads than cores, and the
    file reads AnyIO also runs there are short. Called on the event loop (the limiter is per loop).
    """
    import sys

    import anyio.to_thread

    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    anyio.to_thread.current_default_thread_limiter().total_tokens = WORKER_THREADS


_start_up_tasks: set[asyncio.Task] = set()


def _start_soon(coro_fn: Callable[[], Coroutine[object, object, None]], delay_s: float) -> None:
    """Run `coro_fn()` as a task `delay_s` after now (the task is kept until it ends)."""
    loop = asyncio.get_running_loop()

    def start() -> None:
        task = loop.create_task(coro_fn())
        _start_up_tasks.add(task)
        task.add_done_callback(_start_up_tasks.discard)

    loop.call_later(delay_s, start)


def serve(settings) -> None:
    """Run the web app until Ctrl+C or SIGTERM, then exit with code 0."""
    from nicegui import ui

    from core.services import StartupRefused
    from core.web.connections import ConnectionLimits, guarded_http_protocol, raise_open_files_limit

    try:
        build(settings)
    except StartupRefused as exc:
        sys.exit(f"error: {exc}")
    if threading.current_thread() is threading.main_thread():
        leave_stop_signals_to_the_server()
    raise_open_files_limit()
    # Slow and greedy clients (core/web/connections.py): a deadline for request headers, a cap per address.
    limits = ConnectionLimits(
        header_timeout_s=settings.http_header_timeout_s,
        max_per_address=settings.max_connections_per_address,
        uncapped=settings.trusted_proxies,
    )
    ui.run(
        host=settings.host,
        port=settings.port,
        title=TITLE,
        reload=False,
        show=False,
        storage_secret=settings.ensure_storage_secret(),
        # Another site's requests carry no login (core/web/request_guards.py refuses their changes besides).
        session_middleware_kwargs={"same_site": "lax", "https_only": settings.base_url.startswith("https://")},
        show_welcome_message=False,
        # X-Forwarded-For is believed only from the configured proxies (uvicorn trusts 127.0.0.1 by default).
        proxy_headers=bool(settings.trusted_proxies),
        forwarded_allow_ips=",".join(settings.trusted_proxies) or None,
        http=guarded_http_protocol(limits),
        favicon="🤖",
        # Phones: the on-screen keyboard shrinks the layout, so the fixed input bar stays above it (issue 14).
        viewport="width=device-width, initial-scale=1, interactive-widget=resizes-content",
        # Seed 003 heartbeat: a WebSocket ping every broker_heartbeat_interval; a peer whose pong has not come
        # within broker_pong_timeout is dropped (a half-open agent is noticed after at most the sum of both).
        ws_ping_interval=settings.broker_heartbeat_interval / 1000,
        ws_ping_timeout=settings.broker_pong_timeout / 1000,
        ws_max_size=max(16 * 1024 * 1024, settings.broker_max_line_bytes * 4),
    )


def migrate_command(settings) -> int:
    """`migrate`: bring the schema to head (under PostgreSQL's migration lock, so replicas starting meanwhile wait)."""
    from core.db import Database
    from core.services import describe_database

    try:
        Database(settings.database).migrate()
    except Exception as exc:  # the driver's errors: unreachable server, missing rights, ...
        print(f"error: could not migrate {describe_database(settings.database)}: {exc}", file=sys.stderr)
        return 2
    print(f"the database is at the newest schema: {describe_database(settings.database)}")
    return 0


def users_command(settings, args: argparse.Namespace) -> int:
    """`users add|passwd|list|promote`."""
    from core.auth import accounts
    from core.db import Database

    db = Database(settings.database)
    db.migrate()

    async def run() -> int:
        try:
            async with db.session() as s:
                if args.action == "list":
                    for user in await accounts.list_users(s):
                        kind = "password" if user.password_hash else "single-user mode"
                        print(f"{user.username}\t{kind}" + ("\tadmin" if user.is_admin else ""))
                    return 0
                if args.action == "promote":
                    await accounts.promote(s, username=args.name)
                    print(f"{args.name!r} is an admin: may create, change and delete agents")
                    return 0
                password = os.environ.get("APP_USER_PASSWORD") or _ask_password()
                if args.action == "add":
                    user = await accounts.create_user(s, username=args.name, password=password, admin=args.admin)
                    role = " (admin)" if user.is_admin else ""
                    print(f"created user {args.name!r}{role}; restart the app to switch to multi-user mode")
                else:
                    await accounts.set_password(s, username=args.name, password=password)
                    print(f"changed the password of {args.name!r}")
                return 0
        except accounts.AccountError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        finally:
            await db.close()

    return asyncio.run(run())


def print_start_up_line(services, base_url: str) -> None:
    """What the person who started the app reads first, in the language of their shell (`LANG`)."""
    from core.i18n import _, negotiate, use_language

    shell_language = os.environ.get("LC_ALL") or os.environ.get("LC_MESSAGES") or os.environ.get("LANG")
    with use_language(negotiate(shell_language)):
        print(f"{TITLE}: {services.describe()}\n" + _("Open {url}").format(url=base_url), flush=True)


def _describe_settings_error(exc: ValueError) -> str:
    """One line per bad setting: its name and what is wrong."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return f"  {exc}"
    return "\n".join(
        f"  {'.'.join(str(part) for part in e['loc'])}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()
    )


def _ask_password() -> str:
    first = getpass.getpass("Password: ")
    if getpass.getpass("Repeat: ") != first:
        raise SystemExit("error: the passwords differ")
    return first


# `DEBUG` names what to log in detail, as seed 003's `DEBUG=a2a-broker` does; these names are ours.
DEBUG_NAMESPACES = {"a2a-broker": "core.broker", "a2a-chat": "core", "a2a-pipe": "core.pipe"}


def configure_logging(debug: str | None) -> None:
    """INFO everywhere; DEBUG for the comma-separated namespaces in `debug` (any other value: everything)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    install_client_fault_filter()
    install_debug_detail_filter()
    names = [n.strip() for n in (debug or "").split(",") if n.strip()]
    if names and all(n in DEBUG_NAMESPACES for n in names):
        for name in names:
            logging.getLogger(DEBUG_NAMESPACES[name]).setLevel(logging.DEBUG)
    elif names and debug.strip().lower() not in {"0", "false", "no", "off"}:
        logging.getLogger().setLevel(logging.DEBUG)


def exit_quietly_on_stop_signals() -> None:
    """Until the server runs, Ctrl+C and SIGTERM end the process at once, with code 0 and no traceback."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def leave_stop_signals_to_the_server() -> None:
    """Ignore Ctrl+C and SIGTERM outside the server: once it runs, the server handles them.

    When uvicorn has shut down it restores the handlers it found and raises the signal again,
    which by default kills the process by SIGTERM (exit code 143) or raises `KeyboardInterrupt`
    inside its event loop. Ignored there, the signal has done its work: `ui.run` returns and the
    process ends with code 0.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def stop_gracefully_on_stop_signals(on_first_signal: Callable[[], None] = lambda: None) -> None:
    """While serving (called at start-up, on the server's loop): every stop signal asks for one graceful stop.

    `on_first_signal` runs at once, before the server closes its connections (the services then
    know that a closing socket means the app is stopping, not that a peer went away).

    uvicorn's own handler turns a second Ctrl+C into a forced exit that skips the shutdown of
    the services (running turns are not saved) and prints the tracebacks of the requests it
    abandons. Here the second signal only says that the app is stopping; a third one stops the
    process at once, without a traceback.
    """
    from nicegui.server import Server

    server = getattr(Server, "instance", None)  # None under NiceGUI's User fixture: no server, no signals
    if server is None or threading.current_thread() is not threading.main_thread():
        return
    received = 0

    def on_stop_signal(signum: int, frame: object) -> None:
        nonlocal received
        received += 1
        if received == 1:
            on_first_signal()
            server.handle_exit(signal.SIGTERM, None)  # graceful, whichever signal it was
        elif received == 2:
            print(
                "Stopping: saving running turns and closing open streams. "
                "Press Ctrl+C again to stop at once (running turns will not be saved).",
                flush=True,
            )
        else:
            print("Stopped at once.", flush=True)
            os._exit(1)

    signal.signal(signal.SIGINT, on_stop_signal)
    signal.signal(signal.SIGTERM, on_stop_signal)


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and run the app or a command."""
    try:
        settings = load_settings()
    except ValueError as exc:  # pydantic's ValidationError, or a config file that is not JSON
        sys.exit(
            f"error: the settings are not valid; fix the environment, .env or config/server.json:\n"
            f"{_describe_settings_error(exc)}"
        )
    # NiceGUI keeps per-browser storage on disk; keep it beside the database.
    os.environ.setdefault("NICEGUI_STORAGE_PATH", str(settings.data_dir / ".nicegui"))
    if settings.cluster and settings.redis.dsn:  # replicas share browser storage (docs/ARCHITECTURE.md, "Cluster")
        os.environ.setdefault("NICEGUI_REDIS_URL", settings.redis.dsn)
        os.environ.setdefault("NICEGUI_REDIS_KEY_PREFIX", f"{settings.redis.key_prefix}nicegui:")
    configure_logging(settings.debug)

    from nicegui import helpers

    if helpers.is_user_simulation():  # NiceGUI's User fixture runs this file; it only needs the app built
        build(settings)
        from nicegui import ui

        ui.run(storage_secret=settings.ensure_storage_secret())
        return

    parser = argparse.ArgumentParser(prog="python app.py", description="A2A delegation chat and hub.")
    commands = parser.add_subparsers(dest="command")
    users = commands.add_parser("users", help="manage accounts")
    users_actions = users.add_subparsers(dest="action", required=True)
    add = users_actions.add_parser("add", help="create an account")
    add.add_argument("name")
    add.add_argument("--admin", action="store_true", help="may create, change and delete agents")
    users_actions.add_parser("promote", help="make an account an admin").add_argument("name")
    users_actions.add_parser("passwd", help="change a password").add_argument("name")
    users_actions.add_parser("list", help="list accounts")
    commands.add_parser("migrate", help="upgrade the database schema and exit (run once before the replicas)")
    args = parser.parse_args(argv)
    if args.command == "users":
        sys.exit(users_command(settings, args))
    if args.command == "migrate":
        sys.exit(migrate_command(settings))
    serve(settings)


if __name__ in {"__main__", "__mp_main__"}:
    if "NICEGUI_USER_SIMULATION" not in os.environ:  # NiceGUI's User fixture runs this file inside pytest
        exit_quietly_on_stop_signals()
    main()
