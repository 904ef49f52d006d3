"""Remote A2A agents over HTTP: the registry's `RemoteAgent` adapter (kind `http`) on the a2a-sdk client.

A remote agent is known by its card. `stream` sends the request as a new task
with the SDK client (v1.0 when the card offers it, else v0.3 through the
SDK's compat transport), streaming when the card says it can, and turns what
comes back into `RemoteEvent`s (`core.a2a.protocol.RemoteStreamReader`).
Stopping the iteration (the delegation is cancelled) sends `CancelTask` for the
remote task, best effort.

Every failure of the remote side (unreachable, HTTP errors, JSON-RPC errors,
a timeout) comes out as `RemoteAgentError` with the remote's own words, which
the delegation reports as the task's error.

All HTTP goes through `core.a2a.outbound` (issue 12): only to addresses the policy
allows, no redirects, bodies of cards capped, and the bearer token only to the
card's origin (scheme, host, port), never to another one the card names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from core.a2a import outbound
from core.a2a import protocol as wire
from core.a2a.remote_push import RemotePushWaits, Wait
from core.delegation.registry import Asker, RemoteAgentError, RemoteEvent
from core.web.outbound_policy import AllowList

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
# How a registered agent's reachability is known: every call says it; a look at the list re-checks
# (GET of its card, this short) an agent whose last word is older than REACHABILITY_MAX_AGE_S.
PROBE_TIMEOUT_S = 3.0
REACHABILITY_MAX_AGE_S = 30.0
# Between two events of a stream; a working agent's SSE pings (every 15 s) keep a quiet stream alive.
READ_TIMEOUT_S = 300.0
CANCEL_TIMEOUT_S = 5.0


class HttpRemoteAgent:
    """A remote A2A agent called over HTTP with the a2a-sdk client.

    Args:
        agent_id: its id in the registry.
        card: its card (the SDK's type, from `fetch_card` or `card_from_json`).
        card_url: where the card was fetched from.
        allow: hosts and networks the agent may be on although they are not public (`OUTBOUND_ALLOW_HOSTS`).
        bearer_token: sent as `Authorization: Bearer <token>` when the remote agent needs one, and only to
            the card's origin: requests to any other origin go without it.
    """

    kind = "http"

    def __init__(
        self,
        *,
        agent_id: str,
        card: Any,
        card_url: str,
        allow: AllowList,
        bearer_token: str | None = None,
        push: RemotePushWaits | None = None,
    ) -> None:
        self.id = agent_id
        self.push = push  # long tasks end by push when on and the card offers it (`core/a2a/remote_push.py`)
        self.name = card.name
        self.description = card.description
        self.card_url = card_url
        self._card = card
        self._http = outbound.guarded_client(
            allow,
            bearer_token=bearer_token,
            token_origin=outbound.origin(card_url),
            timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S),
        )
        #: Whether the agent answered the last call or check (it was reachable when registered or restored).
        self.reachable = True
        self._known_at = time.monotonic()

    async def check_reachable(self, *, max_age_s: float | None = None) -> bool:
        """Re-check reachability (GET of its card) unless a call or a check said it within `max_age_s`.

        Args:
            max_age_s: how old the last word may be (default `REACHABILITY_MAX_AGE_S`).
        """
        if time.monotonic() - self._known_at < (REACHABILITY_MAX_AGE_S if max_age_s is None else max_age_s):
            return self.reachable
        try:
            response = await self._http.get(self.card_url, timeout=PROBE_TIMEOUT_S)
            self._mark(response.status_code < 500)
        except httpx.HTTPError:
            self._mark(False)
        return self.reachable

    def _mark(self, reachable: bool) -> None:
        if reachable != self.reachable:
            log.info("remote agent %s is %s", self.id, "reachable again" if reachable else "unreachable")
        self.reachable, self._known_at = reachable, time.monotonic()

    def visible_to(self, agent_id: Any) -> bool:
        """Registered agents serve every local agent."""
        return True

    def card(self) -> dict[str, Any]:
        """Name, description, skills, interface and where the card came from."""
        return {"kind": self.kind, "cardUrl": self.card_url, **wire.card_summary(self._card)}

    #: `stream` takes `files` (sent as file parts).
    takes_files = True

    async def stream(
        self,
        text: str,
        *,
        task_id: str,
        context_id: str | None = None,
        ask: Asker | None = None,
        files: list[Any] | None = None,
    ) -> AsyncIterator[RemoteEvent]:
        """Send `text` (and `files`, `wire.OutgoingFile`s, as file parts) as a new remote task; yield its events.

        When the agent asks back (`input-required`, `auth-required`), `ask(state, question)` gives the
        answer, sent into the same remote task (its taskId and contextId), whose stream is then read on;
        without `ask` the question ends the task as its answer.

        Raises:
            RemoteAgentError: the remote agent could not be reached or answered with an error.
        """
        if self.push is not None and self.push.enabled and wire.offers_push(self._card):
            async for event in self._stream_by_push(self.push, text, task_id=task_id, context_id=context_id):
                yield event
            return
        client = wire.open_client(self._card, self._http)
        reader = wire.RemoteStreamReader(self.name)
        request: Any = wire.message_request(text, files or [], message_id=f"{task_id}-in", context_id=context_id)
        turns = 0
        try:
            while request is not None:
                asked: RemoteEvent | None = None
                responses: Any = client.send_message(request)  # an async generator: closed when the agent asks
                async with contextlib.aclosing(responses):
                    async for response in responses:
                        self._mark(True)
                        for event in reader.read(response):
                            if event.question is None:
                                yield event
                            elif ask is None:  # nobody to ask: what the agent asked is its answer
                                yield RemoteEvent(text=event.question)
                                yield RemoteEvent(state="completed", final=True, answer=event.question)
                            else:
                                asked = event
                        if asked is not None:
                            break  # the agent waits (its stream ends here too)
                request = None
                if asked is not None and ask is not None:
                    answer = await ask(asked.state or "input-required", asked.question or "")
                    turns += 1
                    request = wire.text_message_request(
                        answer,
                        message_id=f"{task_id}-in-{turns}",
                        context_id=reader.remote_context_id,
                        task_id=reader.remote_task_id,
                    )
        except asyncio.CancelledError:
            if reader.remote_task_id:
                await asyncio.shield(self._cancel_remote(client, reader.remote_task_id))
            raise
        except Exception as exc:
            if not wire.is_client_error(exc):
                raise
            if _unreachable(exc):
                self._mark(False)
            raise RemoteAgentError(_describe(exc)) from exc
        finally:
            await client.close()  # the transport leaves our shared httpx client open

    async def _stream_by_push(
        self, waits: RemotePushWaits, text: str, *, task_id: str, context_id: str | None
    ) -> AsyncIterator[RemoteEvent]:
        """The same task, asked to answer at once and to push its updates: no stream is held while it runs.

        Progress comes with the pushes; the end is read with GetTask when a push says the task ended (or
        every `A2A_REMOTE_PUSH_POLL_S` in case a push is lost). The wait is a row, so a restart resumes it.
        """
        wait = await waits.open(task_id=task_id, remote_agent_id=self.id)
        client = wire.open_client(self._card, self._http, streaming=False)
        reader = wire.RemoteStreamReader(self.name)
        request = wire.ask_for_push(
            wire.text_message_request(text, message_id=f"{task_id}-in", context_id=context_id),
            url=wait.url,
            token=wait.token,
            config_id=wait.id,
        )
        try:
            async for response in client.send_message(request):
                self._mark(True)
                events = reader.read(response)
                if await self._finish_wait(waits, wait, events, reader.remote_task_id):
                    for event in events:
                        yield event
                    return
                for event in events:
                    yield event
            if not reader.remote_task_id:
                raise RemoteAgentError(f"{self.name} answered without a task to follow.")
            await waits.named(wait.id, reader.remote_task_id)
            while True:
                events = await self._next_push(client, reader, wait, waits.poll_s)
                ended = await self._finish_wait(waits, wait, events, reader.remote_task_id)
                for event in events:
                    yield event
                if ended:
                    return
        except asyncio.CancelledError:
            if not waits.closing:  # stopped by its caller (a restart leaves it waiting for the next start)
                if reader.remote_task_id:
                    await asyncio.shield(self._cancel_remote(client, reader.remote_task_id))
                await asyncio.shield(waits.finish(wait.id, "canceled"))
            raise
        except Exception as exc:
            if not wire.is_client_error(exc) and not isinstance(exc, RemoteAgentError):
                raise
            if waits.closing:
                raise
            if _unreachable(exc):
                self._mark(False)
            await waits.finish(wait.id, "failed", error=_describe(exc))
            raise exc if isinstance(exc, RemoteAgentError) else RemoteAgentError(_describe(exc)) from exc
        finally:
            waits.release(wait.id)
            await client.close()

    @staticmethod
    async def _finish_wait(
        waits: RemotePushWaits, wait: Wait, events: list[RemoteEvent], remote_task_id: str | None
    ) -> bool:
        """Save the end on the wait when `events` hold it (before they are yielded: the reader stops at the end)."""
        final = next((e for e in events if e.final), None)
        if final is None:
            return False
        if remote_task_id:
            await waits.named(wait.id, remote_task_id)
        await waits.finish(wait.id, final.state or "completed", answer=final.answer, error=final.error)
        return True

    async def _next_push(
        self, client: Any, reader: wire.RemoteStreamReader, wait: Wait, poll_s: float
    ) -> list[RemoteEvent]:
        """The progress a push brought, or the task's end read with GetTask (after a push of its end, or a while)."""
        try:
            async with asyncio.timeout(poll_s):
                pushed = await wait.updates.get()
        except TimeoutError:
            pushed = None
        if pushed is not None:
            events = reader.read(pushed)
            if not any(e.final for e in events):
                return events
        assert reader.remote_task_id
        task = await client.get_task(wire.get_task_request(reader.remote_task_id))
        self._mark(True)
        events = reader.read(wire.task_response(task))
        return events if any(e.final for e in events) else []

    async def read_end(self, remote_task_id: str, wait: Wait) -> tuple[str, str | None, str | None] | None:
        """After a restart: the remote task's end (state, answer, error) read with GetTask, or None while it runs."""
        client = wire.open_client(self._card, self._http, streaming=False)
        try:
            task = await client.get_task(wire.get_task_request(remote_task_id))
        except Exception as exc:
            if not wire.is_client_error(exc):
                raise
            log.info("could not read task %s of remote agent %s: %s", remote_task_id, self.id, _describe(exc))
            return None
        finally:
            await client.close()
        events = wire.RemoteStreamReader(self.name).read(wire.task_response(task))
        final = next((e for e in events if e.final), None)
        if final is None:
            return None
        return final.state or "completed", final.answer, final.error

    async def _cancel_remote(self, client: Any, remote_task_id: str) -> None:
        try:
            async with asyncio.timeout(CANCEL_TIMEOUT_S):
                await client.cancel_task(wire.cancel_request(remote_task_id))
        except Exception as exc:  # best effort: the remote task may have ended, or the agent be gone
            log.info("could not cancel task %s of remote agent %s: %s", remote_task_id, self.id, _describe(exc))

    async def aclose(self) -> None:
        """Close the HTTP connections (when the agent leaves the registry)."""
        with contextlib.suppress(Exception):
            await self._http.aclose()


def _unreachable(exc: BaseException) -> bool:
    """True when the failure is the network's (no connection, timeout), not an answer of the agent."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, httpx.TransportError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _describe(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return message.strip()


async def fetch_card(url: str, *, allow: AllowList, bearer_token: str | None = None) -> Any:
    """Fetch and check the card at `url` (the card's own URL, or the agent's base URL), under the outbound policy.

    Args:
        url: what the person gave.
        allow: hosts and networks that may be reached although they are not public.
        bearer_token: sent only to `url`'s origin.

    Raises:
        CardError: not an http(s) URL, "could not fetch the card: <why>", or not a card this app can call.
    """
    location = wire.card_location(url)
    try:
        data = await outbound.fetch_card_json(
            location, allow=allow, bearer_token=bearer_token, timeout_s=CONNECT_TIMEOUT_S
        )
    except outbound.CardFetchError as exc:
        raise wire.CardError(str(exc)) from None
    return wire.card_from_fetched(data)
