"""The HTTP+JSON (REST) endpoint (server side): the SDK's own REST routes, reached below one route per agent.

The SDK builds its REST routes (`create_rest_routes`: v1.0's `/message:send`, `/message:stream`,
`/tasks/{id}`, `/tasks/{id}:cancel`, `/tasks/{id}:subscribe`, `/tasks`, the push configs and
`/extendedAgentCard`, and with v0.3 compat the same under `/v1/…`) with the agent's path as their
prefix, so each path is exactly the SDK's. The app's one route `…/rest/{path}` checks the key and the
body (`core/a2a/server.py`) and then `RestEndpoint.respond` finds the SDK's route for the request and
calls it, as Starlette's router would (divergence 1: agents come and go at run time).

Errors have the spec's REST shape (§11.6, `google.rpc.Status` in JSON): `{"error": {"code": <HTTP status>,
"status": "NOT_FOUND", "message": "…", "details": [{"@type": "…ErrorInfo", "reason": "TASK_NOT_FOUND",
"domain": "a2a-protocol.org", "metadata": {}}]}}`; the SDK's handlers answer theirs so, and `rest_error`
writes the ones refused before them (no key, unknown agent, a body too large or not JSON).
"""

from __future__ import annotations

import json
from typing import Any

from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.routes.rest_routes import create_rest_routes
from a2a.utils.error_handlers import A2A_DOMAIN, ERROR_INFO_TYPE
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route

from core.a2a.protocol.jsonrpc import CallContextBuilder
from core.a2a.protocol.sse import coalesce_sse
from core.web.input_limits import MAX_JSON_NESTING, json_error, json_nesting


def rest_error(
    status_code: int, status: str, reason: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """An error in the spec's REST shape, for requests refused before the SDK's handlers see them."""
    info = {"@type": ERROR_INFO_TYPE, "reason": reason, "domain": A2A_DOMAIN, "metadata": {}}
    body = {"error": {"code": status_code, "status": status, "message": message, "details": [info]}}
    return JSONResponse(body, status_code=status_code, headers=headers)


def check_rest_body(body: bytes) -> JSONResponse | None:
    """A 400 for a body the SDK's parser would answer with a 500 (not UTF-8, nested too deep), else None.

    An empty body passes (GET and the cancels have none); JSON that does not parse is left to the
    SDK's handlers, which answer it 400 with the position of the mistake.
    """
    if not body:
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return rest_error(400, "INVALID_ARGUMENT", "INVALID_REQUEST", "The body is not UTF-8 text.")
    try:
        obj = json.loads(text)
    except RecursionError:
        nesting = MAX_JSON_NESTING + 1
    except json.JSONDecodeError:
        return None
    except ValueError as exc:  # e.g. a number of thousands of digits
        return rest_error(400, "INVALID_ARGUMENT", "INVALID_REQUEST", f"The body is not valid JSON: {json_error(exc)}.")
    else:
        nesting = json_nesting(obj)
    if nesting > MAX_JSON_NESTING:
        return rest_error(
            400, "INVALID_ARGUMENT", "INVALID_REQUEST", f"The JSON nests more than {MAX_JSON_NESTING} levels deep."
        )
    return None


class RestEndpoint:
    """The SDK's REST routes over `handler`, below `prefix` (a path with `{agent_id}` in it).

    Args:
        handler: the request handler (the same one the JSON-RPC endpoint uses).
        prefix: the routes' common path, e.g. `/a2a/agents/{agent_id}/rest`.
    """

    def __init__(self, handler: RequestHandler, prefix: str) -> None:
        built = create_rest_routes(
            handler, context_builder=CallContextBuilder(), enable_v0_3_compat=True, path_prefix=prefix
        )
        # The SDK also mounts the v1.0 routes below `/{tenant}` at the server's root; tenants are not offered.
        self.routes = [r for r in built if isinstance(r, Route)]
        self.paths = sorted(
            {r.path.removeprefix(prefix) for r in self.routes if not r.path.startswith(f"{prefix}/v1/")}
        )

    async def respond(self, request: Request) -> Response:
        """The answer of the SDK's route for `request` (its body already read), or a 404/405 in the REST shape."""
        allowed: set[str] = set()
        for route in self.routes:
            match, child = route.matches(request.scope)
            if match is Match.FULL:
                scope = {**request.scope, **child}
                response: Response = await route.endpoint(Request(scope, request.receive))
                return _with_retry_after(coalesce_sse(response))
            if match is Match.PARTIAL:
                allowed |= route.methods or set()
        if allowed:
            return rest_error(
                405,
                "INVALID_ARGUMENT",
                "METHOD_NOT_ALLOWED",
                f"{request.method} is not served here; use {' or '.join(sorted(allowed - {'HEAD'}))}.",
                {"Allow": ", ".join(sorted(allowed))},
            )
        return rest_error(
            404,
            "NOT_FOUND",
            "METHOD_NOT_FOUND",
            "There is no such A2A operation here. This HTTP+JSON endpoint serves "
            + ", ".join(self.paths)
            + " (and the v0.3 ones below /v1).",
        )


def _with_retry_after(response: Response) -> Response:
    """A 429 (too many running tasks) says when to try again as a `Retry-After` header too."""
    if response.status_code != 429 or not isinstance(response, JSONResponse):
        return response
    try:
        details: list[dict[str, Any]] = json.loads(bytes(response.body))["error"]["details"]
        seconds = next(
            d["metadata"]["retryAfterSeconds"] for d in details if "retryAfterSeconds" in d.get("metadata", {})
        )
    except (KeyError, StopIteration, ValueError, TypeError):
        return response
    response.headers["Retry-After"] = str(max(1, round(float(seconds))))
    return response
