"""The composition root and main command.

    python app.py                      start the app (HOST/PORT, default 127.0.0.1:3100)
    python app.py users add NAME       create an account (asks for the password; --admin: may change agents)
    python app.py users promote NAME   make an account an admin (the first account is one)
    python app.py users passwd NAME    change a password
    python app.py users list           list accounts
    python app.py migrate              upgrade the database and exit (a one-shot step before replicas start)

It reads settings, opens the database (running migrations), builds the
services, adds the routers to NiceGUI's app, registers the pages and calls
`ui.run`. Nothing here holds behaviour of its own: the other commands are in
core/cli.py, the process's tuning (logging, signals, heap, threads) in core/process.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from core.cli import load_settings_or_exit, parse_args, run_command
from core.process import (
    configure_logging,
    configure_process,
    exit_quietly_on_stop_signals,
    freeze_start_up_heap,
    prepare_to_serve,
    share_the_gil_with_the_event_loop,
    start_soon,
    stop_gracefully_on_stop_signals,
)
from core.settings import Settings

if TYPE_CHECKING:
    from core.services import Services

__all__ = ["build", "configure_logging", "main", "print_start_up_line", "serve"]

ROOT = Path(__file__).resolve().parent
TITLE = "A2A Delegation Chat"


def build(settings: Settings) -> Services:
    """Build services, routes and pages on NiceGUI's app; returns the services."""
    from fastapi.exceptions import RequestValidationError
    from nicegui import app, ui

    from core.a2a.routes import a2a_api_router, a2a_router
    from core.a2a.routes import warm_up as warm_up_a2a
    from core.broker.routes import broker_router
    from core.chat.attachment_routes import UPLOAD_FRAMING_BYTES, upload_path_pattern
    from core.chat.llm import warm_up
    from core.routes import api_router, metrics_router
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
    from ui.frame import stored_dark_mode

    services = Services.build(settings)
    services.prepare()
    app.state.services = services
    add_api_docs(
        app,
        title=TITLE,
        description="The chat's REST API, the A2A endpoints and the broker.",
        dark_mode=stored_dark_mode,  # /docs in the pages' theme
    )
    public_origin = urlsplit(settings.base_url)
    app.add_middleware(
        RequestGuardMiddleware,
        trusted_hosts=settings.answering_hosts,
        trusted_origins=[f"{public_origin.scheme}://{public_origin.netloc}"],
    )
    # Bodies of the API and the broker's HTTP routes are capped before they are read whole (413); the A2A
    # JSON-RPC endpoints cap their own and answer in JSON-RPC (core/web/body_cap.py).
    app.add_middleware(
        BodyCapMiddleware,
        limit=settings.max_request_body_bytes,
        prefixes=("/api/", "/a2a/"),
        exempt=("/a2a/agents/",),
        larger=((upload_path_pattern(), settings.upload_max_bytes + UPLOAD_FRAMING_BYTES),),  # file uploads
    )
    # Outermost: requests that arrive together start a few per pass of the event loop (core/web/start_gate.py).
    app.add_middleware(StartGateMiddleware)
    app.add_exception_handler(RequestValidationError, validation_error_response)
    install_error_handlers(app)  # API errors with a `code`, in the caller's Accept-Language
    app.include_router(api_router())
    app.include_router(metrics_router())  # /metrics: Prometheus (METRICS_TOKEN)
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
    app.on_startup(lambda: print_start_up_line(services, settings.base_url, as_log=settings.log_format == "json"))
    app.on_startup(lambda: asyncio.get_running_loop().call_later(1.0, warm_up))
    app.on_startup(lambda: asyncio.get_running_loop().call_later(1.5, warm_up_a2a))
    app.on_startup(lambda: start_soon(freeze_start_up_heap, 2.0))
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


def serve(settings: Settings) -> None:
    """Run the web app until Ctrl+C or SIGTERM, then exit with code 0."""
    from nicegui import ui

    from core.services import StartupRefusedError
    from core.web.connections import ConnectionLimits, guarded_http_protocol

    try:
        build(settings)
    except StartupRefusedError as exc:
        sys.exit(f"error: {exc}")
    prepare_to_serve()  # stop signals to the server, a higher open-files limit (core/process.py)
    # Slow and greedy clients (core/web/connections.py): a deadline for request headers, a cap per address.
    limits = ConnectionLimits(
        header_timeout_s=settings.http_header_timeout_s,
        max_per_address=settings.max_connections_per_address,
        uncapped=settings.trusted_proxies,
    )
    # LOG_FORMAT=json: uvicorn keeps no text handlers of its own; its lines go through the JSON one.
    uvicorn_options: dict[str, Any] = {"log_config": None} if settings.log_format == "json" else {}
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
        **uvicorn_options,
    )


def print_start_up_line(services: Services, base_url: str, *, as_log: bool = False) -> None:
    """What the person who started the app reads first, in the language of their shell (`LANG`).

    `as_log`: a log record instead (LOG_FORMAT=json, where every line of the output is one).
    """
    from core.i18n import _, negotiate, use_language

    shell_language = os.environ.get("LC_ALL") or os.environ.get("LC_MESSAGES") or os.environ.get("LANG")
    with use_language(negotiate(shell_language)):
        text = f"{TITLE}: {services.describe()}\n" + _("Open {url}").format(url=base_url)
    if as_log:
        logging.getLogger("app").info("%s", text.replace("\n", "; "))
        return
    print(text, flush=True)


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and run the app or a command (core/cli.py)."""
    settings = load_settings_or_exit()
    configure_process(settings)

    from nicegui import helpers

    if helpers.is_user_simulation():  # NiceGUI's User fixture runs this file; it only needs the app built
        build(settings)
        from nicegui import ui

        ui.run(storage_secret=settings.ensure_storage_secret())
        return

    args = parse_args(argv)
    if args.command is not None:
        sys.exit(run_command(settings, args))
    serve(settings)


if __name__ in {"__main__", "__mp_main__"}:
    if "NICEGUI_USER_SIMULATION" not in os.environ:  # NiceGUI's User fixture runs this file inside pytest
        exit_quietly_on_stop_signals()
    main()
