"""Request bodies are capped before they are read whole, for callers who are not logged in too.

FastAPI reads a JSON body before it solves a route's dependencies (who asks), so without a cap an
anonymous client could make the server hold any body in memory. The REST API and the broker's HTTP
routes are included with `max_body_size` (`MAX_REQUEST_BODY_BYTES`); the A2A JSON-RPC endpoints cap
their own and answer in JSON-RPC (tests/test_a2a_server.py).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.utils.app_process import AppProcess, app_process

CAP = 100_000


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppProcess]:
    with app_process(
        tmp_path_factory.mktemp("body-caps") / "data",
        MAX_REQUEST_BODY_BYTES=str(CAP),
        BROKER_DISPATCH_TOKEN="caps-token",
    ) as running:
        running.wait_until_serving()
        yield running


def oversized_json() -> bytes:
    return b'{"content": "' + b"x" * (CAP + 10) + b'"}'


@pytest.mark.parametrize("path", ["/api/sessions", "/api/agents", "/api/a2a/keys", "/a2a/tasks/dispatch"])
def test_a_body_over_the_cap_is_refused_with_413_and_its_code(app: AppProcess, path: str) -> None:
    response = httpx.post(
        f"{app.base_url}{path}", content=oversized_json(), headers={"content-type": "application/json"}, timeout=10
    )
    assert response.status_code == 413
    assert response.json() == {
        "detail": f"The request body is too large: at most {CAP} bytes are accepted.",
        "code": "too_large",
    }


def test_the_refusal_is_in_the_callers_language(app: AppProcess) -> None:
    response = httpx.post(
        f"{app.base_url}/api/sessions",
        content=oversized_json(),
        headers={"content-type": "application/json", "accept-language": "zh-CN"},
        timeout=10,
    )
    assert response.status_code == 413 and response.json()["code"] == "too_large"
    assert str(CAP) in response.json()["detail"] and "request body" not in response.json()["detail"]


def test_a_chunked_body_without_length_is_cut_off_while_it_is_read(app: AppProcess) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"content": "'
        for _ in range(50):  # 50 x 10 KB: five times the cap, sent without a Content-Length
            yield b"y" * 10_000
        yield b'"}'

    response = httpx.post(
        f"{app.base_url}/api/sessions", content=chunks(), headers={"content-type": "application/json"}, timeout=10
    )
    assert response.status_code == 413 and response.json()["code"] == "too_large"


def test_a_declared_length_over_the_cap_is_answered_without_waiting_for_the_body(app: AppProcess) -> None:
    """A client that announces 1 GB and sends nothing more gets its 413 at once: nothing is read."""
    port = int(app.base_url.rsplit(":", 1)[1])
    head = (
        f"POST /api/sessions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000000000\r\n\r\n{"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head.encode())
        status_line = sock.recv(4096).split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1.1 413")


def test_bodies_under_the_cap_still_work(app: AppProcess) -> None:
    created = httpx.post(f"{app.base_url}/api/sessions", json={}, timeout=10)
    assert created.status_code in (200, 201)
    session_id = created.json()["id"]
    sent = httpx.post(f"{app.base_url}/api/sessions/{session_id}/messages", json={"content": "z" * 15_000}, timeout=10)
    assert sent.status_code in (200, 202), sent.text
