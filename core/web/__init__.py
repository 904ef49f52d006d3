"""The HTTP edge that every router shares: what comes in from outside, before any package sees it.

Owns: request bodies (`RequestBody`: unknown fields are 422, text is valid Unicode) and the 422
answer (`schemas.py`); limits on what is read from outside, body sizes and JSON nesting
(`input_limits.py`); the names the server answers to and no changes from other sites
(`request_guards.py`); requests that arrive together start a few per pass of the event loop
(`start_gate.py`); slow and greedy clients: a deadline for request headers, a cap on one
address's connections, the open-files limit (`connections.py`); `/openapi.json`, `/docs` and `/redoc`
served offline (`api_docs.py`); and
external text in log lines (`logtext.py`); errors with a machine `code`, in the caller's
`Accept-Language` (`errors.py`); which addresses a URL that people name may reach, for card
fetches and model endpoints alike (`outbound_policy.py`: it decides, it does not fetch).

May import: the standard library, uvicorn, starlette, FastAPI, pydantic, httpx (its URL and error types);
of `core` only `core.i18n`.
"""

from core.web.api_docs import add_api_docs
from core.web.connections import ConnectionLimits, guarded_http_protocol, raise_open_files_limit
from core.web.errors import ApiError, LanguageMiddleware, error_code, install_error_handlers
from core.web.input_limits import MAX_JSON_NESTING, json_nesting, read_capped
from core.web.logtext import install_client_fault_filter, loggable
from core.web.request_guards import RequestGuardMiddleware
from core.web.schemas import RequestBody, validation_error_response
from core.web.start_gate import StartGate, StartGateMiddleware

__all__ = [
    "ApiError",
    "ConnectionLimits",
    "LanguageMiddleware",
    "error_code",
    "guarded_http_protocol",
    "install_error_handlers",
    "MAX_JSON_NESTING",
    "RequestBody",
    "RequestGuardMiddleware",
    "StartGate",
    "StartGateMiddleware",
    "add_api_docs",
    "install_client_fault_filter",
    "json_nesting",
    "loggable",
    "raise_open_files_limit",
    "read_capped",
    "validation_error_response",
]
