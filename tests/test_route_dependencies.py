"""No route of the app's own runs a dependency or an endpoint in the thread pool.

FastAPI runs a plain `def` dependency or endpoint on a worker thread, once per request: a trip
from the event loop to a thread and back for what is usually an attribute read (`get_db`,
`get_chat`, ...). A chat send and its stream's open used to make eight such trips; under a burst
of sends (100 at once) they queued for the pool's 40 threads and fought the event loop for the
GIL (issue 38: turns that start fast under load). So every dependency and endpoint of the app's
own routers (`core.*`) is `async def`, and this test names any that is not.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts

from tests.security.test_surfaces import built_app_routes  # noqa: F401  (the fixture: the app as the page tests run it)


def _runs_on_the_loop(call: Any) -> bool:
    if inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call):
        return True
    if inspect.isfunction(call) or inspect.isclass(call):
        return False
    method = type(call).__call__  # an instance, as a security scheme's (HTTPBasic, ...)
    return inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method)


def _calls(dependant: Dependant) -> Iterator[Any]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _calls(sub)


def _name(call: Any) -> str:
    return f"{getattr(call, '__module__', '?')}.{getattr(call, '__qualname__', type(call).__qualname__)}"


async def test_no_dependency_or_endpoint_of_the_apps_routes_runs_in_the_thread_pool(built_app_routes: list) -> None:
    # Included routers are kept whole by this FastAPI: their routes are read as its OpenAPI reads them.
    ours = [
        c
        for c in iter_route_contexts(built_app_routes)
        if isinstance(c.original_route, APIRoute) and (c.endpoint.__module__ or "").startswith("core.")
    ]
    assert len(ours) > 50  # the app's REST and A2A routes were found
    sync = set()
    for route in ours:
        for call in [route.endpoint, *_calls(route.dependant)]:
            if not _runs_on_the_loop(call):
                sync.add(f"{_name(call)} (in {', '.join(sorted(route.methods or ()))} {route.path})")
    assert not sync, "make these `async def` (FastAPI runs a plain def in its thread pool):\n" + "\n".join(sorted(sync))
