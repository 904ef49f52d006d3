"""How the app's process runs: logging, stop signals, the start-up heap, worker threads, open files.

`app.py` calls these while it starts and serves; none of them holds the app's behaviour. They are
the knobs that keep the event loop moving under load (docs/ARCHITECTURE.md, "The streaming hot
path") and that make Ctrl+C and SIGTERM end the process cleanly, with code 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable, Coroutine

from core.settings import Settings
from core.web.logtext import install_client_fault_filter, install_debug_detail_filter

log = logging.getLogger("app")

# `DEBUG` names what to log in detail, as seed 003's `DEBUG=a2a-broker` does; these names are ours.
DEBUG_NAMESPACES = {"a2a-broker": "core.broker", "a2a-chat": "core", "a2a-pipe": "core.pipe"}


def configure_logging(debug: str | None, level: str = "INFO", log_format: str = "text") -> None:
    """`level` everywhere; DEBUG for the comma-separated namespaces in `debug` (any other value: everything).

    `log_format="json"`: one JSON object per line (`core.logcontext.JsonLogFormatter`), the server's own
    lines included (`serve` leaves uvicorn's loggers to this handler then).
    """
    if log_format == "json":
        from core.logcontext import JsonLogFormatter

        handler = logging.StreamHandler()
        handler.setFormatter(JsonLogFormatter())
        logging.basicConfig(handlers=[handler], force=True)
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # what NiceGUI lets uvicorn say: warnings
            logging.getLogger(name).setLevel(logging.WARNING)
    else:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    install_client_fault_filter()
    install_debug_detail_filter()
    names = [n.strip() for n in (debug or "").split(",") if n.strip()]
    if names and all(n in DEBUG_NAMESPACES for n in names):
        for name in names:
            logging.getLogger(DEBUG_NAMESPACES[name]).setLevel(logging.DEBUG)
    elif names and debug is not None and debug.strip().lower() not in {"0", "false", "no", "off"}:
        logging.getLogger().setLevel(logging.DEBUG)


def configure_process(settings: Settings) -> None:
    """Before anything else runs: where NiceGUI keeps browser storage, and what is logged."""
    # NiceGUI keeps per-browser storage on disk; keep it beside the database.
    os.environ.setdefault("NICEGUI_STORAGE_PATH", str(settings.data_dir / ".nicegui"))
    if settings.cluster and settings.redis.dsn:  # replicas share browser storage (docs/ARCHITECTURE.md, "Cluster")
        os.environ.setdefault("NICEGUI_REDIS_URL", settings.redis.dsn)
        os.environ.setdefault("NICEGUI_REDIS_KEY_PREFIX", f"{settings.redis.key_prefix}nicegui:")
    configure_logging(settings.debug, settings.log_level, settings.log_format)


def prepare_to_serve() -> None:
    """Just before the server starts: stop signals are left to it, and the open-files limit is raised."""
    from core.web.connections import raise_open_files_limit

    if threading.current_thread() is threading.main_thread():
        leave_stop_signals_to_the_server()
    raise_open_files_limit()


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


_start_up_tasks: set[asyncio.Task[None]] = set()


def start_soon(coro_fn: Callable[[], Coroutine[object, object, None]], delay_s: float) -> None:
    """Run `coro_fn()` as a task `delay_s` after now (the task is kept until it ends)."""
    loop = asyncio.get_running_loop()

    def start() -> None:
        task = loop.create_task(coro_fn())
        _start_up_tasks.add(task)
        task.add_done_callback(_start_up_tasks.discard)

    loop.call_later(delay_s, start)


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
