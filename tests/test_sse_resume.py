"""Property: cut an SSE connection at random byte offsets, reconnect with Last-Event-ID, lose and repeat nothing.

For an `SSEStream` and for a hub buffer (`hub_sse_response`), over real HTTP on
127.0.0.1: some events are sent before the first client attaches, the rest while
clients are connected; each connection is cut after a random number of bytes
(mid-event too), the next one resumes with the last id the previous one
completed, the way EventSource does. The events reassembled from all the
connections equal the events sent, in order, each once.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from core.streaming.hub import StreamHub
from core.streaming.sse import SEED_EVENT_TYPES
from core.streaming.sse_stream import SSEStream
from tests.test_sse_harness import Event, RawReader, parse_sse

#: More examples for a thorough run: SSE_RESUME_EXAMPLES=500 .venv/bin/python -m pytest tests/test_sse_resume.py
EXAMPLES = int(os.environ.get("SSE_RESUME_EXAMPLES", "30"))

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=24)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), texts)
payloads = st.one_of(
    texts, scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=6), scalars, max_size=3)
)
event_lists = st.lists(
    st.tuples(st.sampled_from(["progress", "state", "artifact", "log", "text-delta"]), payloads),
    min_size=1,
    max_size=24,
)
cut_lists = st.lists(st.integers(min_value=0, max_value=700), max_size=5)


def _lines(text: str) -> str:
    return re.sub(r"\r\n|\r", "\n", text)  # what SSE does to line breaks in data


def same_as_sent(received: list[Event], events: list[tuple[str, Any]]) -> None:
    """The events as sent (strings as is, other values as JSON) are the ones received."""
    assert len(received) == len(events)
    sent = [(t, _lines(d) if isinstance(d, str) else d) for t, d in events]
    seen = [
        (e.type, e.data if isinstance(d, str) else json.loads(e.data))
        for e, (_, d) in zip(received, events, strict=True)
    ]
    assert seen == sent


def hub_payload(data: Any) -> dict[str, Any]:
    return data if isinstance(data, dict) and "type" not in data else {"value": data}


def expected_hub(events: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    out = []
    for t, d in events:
        payload = hub_payload(d)
        out.append((t, payload) if t in SEED_EVENT_TYPES else ("message", {"type": t, **payload}))
    return out


async def reassemble(client: httpx.AsyncClient, url: str, cuts: list[int], send_group) -> list[Event]:
    """Connect, let `send_group(i)` send the i-th group live, cut after `cuts[i]` bytes; resume; until the end."""
    received: list[Event] = []
    last_id = ""
    for i, cut in enumerate([*cuts, None]):
        headers = {"Last-Event-ID": last_id} if last_id else {}
        async with client.stream("GET", url, headers=headers) as response:
            if response.status_code == 204:  # ended, nothing after last_id
                await send_group(i)
                break
            assert response.status_code == 200
            reader = RawReader(response)
            sent = await send_group(i)
            if cut is None:
                body = await reader.to_end(timeout=2)
            else:
                # Stop at the cut, or once everything sent so far is in (the stream stays open).
                def enough(b: bytes, cut: int = cut, last_id: str = last_id, sent: int = sent) -> bool:
                    return len(b) >= cut or parse_sse(b, last_id=last_id).last_id == str(sent)

                body = await reader.until(enough, timeout=2)
                body = body[:cut]
        parsed = parse_sse(body, last_id=last_id)
        assert parsed.events == [] or parsed.events[0].type != "reset", parsed.events[0]
        received += parsed.events
        last_id = parsed.last_id
    return received


def groups(items: list, n: int) -> list[list]:
    size = -(-len(items) // n) if items else 0
    return [items[i * size : (i + 1) * size] for i in range(n)] if size else [[] for _ in range(n)]


@settings(max_examples=EXAMPLES, deadline=None)
@given(events=event_lists, cuts=cut_lists, before=st.integers(0, 24))
async def test_sse_stream_cut_anywhere_and_resumed_loses_and_repeats_nothing(server, events, cuts, before) -> None:
    name = uuid.uuid4().hex[:12]
    stream = SSEStream(keepalive_s=None, close_on_disconnect=False)
    server.streams[name] = stream
    for t, d in events[:before]:
        await server.call(stream.send_event, t, d)
    live = groups(events[before:], len(cuts) + 1)

    async def send_group(i: int) -> int:
        def go() -> int:
            for t, d in live[i]:
                stream.send_event(t, d)
            if i == len(live) - 1:
                stream.close()
            return stream.last_id

        return await server.call(go)

    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        received = await reassemble(client, f"/sse/{name}", cuts, send_group)
    assert [e.id for e in received] == [str(i) for i in range(1, len(events) + 1)]
    same_as_sent(received, events)


@settings(max_examples=EXAMPLES, deadline=None)
@given(events=event_lists, cuts=cut_lists, before=st.integers(0, 24))
async def test_hub_stream_cut_anywhere_and_resumed_loses_and_repeats_nothing(server, events, cuts, before) -> None:
    name = uuid.uuid4().hex[:12]
    hub = server.hubs.setdefault("resume", StreamHub())
    server.hub_options["resume"] = {"keepalive_s": None}
    key = f"a2a_{name}"

    async def send(items: list[tuple[str, Any]], finish: bool) -> int:
        async def go() -> int:
            last = hub.get(key).last_id
            for t, d in items:
                last = await hub.append(key, t, hub_payload(d))
            if finish:
                await hub.finish(key)
            return last

        return await server.run(go)

    await server.run(lambda: hub.create(key))
    await send(events[:before], False)
    live = groups(events[before:], len(cuts) + 1)

    async def send_group(i: int) -> int:
        return await send(live[i], i == len(live) - 1)

    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        received = await reassemble(client, f"/hub/resume/{key}", cuts, send_group)
    assert [e.id for e in received] == [str(i) for i in range(1, len(events) + 1)]
    assert [(e.type, json.loads(e.data)) for e in received] == expected_hub(events)
