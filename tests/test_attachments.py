"""Files and data (issue 36, item 2): uploads with caps, owner-only downloads, files through delegations
to local and remote agents, the callee's file and data artifacts back in the panel's stream, and a served
agent's `/file` and `/data` over A2A. Real HTTP on 127.0.0.1; the remote agent is a plain a2a-sdk 1.3 agent
(`tests/utils/a2a_files_agent.py`) that records what it got.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from a2a.types import Message, Part, Role, SendMessageRequest
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict

from core.chat.attachment_routes import UPLOAD_FRAMING_BYTES, upload_path_pattern
from core.chat.demo_model import _tiny_png
from core.services import Services
from core.web.body_cap import BodyCapMiddleware
from core.web.errors import install_error_handlers
from tests.conftest import make_settings
from tests.test_a2a_client import chat, register, task_events
from tests.utils.a2a_files_agent import PNG, files_agent
from tests.utils.a2a_live import LiveApp, build_a2a_app, create_key, sdk_client, user_message
from tests.utils.live_server import live_server
from tests.utils.ports import free_port

LOCAL = ["127.0.0.1"]


@contextmanager
def live_files_app(tmp_path: Path, *, accounts: bool = False, **settings) -> Iterator[LiveApp]:
    """The API and A2A routes as app.py serves them: errors with their codes, bodies capped (uploads their own)."""
    port = free_port()
    values = {
        "database_url": f"sqlite:///{tmp_path / 'data' / 'app.db'}",
        "public_base_url": f"http://127.0.0.1:{port}",
        "port": port,
        "max_request_body_bytes": 65_536,
        **settings,
    }
    services = Services.build(make_settings(tmp_path, **values))
    services.prepare()
    app = build_a2a_app(services)
    install_error_handlers(app)
    app.add_middleware(
        BodyCapMiddleware,
        limit=services.settings.max_request_body_bytes,
        prefixes=("/api/",),
        larger=((upload_path_pattern(), services.settings.upload_max_bytes + UPLOAD_FRAMING_BYTES),),
    )
    with live_server(app, port=port) as url:
        yield LiveApp(url=url, services=services, key="" if accounts else create_key(url))


@pytest.fixture
def app(tmp_path: Path) -> Iterator[LiveApp]:
    """The app on a live port (demo model, no delay), uploads capped at 100 KB, files over 1 KiB sent as links."""
    with live_files_app(
        tmp_path,
        demo_model_delay_ms=0,
        outbound_allow_hosts=LOCAL,
        upload_max_bytes=100_000,
        a2a_file_inline_max_bytes=1024,
    ) as live:
        yield live


def new_session(app: LiveApp, agent: str = "general-assistant") -> str:
    return httpx.post(f"{app.url}/api/sessions", json={"agentId": agent}).json()["id"]


def upload(app: LiveApp, session: str, name: str, data: bytes, mime: str, **kwargs) -> httpx.Response:
    return httpx.post(
        f"{app.url}/api/sessions/{session}/attachments", files={"file": (name, data, mime)}, timeout=10, **kwargs
    )


def send(app: LiveApp, session: str, text: str, ids: list[str]) -> None:
    posted = httpx.post(
        f"{app.url}/api/sessions/{session}/messages", json={"content": text, "attachmentIds": ids}, timeout=10
    )
    assert posted.status_code == 202, posted.text
    deadline = time.monotonic() + 30
    while httpx.get(f"{app.url}/api/sessions/{session}").json()["running"]:
        assert time.monotonic() < deadline, "the turn did not end"
        time.sleep(0.05)


def task_of(app: LiveApp, session: str) -> dict:
    [task] = [t for t in httpx.get(f"{app.url}/api/tasks").json() if t["callerSessionId"] == session]
    return task


def artifacts_of(app: LiveApp, task_id: str) -> list[dict]:
    return [data for kind, data in task_events(app, task_id) if kind == "a2a-artifact"]


def test_an_upload_is_downloaded_by_its_owner_and_a_message_carries_it_to_the_model(app: LiveApp) -> None:
    session = new_session(app)
    created = upload(app, session, "notes.txt", b"buy milk\n", "text/plain")
    assert created.status_code == 201, created.text
    file = created.json()
    assert (file["name"], file["mime"], file["size"]) == ("notes.txt", "text/plain", 9)
    assert file["id"].startswith("at_") and file["url"] == f"/api/attachments/{file['id']}"

    got = httpx.get(f"{app.url}{file['url']}")
    assert got.status_code == 200 and got.content == b"buy milk\n"
    assert got.headers["content-type"].startswith("text/plain")
    assert got.headers["x-content-type-options"] == "nosniff"
    assert got.headers["content-disposition"] == "attachment; filename*=UTF-8''notes.txt"
    assert "sandbox" in got.headers["content-security-policy"]
    image = upload(app, session, "dot.png", PNG, "image/png").json()
    shown = httpx.get(f"{app.url}{image['url']}")
    assert shown.headers["content-disposition"].startswith("inline;") and shown.content == PNG

    send(app, session, "what is in these?", [file["id"], image["id"]])
    user, answer = httpx.get(f"{app.url}/api/sessions/{session}/messages").json()[-2:]
    assert [a["id"] for a in user["attachments"]] == [file["id"], image["id"]]
    assert "Received file: notes.txt (text/plain, 9 bytes)" in answer["content"]
    assert f"Received file: dot.png (image/png, {len(PNG)} bytes)" in answer["content"]
    assert "> what is in these?" in answer["content"]


def test_upload_caps_answer_413_and_415_with_their_codes(app: LiveApp) -> None:
    session = new_session(app)
    # Larger than the API's body cap (64 KiB here), within the upload's own.
    assert upload(app, session, "fits.txt", b"x" * 100_000, "text/plain").status_code == 201
    # Larger than the API's body cap (64 KiB here), within the upload's own.
    assert upload(app, session, "fits.txt", b"x" * 100_000, "text/plain").status_code == 201
    too_large = upload(app, session, "big.txt", b"x" * 100_001, "text/plain")
    assert too_large.status_code == 413 and too_large.json()["code"] == "attachment_too_large"
    far_too_large = upload(app, session, "huge.txt", b"x" * 200_000, "text/plain")  # refused before it is read
    assert far_too_large.status_code == 413 and far_too_large.json()["code"] == "too_large"
    for name, mime in [("page.html", "text/html"), ("logo.svg", "image/svg+xml"), ("run.exe", "")]:
        refused = upload(app, session, name, b"<svg onload=alert(1)>", mime)
        if mime == "text/html":  # text/* is allowed by default; HTML is still never shown inline
            assert refused.status_code == 201
            served = httpx.get(f"{app.url}{refused.json()['url']}")
            assert served.headers["content-disposition"].startswith("attachment;")
            continue
        assert refused.status_code == 415, (name, refused.text)
        assert refused.json()["code"] == "attachment_type_refused"
    assert upload(app, "as_nosuchsession", "a.txt", b"a", "text/plain").status_code == 404


def test_someone_elses_file_is_not_found(tmp_path: Path, database_url: str) -> None:
    from tests.utils.accounts import ALICE, BOB, seed_accounts

    seed_accounts(tmp_path, database_url)
    with live_files_app(tmp_path, accounts=True, database_url=database_url, demo_model_delay_ms=0) as live:
        alice_session = httpx.post(f"{live.url}/api/sessions", json={}, auth=ALICE).json()["id"]
        file = upload(live, alice_session, "secret.txt", b"alice only", "text/plain", auth=ALICE).json()
        assert httpx.get(f"{live.url}{file['url']}", auth=ALICE).status_code == 200
        theirs = httpx.get(f"{live.url}{file['url']}", auth=BOB)
        missing = httpx.get(f"{live.url}/api/attachments/at_000000000000000000000000", auth=BOB)
        assert theirs.status_code == missing.status_code == 404
        assert theirs.json() == missing.json()
        # Nor can bob upload into alice's chat, or send her file in a chat of his.
        assert upload(live, alice_session, "x.txt", b"x", "text/plain", auth=BOB).status_code == 404
        bob_session = httpx.post(f"{live.url}/api/sessions", json={}, auth=BOB).json()["id"]
        sent = httpx.post(
            f"{live.url}/api/sessions/{bob_session}/messages",
            json={"content": "hi", "attachmentIds": [file["id"]]},
            auth=BOB,
        )
        assert sent.status_code == 404 and sent.json()["code"] == "attachment_not_found"
        # Without a login there is no file at all, and a link token opens only its own file.
        assert httpx.get(f"{live.url}{file['url']}").status_code == 401
        assert httpx.get(f"{live.url}{file['url']}/link", params={"token": "nope"}).status_code == 404


def test_a_local_callee_gets_the_callers_files_and_its_file_and_data_come_back(app: LiveApp) -> None:
    session = new_session(app)
    file = upload(app, session, "plan.txt", b"step one\n", "text/plain").json()
    send(app, session, "@coding-assistant look at this", [file["id"]])
    task = task_of(app, session)
    detail = httpx.get(f"{app.url}/api/tasks/{task['id']}").json()
    callee_input, callee_answer = detail["messages"]
    assert [a["id"] for a in callee_input["attachments"]] == [file["id"]]
    assert "Received file: plan.txt (text/plain, 9 bytes)" in callee_answer["content"]

    session = chat(app, "@coding-assistant /file chart.png")
    task = task_of(app, session)
    [artifact] = artifacts_of(app, task["id"])
    assert (artifact["artifactKind"], artifact["name"], artifact["mime"]) == ("file", "chart.png", "image/png")
    got = httpx.get(f"{app.url}/api/attachments/{artifact['attachmentId']}")
    assert got.status_code == 200 and got.content == _tiny_png() and artifact["size"] == len(got.content)
    answer = httpx.get(f"{app.url}/api/sessions/{session}/messages").json()[-1]["content"]
    assert f"Returned file: chart.png (image/png, {len(got.content)} bytes)" in answer and "```artifact" not in answer

    session = chat(app, "@coding-assistant /data")
    [artifact] = artifacts_of(app, task_of(app, session)["id"])
    assert artifact["artifactKind"] == "data" and artifact["data"] == {"days": 3, "ok": True, "ratio": 0.5}
    assert type(artifact["data"]["days"]) is int


def test_a_file_reaches_a_remote_a2a_agent_as_a_file_part_and_its_artifacts_come_back(app: LiveApp) -> None:
    with files_agent() as (card_url, received):
        assert register(app, card_url, "files").status_code == 201
        served = httpx.get(f"{app.url}/a2a/agents/files/.well-known/agent-card.json", headers={"A2A-Version": "1.0"})
        # Served on, it takes and gives what its own card says.
        assert served.json()["defaultInputModes"] == ["text/plain", "image/png", "text/*"]
        assert served.json()["defaultOutputModes"] == ["text/plain", "image/png", "application/json"]
        session = new_session(app)
        small = upload(app, session, "dot.png", PNG, "image/png").json()
        large = upload(app, session, "long.txt", b"y" * 2000, "text/plain").json()  # over the 1 KiB inline limit
        send(app, session, "@files have a look", [small["id"], large["id"]])
        [message] = received
        text, png, link = message["parts"]
        assert text == {"text": "have a look"}
        assert png == {"raw": base64.b64encode(PNG).decode(), "filename": "dot.png", "mediaType": "image/png"}
        assert (link["filename"], link["mediaType"]) == ("long.txt", "text/plain")
        assert link["url"].startswith(f"{app.url}/api/attachments/{large['id']}/link?token=")
        assert httpx.get(link["url"]).content == b"y" * 2000  # the link opens that one file, without a login
        other = link["url"].replace(large["id"], small["id"])
        assert httpx.get(other).status_code == 404
        answer = httpx.get(f"{app.url}/api/sessions/{session}/messages").json()[-1]["content"]
        assert f"Got 2 file(s): dot.png (image/png, {len(PNG)} bytes), long.txt (text/plain, 0 bytes)" in answer

        session = chat(app, "@files /artifacts please")
        task = task_of(app, session)
        file, data = artifacts_of(app, task["id"])
        assert (file["artifactKind"], file["name"], file["mime"]) == ("file", "chart.png", "image/png")
        assert httpx.get(f"{app.url}/api/attachments/{file['attachmentId']}").content == PNG
        assert data["artifactKind"] == "data" and data["data"] == {"days": 3, "ok": True}
        assert type(data["data"]["days"]) is int


async def test_a_served_agent_returns_file_and_data_artifacts_over_a2a(app: LiveApp) -> None:
    for streaming, only_v03 in ((False, False), (True, False), (True, True)):  # v0.3 through the SDK's compat layer
        async with sdk_client(app.agent_url("coding-assistant"), app.key, streaming=streaming, only_v03=only_v03) as (
            client,
            card,
        ):
            assert "application/json" in card.default_output_modes and "image/png" in card.default_output_modes
            assert "application/json" in card.default_input_modes
            parts = []
            async for response in client.send_message(user_message("/file chart.png")):
                found = MessageToDict(response)
                parts += [p for a in found.get("task", {}).get("artifacts", []) for p in a["parts"]]
                parts += found.get("artifactUpdate", {}).get("artifact", {}).get("parts", [])
            assert {
                "raw": base64.b64encode(_tiny_png()).decode(),
                "filename": "chart.png",
                "mediaType": "image/png",
            } in parts
            assert {"text": "Here is chart.png."} in parts
            parts = []
            async for response in client.send_message(user_message("/data")):
                found = MessageToDict(response)
                parts += [p for a in found.get("task", {}).get("artifacts", []) for p in a["parts"]]
                parts += found.get("artifactUpdate", {}).get("artifact", {}).get("parts", [])
            [data] = [p["data"] for p in parts if "data" in p]
            assert data == {"days": 3, "ok": True, "ratio": 0.5}


async def test_a_data_part_reaches_the_callee_with_its_integers_whole(app: LiveApp) -> None:
    data = ParseDict({"days": 3}, struct_pb2.Value())
    message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[Part(data=data)])
    async with sdk_client(app.agent_url("general-assistant"), app.key, streaming=False) as (client, _card):
        [response] = [r async for r in client.send_message(SendMessageRequest(message=message))]
    task = MessageToDict(response)["task"]
    detail = httpx.get(f"{app.url}/api/tasks/{task['id']}").json()
    assert detail["messages"][0]["content"] == '{"days": 3}'
    assert '> {"days": 3}' in detail["messages"][1]["content"]


async def test_a_served_agent_takes_file_parts_as_uploads(app: LiveApp) -> None:
    url = app.agent_url("general-assistant")
    card = httpx.get(f"{url}/.well-known/agent-card.json", headers={"A2A-Version": "1.0"}).json()
    assert {"application/json", "image/png", "text/*"} <= set(card["defaultInputModes"])
    note = Part(raw=b"hello", filename="note.txt", media_type="text/plain")
    message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[Part(text="read this"), note])
    async with sdk_client(url, app.key, streaming=False) as (client, _card):
        [response] = [r async for r in client.send_message(SendMessageRequest(message=message))]
    task = MessageToDict(response)["task"]
    asked, answer = httpx.get(f"{app.url}/api/tasks/{task['id']}").json()["messages"]
    [ref] = asked["attachments"]
    assert (ref["name"], ref["mime"], ref["size"]) == ("note.txt", "text/plain", 5)
    assert "Received file: note.txt (text/plain, 5 bytes)" in answer["content"]
    assert httpx.get(f"{app.url}/api/attachments/{ref['id']}").content == b"hello"  # the key's user owns it

    refused = Part(raw=b"MZ", filename="run.exe", media_type="application/x-msdownload")
    message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[Part(text="run it"), refused])
    body = MessageToDict(SendMessageRequest(message=message))
    response = httpx.post(
        url,
        json={"jsonrpc": "2.0", "id": "r1", "method": "SendMessage", "params": body},
        headers={"Authorization": f"Bearer {app.key}", "A2A-Version": "1.0"},
    )
    assert response.json()["error"]["code"] == -32005
    assert "application/x-msdownload" in response.json()["error"]["message"]
