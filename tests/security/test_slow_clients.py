"""Slow and greedy clients against a live `python app.py` (issue 34, item 4; core/web/connections.py).

An attacker opens many connections from one address (127.0.0.2: Linux routes all of 127/8 to the
loopback interface) and sends half a request on each. The server must keep answering others, close
the half-sent ones after HTTP_HEADER_TIMEOUT_S, and hold no more than MAX_CONNECTIONS_PER_ADDRESS of
them. The children start with a soft open-files limit of 1,024 (most Linux systems' default), which
the app raises itself.
"""

from __future__ import annotations

import http.client
import resource
import selectors
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from tests.utils.app_process import AppProcess, app_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="127.0.0.2 and /proc are Linux's")

ATTACKER = "127.0.0.2"
PROXY = "127.0.0.3"  # TRUSTED_PROXIES in the cap's test
HALF_REQUEST = b"GET /a2a/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "  # the headers never end
DEFAULT_SOFT_LIMIT = 1024


@contextmanager
def soft_open_files_limit(soft: int) -> Iterator[None]:
    """Set this process's soft RLIMIT_NOFILE (children started meanwhile inherit it); restored after."""
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (before, hard))


@contextmanager
def app_with_default_soft_limit(tmp_path: Path, **env: str) -> Iterator[AppProcess]:
    """`python app.py`, started with the common default soft limit of 1,024 open files (this process keeps its own)."""
    with ExitStack() as stack:
        with soft_open_files_limit(DEFAULT_SOFT_LIMIT):
            app = stack.enter_context(app_process(tmp_path / "data", **env))
        yield app


@pytest.fixture
def room_for_sockets() -> Iterator[None]:
    """Enough file descriptors in this process for 1,100 client sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2_000:
        pytest.skip(f"the hard open-files limit ({hard}) leaves no room for 1,100 client sockets")
    with soft_open_files_limit(max(soft, 2_000)):
        yield


def port_of(app: AppProcess) -> int:
    return int(app.base_url.rsplit(":", 1)[1])


def half_open(
    port: int,
    count: int,
    *,
    source: str = ATTACKER,
    within_s: float = 30.0,
) -> list[tuple[socket.socket, float]]:
    """`count` connections from `source`, each with half a request sent; (socket, connected at)."""
    opened: list[tuple[socket.socket, float]] = []
    deadline = time.monotonic() + within_s
    try:
        while len(opened) < count and time.monotonic() < deadline:
            sock = socket.socket()
            opened.append((sock, time.monotonic()))
            sock.settimeout(5)
            sock.bind((source, 0))
            sock.connect(("127.0.0.1", port))
            sock.sendall(HALF_REQUEST)
            sock.setblocking(False)
    except BaseException:
        close_all(opened)
        raise
    assert len(opened) == count, f"only {len(opened)} of {count} connections opened within {within_s:.0f} s"
    return opened


def close_all(socks: list[tuple[socket.socket, float]]) -> None:
    for sock, _ in socks:
        sock.close()


def wait_for_closes(socks: list[tuple[socket.socket, float]], *, within_s: float) -> dict[socket.socket, float]:
    """Wait until the server has closed each socket (EOF or reset) or `within_s` has passed; {socket: closed at}."""
    closed: dict[socket.socket, float] = {}
    with selectors.DefaultSelector() as selector:
        for sock, _ in socks:
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + within_s
        while len(closed) < len(socks) and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(timeout=min(left, 0.5)):
                sock = key.fileobj
                try:
                    if sock.recv(65536):  # an answer (408, 429) comes before the end
                        continue
                except (ConnectionResetError, BrokenPipeError):
                    pass
                except BlockingIOError:
                    continue
                closed[sock] = time.monotonic()
                selector.unregister(sock)
    return closed


def health_time(app: AppProcess, *, timeout_s: float = 5.0) -> float:
    """Seconds `GET /a2a/health` from 127.0.0.1 takes, on a fresh connection; fails past `timeout_s`."""
    started = time.monotonic()
    with httpx.Client(timeout=timeout_s) as client:
        response = client.get(f"{app.base_url}/a2a/health")
    assert response.status_code == 200
    return time.monotonic() - started


def open_files_limit_of(pid: int) -> tuple[float, float]:
    """The (soft, hard) open-files limit of a running process, from /proc ("unlimited": infinity)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return tuple(float("inf") if value == "unlimited" else int(value) for value in (soft, hard))
    raise AssertionError(f"no open-files limit in /proc/{pid}/limits")


def test_the_app_raises_its_open_files_soft_limit_to_the_hard_limit(tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= DEFAULT_SOFT_LIMIT:
        pytest.skip(f"the hard open-files limit is {hard}: there is nothing to raise")
    with app_with_default_soft_limit(tmp_path) as app:
        app.wait_until_serving(path="/a2a/health")
        soft, hard = open_files_limit_of(app.process.pid)
        assert soft == hard or (hard == float("inf") and soft >= 10_240), (soft, hard)
        assert f"open-files limit raised from {DEFAULT_SOFT_LIMIT} to {soft}" in app.output


def test_1100_half_sent_requests_do_not_stop_a_fresh_request_and_are_closed_after_the_header_timeout(
    tmp_path: Path,
    room_for_sockets: None,
) -> None:
    header_timeout_s = 4.0
    with app_with_default_soft_limit(tmp_path, HTTP_HEADER_TIMEOUT_S=str(header_timeout_s)) as app:
        app.wait_until_serving(path="/a2a/health")
        attack = half_open(port_of(app), 1_100)
        try:
            took = health_time(app)
            print(f"GET /a2a/health with 1,100 half-sent requests held: {took * 1000:.0f} ms")
            closed = wait_for_closes(attack, within_s=header_timeout_s + 20)
            assert len(closed) == len(attack), f"{len(attack) - len(closed)} half-sent requests still open"
            soonest = min(closed[sock] - connected for sock, connected in attack)
            assert soonest >= header_timeout_s - 0.5, f"one was closed {soonest:.1f} s after it connected"
        finally:
            close_all(attack)
        assert health_time(app) < 5


def test_one_address_holds_no_more_than_its_cap_and_gets_its_room_back(tmp_path: Path) -> None:
    cap = 50
    with app_process(
        tmp_path / "data", MAX_CONNECTIONS_PER_ADDRESS=str(cap), HTTP_HEADER_TIMEOUT_S="60", TRUSTED_PROXIES=PROXY
    ) as app:
        app.wait_until_serving(path="/a2a/health")
        attack = half_open(port_of(app), cap + 30)
        try:
            refused = wait_for_closes(attack, within_s=3)
            assert len(refused) == 30, f"the server kept {len(attack) - len(refused)} of {len(attack)}"
            assert all(sock not in refused for sock, _ in attack[:cap]), "an early connection was closed"
            assert health_time(app) < 5  # another address is not held back
            over = http.client.HTTPConnection("127.0.0.1", port_of(app), timeout=5, source_address=(ATTACKER, 0))
            over.request("GET", "/a2a/health")
            answer = over.getresponse()
            assert answer.status == 429 and b'"code": "too_many_connections"' in answer.read()
            over.close()
            close_all(attack[:10])
            assert get_from_attacker_eventually(app, within_s=5) == 200  # the closed ones are given back
        finally:
            close_all(attack)
        # A trusted proxy's users all share its address: it is not capped.
        proxied = half_open(port_of(app), cap + 30, source=PROXY)
        try:
            assert wait_for_closes(proxied, within_s=2) == {}
        finally:
            close_all(proxied)


def get_from_attacker_eventually(app: AppProcess, *, within_s: float) -> int:
    """`GET /a2a/health` from ATTACKER, retried until it is not refused; the last status."""
    deadline = time.monotonic() + within_s
    status = 0
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port_of(app), timeout=5, source_address=(ATTACKER, 0))
        try:
            conn.request("GET", "/a2a/health")
            status = conn.getresponse().status
        except (ConnectionError, http.client.HTTPException):
            status = 0
        finally:
            conn.close()
        if status == 200:
            break
        time.sleep(0.1)
    return status


@pytest.fixture(scope="module")
def quick_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppProcess]:
    """A header timeout of 1 s, shorter than uvicorn's keep-alive of 5 s, and a cap of 20 per address."""
    data = tmp_path_factory.mktemp("slow-clients") / "data"
    with app_process(data, HTTP_HEADER_TIMEOUT_S="1", MAX_CONNECTIONS_PER_ADDRESS="20") as app:
        app.wait_until_serving(path="/a2a/health")
        yield app


def test_a_keep_alive_connection_may_wait_between_requests_but_not_inside_headers(quick_app: AppProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port_of(quick_app), timeout=10, source_address=(ATTACKER, 0))
    try:
        conn.request("GET", "/a2a/health")
        assert conn.getresponse().read() and conn.sock is not None
        sock = conn.sock
        time.sleep(2.0)  # idle longer than the header timeout, shorter than the keep-alive timeout
        conn.request("GET", "/a2a/health")
        second = conn.getresponse()
        assert second.status == 200 and second.read()
        assert conn.sock is sock, "the second request needed a new connection"
        started = time.monotonic()
        sock.sendall(HALF_REQUEST)  # the next request, never finished
        sock.settimeout(10)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        assert 0.8 <= time.monotonic() - started <= 5, time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408")
    finally:
        conn.close()


def test_websockets_outlive_the_header_timeout_and_give_their_count_back(quick_app: AppProcess) -> None:
    port = port_of(quick_app)

    def attacker_socket() -> socket.socket:
        sock = socket.socket()
        sock.bind((ATTACKER, 0))
        sock.connect(("127.0.0.1", port))
        return sock

    # The broker's socket and NiceGUI's socket.io stay open past the header timeout.
    with (
        ws_connect(f"ws://127.0.0.1:{port}/a2a?a2a_id=patient", sock=attacker_socket(), open_timeout=10) as agent,
        ws_connect(
            f"ws://127.0.0.1:{port}/_nicegui_ws/socket.io/?EIO=4&transport=websocket",
            sock=attacker_socket(),
            open_timeout=10,
        ) as page,
    ):
        assert page.recv(timeout=10).startswith("0{")  # Engine.IO's open packet
        time.sleep(2.0)
        agent.ping().wait(timeout=5)
        page.send("40")  # Socket.IO's connect: answered "40…" (or "44…", refused) on a live socket
        answers = [page.recv(timeout=5)]
        while answers[-1] == "2" and len(answers) < 3:  # a ping of the server's may come first
            answers.append(page.recv(timeout=5))
        assert answers[-1].startswith(("40", "44")), answers
    # More WebSockets one after the other than the cap: each one's count is given back when it closes.
    for i in range(30):
        with ws_connect(f"ws://127.0.0.1:{port}/a2a?a2a_id=visitor-{i}", sock=attacker_socket(), open_timeout=10) as ws:
            ws.ping().wait(timeout=5)
