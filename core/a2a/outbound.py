"""Outbound HTTP to URLs that people and peers name: agent cards and remote agents' endpoints (issue 12).

A card URL comes from whoever registers a remote agent, or from any peer that
dials in on `/a2a?cardUrl=`; a card names its JSON-RPC endpoint. Fetched
blindly, such a URL reaches Redis, PostgreSQL, this app's own API or a cloud's
metadata service (server-side request forgery). The policy:

- only `http` and `https` URLs;
- the host name is resolved (the event loop's `getaddrinfo`, so `localhost`,
  `2130706433` and `0x7f.1` resolve as the system would) and refused if ANY of
  its addresses is loopback, private, link-local, multicast, reserved,
  unspecified or otherwise not public, unless the
  host name, or the address's network, is in the allow-list
  (`OUTBOUND_ALLOW_HOSTS`; tests and local agents use it); a cloud metadata
  address never, whatever the allow-list says. (The policy itself is `core.web.outbound_policy`, shared
  with the model calls' `apiBase` check; this module does the fetching.)
- the connection goes to the address that was checked (`GuardedTransport`
  rewrites the request to it and keeps `Host` and, for https, the TLS server
  name and certificate check on the host name), so a name that resolves to
  something else a moment later (DNS rebinding) is not reached;
- redirects are followed by hand (`fetch_card_json`), at most `MAX_REDIRECTS`,
  each hop checked like the first;
- bodies are read as a stream and abandoned past `MAX_CARD_BYTES` (cards) or
  `MAX_RESPONSE_BYTES` (any other answer but an event stream, whose events
  the a2a-sdk reads one by one as they come);
- a bearer token goes only to the origin (scheme, host, port) it was given for.

Errors carry a short category ("timed out", "HTTP 404", "not allowed: a
loopback address"), never the target's own words or body: the text a person
sees cannot be used to read internal services or to map their ports. Nothing
fetched is logged; at most the URL (shortened) and the category.

Remaining gap, by design: requests do not use `HTTP(S)_PROXY` (the proxy
would resolve names itself, past this check).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx

from core import tracing
from core.errors import AppError
from core.web import input_limits
from core.web.outbound_policy import (  # noqa: F401  (the policy's names, as this module's users know them)
    METADATA_ADDRESSES,
    AllowList,
    IPAddress,
    IPNetwork,
    OutboundError,
    checked_addresses,
    refusal,
)

log = logging.getLogger(__name__)

MAX_CARD_BYTES = 1 << 20  # 1 MiB: real cards are a few KiB
MAX_RESPONSE_BYTES = 16 << 20  # a remote agent's JSON-RPC answer (not an event stream): far above any real one
MAX_REDIRECTS = 5
FETCH_TIMEOUT_S = 10.0
TIMED_OUT = "timed out"


class CardFetchError(AppError, ValueError):
    """A card that could not be fetched: "could not fetch the card: <category>", for people to read."""

    code = "card_fetch_error"

    def __init__(self, category: str) -> None:
        super().__init__(f"could not fetch the card: {category}")
        self.category = category


def origin(url: str | httpx.URL) -> tuple[str, str, int | None]:
    """The origin of `url`: scheme, host (lower case) and port (the scheme's default when not given)."""
    url = httpx.URL(url) if isinstance(url, str) else url
    port = url.port or {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host.lower(), port


def shorten(url: str | httpx.URL, limit: int = 120) -> str:
    """`url` for a log line: at most `limit` characters."""
    text = str(url)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport that sends each request only where the policy allows, to the address it checked.

    Each host name gets its own connection pool: the pool knows connections by address, and an https
    connection checked for one name must not carry a request for another name on the same address.

    Args:
        allow: hosts and networks that may be private.
        bearer_token: sent as `Authorization: Bearer <token>`, but only to `token_origin`.
        token_origin: the origin the token was given for (`origin(card_url)`).
        transport: makes the transport that does the I/O for one host name (default: httpx's own).
        max_response_bytes: the largest body read of a response that is not an event stream.
    """

    def __init__(
        self,
        allow: AllowList,
        *,
        bearer_token: str | None = None,
        token_origin: tuple[str, str, int | None] | None = None,
        transport: Callable[[], httpx.AsyncBaseTransport] = httpx.AsyncHTTPTransport,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self.allow = allow
        self.max_response_bytes = max_response_bytes
        self._token = bearer_token
        self._token_origin = token_origin
        self._make_transport = transport
        self._by_host: dict[str, httpx.AsyncBaseTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Check the URL, add the token for its own origin only, and send to the checked address."""
        try:
            addresses = await checked_addresses(request.url, self.allow)
        except OutboundError as exc:
            exc.request = request
            raise
        headers = request.headers.copy()
        headers.pop("Authorization", None)  # whatever the caller set: the token goes only where it belongs
        if self._token and origin(request.url) == self._token_origin:
            headers["Authorization"] = f"Bearer {self._token}"
        extensions = dict(request.extensions)
        if request.url.scheme == "https":
            extensions["sni_hostname"] = request.url.host  # TLS: server name and certificate check on the name
        host = request.url.host.lower()
        inner = self._by_host.get(host)
        if inner is None:
            inner = self._by_host[host] = self._make_transport()
        last: httpx.ConnectError | None = None
        for address in addresses:
            pinned = httpx.Request(
                request.method,
                request.url.copy_with(host=str(address)),
                headers=headers,
                stream=request.stream,
                extensions=extensions,
            )
            try:
                response = await inner.handle_async_request(pinned)
            except httpx.ConnectError as exc:  # the next address of the same name, if any
                last = exc
                continue
            if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
                response.stream = _CappedStream(response.stream, self.max_response_bytes, request)
            return response
        assert last is not None
        raise last

    async def aclose(self) -> None:
        """Close the connections."""
        for inner in self._by_host.values():
            await inner.aclose()
        self._by_host.clear()


class _CappedStream(httpx.AsyncByteStream):
    """A response body that raises `OutboundError` ("too large (over ...)") once more than `limit` bytes came."""

    def __init__(self, stream: Any, limit: int, request: httpx.Request) -> None:
        self._stream = stream
        self._limit = limit
        self._request = request

    async def __aiter__(self) -> Any:
        size = 0
        async for chunk in self._stream:
            size += len(chunk)
            if size > self._limit:
                raise OutboundError(f"too large (over {_size(self._limit)})", request=self._request)
            yield chunk

    async def aclose(self) -> None:
        """Close the underlying stream (and its connection)."""
        await self._stream.aclose()


def guarded_client(
    allow: AllowList,
    *,
    bearer_token: str | None = None,
    token_origin: Any = None,
    timeout: httpx.Timeout | float = FETCH_TIMEOUT_S,
) -> httpx.AsyncClient:
    """An httpx client that goes only where the policy allows, follows no redirect, sends the token to its origin.

    Each request carries the current trace's `traceparent` (core/tracing.py): a remote agent that
    propagates it joins the delegation chain's trace.
    """
    transport = GuardedTransport(allow, bearer_token=bearer_token, token_origin=token_origin)
    return httpx.AsyncClient(
        transport=transport,
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
        event_hooks={"request": [with_trace]},
    )


async def with_trace(request: httpx.Request) -> None:
    """Httpx's request hook: the current trace's `traceparent` on the way out (none without a trace)."""
    tracing.inject(request.headers)


async def fetch_card_json(
    url: str,
    *,
    allow: AllowList,
    bearer_token: str | None = None,
    max_bytes: int = MAX_CARD_BYTES,
    timeout_s: float = FETCH_TIMEOUT_S,
) -> Any:
    """GET the card at `url` as JSON, under the policy: each redirect checked, the body capped.

    Args:
        url: the card's URL.
        allow: hosts and networks that may be private.
        bearer_token: sent only to `url`'s origin (not after a redirect to another one).
        max_bytes: the largest body read.
        timeout_s: connect and read timeout of each request.

    Raises:
        CardFetchError: refused, unreachable, timed out, an HTTP error, too large, too many redirects, not JSON.
    """
    try:
        target = httpx.URL(url)
        async with guarded_client(
            allow, bearer_token=bearer_token, token_origin=origin(target), timeout=timeout_s
        ) as http:
            body = await _get_capped(http, target, max_bytes)
    except (OutboundError, httpx.HTTPError, httpx.InvalidURL) as exc:
        category = _category(exc)
        log.info("could not fetch the card at %s: %s", shorten(url), category)
        raise CardFetchError(category) from None  # the target's own words stay out of the message and traceback
    try:
        return json.loads(body)
    except ValueError:
        log.info("could not fetch the card at %s: not JSON", shorten(url))
        raise CardFetchError("not a valid agent card (not JSON)") from None


async def _get_capped(http: httpx.AsyncClient, target: httpx.URL, max_bytes: int) -> bytes:
    for _ in range(MAX_REDIRECTS + 1):
        async with http.stream(
            "GET", target, headers={"Accept": "application/json", "Accept-Encoding": "identity"}
        ) as response:
            location = response.headers.get("Location")
            if response.is_redirect and location:
                target = target.join(location)
                continue
            if not response.is_success:
                raise OutboundError(f"HTTP {response.status_code}")
            return await read_capped(response, max_bytes)
    raise OutboundError("too many redirects")


async def read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    """The body of a streamed response, read no further than `max_bytes`.

    Raises:
        OutboundError: the body is (or says it is) larger.
    """
    too_large = OutboundError(f"too large (over {_size(max_bytes)})")
    body = await input_limits.read_capped(response.aiter_bytes(), max_bytes, response.headers.get("Content-Length"))
    if body is None:
        raise too_large
    return body


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB"


def _category(exc: Exception) -> str:
    if isinstance(exc, OutboundError):
        return exc.category
    if isinstance(exc, httpx.TimeoutException):
        return TIMED_OUT
    if isinstance(exc, httpx.ConnectError):
        return "could not connect"
    if isinstance(exc, httpx.InvalidURL | httpx.UnsupportedProtocol):
        return "not a valid URL"
    return "the connection failed"
