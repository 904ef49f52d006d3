"""DNS rebinding and cross-site requests against a live `python app.py` (single-user mode, the default).

Without accounts, anyone who can make the user's browser send a request to 127.0.0.1 acts as the
user. These tests send what such a page would: a foreign `Host` (DNS rebinding) or a foreign
`Origin` (a cross-site form, fetch or WebSocket), and check that nothing is read or changed.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.web.request_guards import host_name
from tests.utils.app_process import AppProcess, app_process

EVIL_ORIGIN = "http://evil.example"


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppProcess]:
    data = tmp_path_factory.mktemp("guards") / "data"
    with app_process(data, TRUSTED_HOSTS="chat.lan", PUBLIC_BASE_URL="https://chat.example.org") as running:
        running.wait_until_serving()
        yield running


def ws_handshake(app: AppProcess, path: str, **headers: str) -> str:
    """Open a WebSocket handshake by hand; the status line of the answer."""
    port = int(app.base_url.rsplit(":", 1)[1])
    lines = {
        "Host": f"127.0.0.1:{port}",
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
        **headers,
    }
    request = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in lines.items()) + "\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request.encode())
        return sock.recv(4096).split(b"\r\n", 1)[0].decode()


def keys(app: AppProcess) -> list[dict]:
    return httpx.get(f"{app.base_url}/api/a2a/keys", timeout=5).json()


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:3100", "10.0.0.5", "[fe80::1]:80"])
def test_a_host_the_server_does_not_answer_to_is_refused(app: AppProcess, host: str) -> None:
    before = len(keys(app))
    for method, path, body in [
        ("GET", "/api/sessions", None),
        ("GET", "/", None),
        ("POST", "/api/a2a/keys", {"name": "rebound"}),
        ("GET", "/docs", None),
    ]:
        response = httpx.request(method, f"{app.base_url}{path}", json=body, headers={"Host": host}, timeout=5)
        assert response.status_code == 400, (method, path)
        detail = response.json()["detail"]
        assert "does not answer to the name" in detail and "TRUSTED_HOSTS" in detail
    assert len(keys(app)) == before
    assert ws_handshake(app, "/a2a?a2a_id=rebound", Host=host).startswith("HTTP/1.1 403")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "chat.lan", "chat.example.org", "CHAT.LAN:8080"])
def test_the_names_it_answers_to(app: AppProcess, host: str) -> None:
    response = httpx.get(f"{app.base_url}/api/sessions", headers={"Host": host}, timeout=5)
    assert response.status_code == 200


def test_another_sites_changes_and_sockets_are_refused(app: AppProcess) -> None:
    before = len(keys(app))
    forged = httpx.post(
        f"{app.base_url}/api/a2a/keys", json={"name": "csrf"}, headers={"Origin": EVIL_ORIGIN}, timeout=5
    )
    assert forged.status_code == 403 and "another site" in forged.json()["detail"]
    null_origin = httpx.post(f"{app.base_url}/api/sessions", json={}, headers={"Origin": "null"}, timeout=5)
    assert null_origin.status_code == 403
    assert len(keys(app)) == before
    assert ws_handshake(app, "/a2a?a2a_id=intruder", Origin=EVIL_ORIGIN).startswith("HTTP/1.1 403")
    agents = httpx.get(f"{app.base_url}/a2a/agents", timeout=5).json()["agents"]
    assert "intruder" not in {a["a2a_id"] for a in agents}
    # Reading is not a change: a cross-site GET gets the page (the browser keeps it from the other site).
    assert httpx.get(f"{app.base_url}/a2a/health", headers={"Origin": EVIL_ORIGIN}, timeout=5).status_code == 200


def test_the_apps_own_pages_and_non_browser_clients_are_accepted(app: AppProcess) -> None:
    own = httpx.post(
        f"{app.base_url}/api/a2a/keys", json={"name": "own page"}, headers={"Origin": app.base_url}, timeout=5
    )
    assert own.status_code == 201
    behind_proxy = httpx.post(
        f"{app.base_url}/api/a2a/keys",
        json={"name": "public url"},
        headers={"Origin": "https://chat.example.org"},
        timeout=5,
    )
    assert behind_proxy.status_code == 201
    assert httpx.post(f"{app.base_url}/api/a2a/keys", json={"name": "curl"}, timeout=5).status_code == 201
    assert ws_handshake(app, "/a2a?a2a_id=piped").startswith("HTTP/1.1 101")  # agents send no Origin
    assert ws_handshake(app, "/a2a?a2a_id=same-site", Origin=app.base_url).startswith("HTTP/1.1 101")


def test_the_session_cookie_is_same_site(app: AppProcess) -> None:
    cookie = httpx.get(f"{app.base_url}/", timeout=5).headers["set-cookie"].lower()
    assert "samesite=lax" in cookie and "httponly" in cookie
    assert "secure" in cookie  # PUBLIC_BASE_URL is https here


def test_any_name_only_when_asked(tmp_path: Path) -> None:
    with app_process(tmp_path / "data", TRUSTED_HOSTS="*") as running:
        running.wait_until_serving()
        response = httpx.get(f"{running.base_url}/api/sessions", headers={"Host": "anything.example"}, timeout=5)
        assert response.status_code == 200


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:3100", "127.0.0.1"),
        ("LOCALHOST", "localhost"),
        ("[::1]:3100", "::1"),
        ("[::1]", "::1"),
        ("example.org", "example.org"),
        ("::1", "::1"),
        ("", ""),
    ],
)
def test_host_name(header: str, name: str) -> None:
    assert host_name(header) == name


@pytest.mark.parametrize(
    ("env", "forwarded_for", "refused"),
    [
        ({"BLACKLIST_IP": "127.0.0.1"}, "203.0.113.9", True),  # a forged header does not hide the peer
        ({"BLACKLIST_IP": "203.0.113.0/24"}, "203.0.113.9", False),  # nor does it count for anything
        ({"BLACKLIST_IP": "203.0.113.0/24", "TRUSTED_PROXIES": "127.0.0.1"}, "203.0.113.9", True),  # from a proxy
    ],
)
def test_x_forwarded_for_is_believed_only_from_trusted_proxies(tmp_path: Path, env, forwarded_for, refused) -> None:
    with app_process(tmp_path / "data", **env) as running:
        running.wait_until_serving()
        status = ws_handshake(running, "/a2a?a2a_id=behind", **{"X-Forwarded-For": forwarded_for})
        assert status.startswith("HTTP/1.1 403" if refused else "HTTP/1.1 101"), status


def test_an_unparseable_blacklist_entry_stops_the_start_with_the_reason(tmp_path: Path) -> None:
    with app_process(tmp_path / "data", BLACKLIST_IP="127.0.0.1,evil-host") as running:
        assert running.process.wait(timeout=30) != 0
        assert "blacklist_ip: 'evil-host' is not an IP address or network" in running.output
        assert "Traceback" not in running.output
