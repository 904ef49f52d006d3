"""Requests that arrive together start a few per pass of the event loop (core/web/start_gate.py)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from core.web.start_gate import StartGate, StartGateMiddleware

PASS = "|"


def record_passes(gate: StartGate, log: list[str]) -> None:
    """Write a marker into `log` at each pass boundary the gate counts."""
    next_pass = gate._next_pass

    def marked() -> None:
        log.append(PASS)
        next_pass()

    gate._next_pass = marked  # type: ignore[method-assign]


async def request(gate: StartGate, name: str, log: list[str]) -> None:
    """A request: it passes the gate, then notes that it started."""
    await gate.enter()
    log.append(name)


async def test_a_burst_starts_a_few_per_pass_in_order_of_arrival() -> None:
    gate = StartGate(per_pass=4)
    log: list[str] = []
    record_passes(gate, log)

    names = [f"r{i}" for i in range(18)]
    await asyncio.gather(*(request(gate, n, log) for n in names))

    started = [entry for entry in log if entry != PASS]
    assert started == names  # everyone started, first come first served
    runs = "".join("x" if entry != PASS else PASS for entry in log).split(PASS)
    assert max(len(run) for run in runs) == 4  # never more than per_pass between two pass boundaries
    assert len([run for run in runs if run]) == 5  # 18 requests: 4 + 4 + 4 + 4 + 2


async def test_a_request_alone_starts_without_waiting_for_another_pass() -> None:
    gate = StartGate(per_pass=2)
    entered = asyncio.ensure_future(gate.enter())
    await asyncio.sleep(0)  # one pass: enough for a request that does not queue
    assert entered.done()


async def test_a_request_canceled_while_it_waits_gives_its_turn_to_the_next() -> None:
    gate = StartGate(per_pass=1)
    log: list[str] = []

    tasks = [asyncio.ensure_future(request(gate, f"r{i}", log)) for i in range(4)]
    await asyncio.sleep(0)  # r0 is through, r1-r3 queue
    tasks[1].cancel()
    done, pending = await asyncio.wait(tasks, timeout=5)
    assert not pending
    assert log == ["r0", "r2", "r3"]
    assert tasks[1].cancelled()
    assert not gate._waiting  # nothing left behind


async def test_a_request_canceled_just_as_it_is_let_through_does_not_hold_up_the_others() -> None:
    gate = StartGate(per_pass=1)
    log: list[str] = []

    first, second, third = (asyncio.ensure_future(request(gate, n, log)) for n in ("r0", "r1", "r2"))
    await asyncio.sleep(0)  # r0 is through; r1 and r2 queue; the gate's next pass is scheduled
    # Runs in the next pass right after the gate has let r1 through, before r1 resumes.
    asyncio.get_running_loop().call_soon(second.cancel)
    done, pending = await asyncio.wait([first, second, third], timeout=5)
    assert not pending
    assert second.cancelled() and log == ["r0", "r2"]


def test_per_pass_must_be_positive() -> None:
    with pytest.raises(ValueError):
        StartGate(per_pass=0)


async def test_the_middleware_gates_http_requests_and_lets_websockets_and_lifespan_through() -> None:
    gate = StartGate(per_pass=1)
    entered: list[str] = []

    async def inner(scope, receive, send) -> None:
        entered.append(scope["type"])

    middleware = StartGateMiddleware(inner, gate)
    # Arriving in the same pass: the first HTTP request takes the pass's one start.
    first = asyncio.ensure_future(middleware({"type": "http"}, None, None))
    second = asyncio.ensure_future(middleware({"type": "http"}, None, None))
    websocket = asyncio.ensure_future(middleware({"type": "websocket"}, None, None))
    lifespan = asyncio.ensure_future(middleware({"type": "lifespan"}, None, None))
    await asyncio.sleep(0)
    assert entered == ["http", "websocket", "lifespan"] and not second.done()  # it waits for the next pass
    await asyncio.wait_for(second, 5)
    assert entered == ["http", "websocket", "lifespan", "http"]
    await asyncio.gather(first, websocket, lifespan)


async def test_an_app_behind_the_gate_answers_a_burst_of_requests() -> None:
    async def hello(request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(StartGateMiddleware)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
        answers = await asyncio.gather(*(client.get("/") for _ in range(50)))
    assert [a.text for a in answers] == ["hello"] * 50
