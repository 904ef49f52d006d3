"""The public files (`/assets/*`, `/favicon.ico`): served to anyone, and nothing outside their folder."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.utils.app_process import AppProcess, app_process


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppProcess]:
    with app_process(tmp_path_factory.mktemp("public-files") / "data") as running:
        running.wait_until_serving()
        yield running


def raw_get(app: AppProcess, target: str) -> tuple[int, bytes]:
    """GET `target` exactly as written (no client normalises its dots)."""
    port = int(app.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_the_apps_assets_and_icon_are_public(app: AppProcess) -> None:
    css = httpx.get(f"{app.base_url}/assets/app.css", timeout=5)
    assert css.status_code == 200 and "text/css" in css.headers["content-type"]
    icon = httpx.get(f"{app.base_url}/favicon.ico", timeout=5)
    assert icon.status_code == 200 and icon.content


@pytest.mark.parametrize(
    "target",
    [
        "/assets/../app.py",
        "/assets/%2e%2e/app.py",
        "/assets/..%2fapp.py",
        "/assets/%2e%2e%2fapp.py",
        "/assets/../config/server.json",
        "/assets/..%5capp.py",
        "/assets//etc/passwd",
        "/assets/%2fetc%2fpasswd",
    ],
)
def test_nothing_outside_the_assets_folder_is_served(app: AppProcess, target: str) -> None:
    status, body = raw_get(app, target)
    assert status in (400, 404), status
    assert b"def main" not in body and b"root:" not in body and b"_max_message_chars" not in body
