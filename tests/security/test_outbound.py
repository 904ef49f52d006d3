"""Server-side request forgery (issue 12, items 5-7): what the app fetches, from where, how much, with which token.

The targets are real HTTP servers on 127.0.0.1 that record every request they
get (`Recorder`), so "refused" means: no request reached them. Host names that
look public are pointed at 127.0.0.1 by a patched resolver (`fake_dns`).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import ssl
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse

from core.a2a import client as a2a_client
from core.a2a import outbound
from core.a2a.remote_agents import RegistrationError
from core.delegation import RemoteAgentError
from core.services import Services
from tests.conftest import make_settings
from tests.utils.a2a_live import live_a2a_app
from tests.utils.broker import FakeAgent, broker_app, serve_app

SECRET = "adminToken-7f3e9a1c"  # what an internal service would give away
TOKEN = "registered-bearer-token"
MiB = 1 << 20


@dataclass
class Recorder:
    """A target server's log: every request (method, path, Authorization, Host) and the body bytes it streamed."""

    url: str = ""
    hits: list[tuple[str, str, str | None, str | None]] = field(default_factory=list)
    streamed: int = 0

    @property
    def authorizations(self) -> list[str | None]:
        """The Authorization header of every request, in order."""
        return [hit[2] for hit in self.hits]


def card(name: str, endpoint: str) -> dict[str, Any]:
    """A v1.0 card with one JSON-RPC interface at `endpoint`."""
    return {
        "name": name,
        "description": "records what it gets",
        "version": "1.0",
        "supportedInterfaces": [{"url": endpoint, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "capabilities": {"streaming": False},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [{"id": "rec", "name": "Record", "description": "d"}],
    }


def recorder_app(recorder: Recorder) -> FastAPI:
    """The target: a card (its endpoint: `?endpoint=`, else itself), redirects, a secret, a huge body."""
    app = FastAPI()

    @app.middleware("http")
    async def record(request: Request, call_next: Any) -> Any:
        recorder.hits.append(
            (request.method, request.url.path, request.headers.get("authorization"), request.headers.get("host"))
        )
        return await call_next(request)

    @app.get("/card.json")
    async def the_card(request: Request) -> dict[str, Any]:
        return card("Recorder", request.query_params.get("endpoint") or str(request.base_url))

    @app.get("/redirect")
    async def redirect(to: str) -> RedirectResponse:
        return RedirectResponse(to, status_code=302)

    @app.get("/loop")
    async def loop() -> RedirectResponse:
        return RedirectResponse("/loop", status_code=302)

    @app.get("/secret.json")
    async def secret() -> dict[str, Any]:
        return {"adminToken": SECRET, "description": SECRET}

    @app.get("/missing.json")
    async def missing() -> JSONResponse:
        return JSONResponse({"error": f"no such card; {SECRET}"}, status_code=404)

    async def chunks() -> AsyncIterator[bytes]:
        chunk = b"x" * (64 * 1024)
        for _ in range(200 * MiB // len(chunk)):  # 200 MiB, with no Content-Length
            recorder.streamed += len(chunk)
            yield chunk

    @app.get("/big.json")
    async def big() -> StreamingResponse:
        return StreamingResponse(chunks(), media_type="application/json")

    @app.post("/big")
    async def big_answer() -> StreamingResponse:
        return StreamingResponse(chunks(), media_type="application/json")

    @app.post("/")
    async def json_rpc() -> JSONResponse:
        return JSONResponse({"error": "this recorder does not run tasks"}, status_code=401)

    return app


@asynccontextmanager
async def recording() -> AsyncIterator[Recorder]:
    """A recorder served on 127.0.0.1 on this loop."""
    recorder = Recorder()
    async with serve_app(recorder_app(recorder)) as host:
        recorder.url = f"http://{host}"
        yield recorder


@pytest.fixture
async def target() -> AsyncIterator[Recorder]:
    """The recorder the card URLs point at."""
    async with recording() as recorder:
        yield recorder


@pytest.fixture
async def other() -> AsyncIterator[Recorder]:
    """A second recorder: another port, so another origin than `target`."""
    async with recording() as recorder:
        yield recorder


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dict[str, list[str]], Counter]]:
    """Names to answer with given addresses (in turn, the last one repeating); counts the lookups."""
    names: dict[str, list[str]] = {}
    lookups: Counter = Counter()
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name in names:
            answers = names[name]
            lookups[name] += 1
            return real(answers[min(lookups[name], len(answers)) - 1], port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield names, lookups


NOBODY = outbound.AllowList()
LOOPBACK = outbound.AllowList.parse(["127.0.0.1"])


async def refused(url: str, allow: outbound.AllowList = NOBODY, **kwargs: Any) -> str:
    """The category `fetch_card_json` refuses `url` with."""
    with pytest.raises(outbound.CardFetchError) as failure:
        await outbound.fetch_card_json(url, allow=allow, **kwargs)
    assert str(failure.value) == f"could not fetch the card: {failure.value.category}"
    return failure.value.category


# -- item 5: where a card may come from ---------------------------------------------------------------


async def test_loopback_in_every_spelling_is_refused_before_any_request(target: Recorder) -> None:
    port = target.url.rsplit(":", 1)[1]
    for host in ["127.0.0.1", "localhost", "2130706433", "0x7f.1", "[::1]", "[::ffff:127.0.0.1]"]:
        assert await refused(f"http://{host}:{port}/card.json") == "not allowed: a loopback address", host
    assert target.hits == []
    assert await outbound.fetch_card_json(f"{target.url}/card.json", allow=LOOPBACK)  # the same, allow-listed
    assert len(target.hits) == 1


async def test_private_link_local_metadata_and_unspecified_addresses_are_refused() -> None:
    cases = {
        "http://10.1.2.3/card.json": "not allowed: a private address",
        "http://192.168.0.10:6379/": "not allowed: a private address",
        "http://169.254.169.254/latest/meta-data/": "not allowed: a cloud metadata address",
        "http://[fd00:ec2::254]/": "not allowed: a cloud metadata address",
        "http://169.254.1.1/": "not allowed: a link-local address",
        "http://0.0.0.0:5432/": "not allowed: an unspecified address",
        "http://224.0.0.1/": "not allowed: a multicast address",
        "file:///etc/passwd": "not allowed: only http and https URLs are fetched",
    }
    for url, category in cases.items():
        assert await refused(url) == category, url
    # A host name on the allow-list does not unlock the metadata address; only the address itself does.
    assert (
        await refused("http://169.254.169.254/", outbound.AllowList.parse(["169.254.169.254.nip.io"]))
        == "not allowed: a cloud metadata address"
    )


async def test_a_public_looking_name_that_resolves_to_loopback_is_refused(target: Recorder, fake_dns: Any) -> None:
    names, _ = fake_dns
    names["agents.example.com"] = ["127.0.0.1"]
    port = target.url.rsplit(":", 1)[1]
    assert await refused(f"http://agents.example.com:{port}/card.json") == "not allowed: a loopback address"
    assert target.hits == []


async def test_the_connection_goes_to_the_address_that_was_checked(target: Recorder, fake_dns: Any) -> None:
    """DNS rebinding: the name is resolved once, and the request sent to that address (with its own Host)."""
    names, lookups = fake_dns
    names["agents.example.com"] = ["127.0.0.1", "10.255.255.1"]  # a second lookup would get somewhere else
    port = target.url.rsplit(":", 1)[1]
    data = await outbound.fetch_card_json(
        f"http://agents.example.com:{port}/card.json",
        allow=outbound.AllowList.parse(["agents.example.com"]),
        timeout_s=3,
    )
    assert data["name"] == "Recorder"
    assert lookups["agents.example.com"] == 1
    assert target.hits == [("GET", "/card.json", None, f"agents.example.com:{port}")]


def tls_files(directory: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA and a certificate for `name` signed by it: (certificate, key, CA certificate) files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])

    def signed(subject: x509.Name, public_key: Any, extension: Any) -> x509.Certificate:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(extension, critical=False)
            .sign(ca_key, hashes.SHA256())
        )

    ca = signed(ca_name, ca_key.public_key(), x509.BasicConstraints(ca=True, path_length=None))
    leaf = signed(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]),
        key.public_key(),
        x509.SubjectAlternativeName([x509.DNSName(name)]),
    )
    files = directory / "leaf.pem", directory / "key.pem", directory / "ca.pem"
    files[0].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    files[1].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    files[2].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return files


async def test_https_to_the_checked_address_still_checks_the_certificate_against_the_name(
    tmp_path: Path, fake_dns: Any
) -> None:
    names, _ = fake_dns
    names["agents.example.com"] = names["impostor.example.com"] = ["127.0.0.1"]
    certificate, key, ca = tls_files(tmp_path, "agents.example.com")
    recorder = Recorder()
    async with serve_app(recorder_app(recorder), ssl_certfile=str(certificate), ssl_keyfile=str(key)) as host:
        port = host.rsplit(":", 1)[1]
        allow = outbound.AllowList.parse(["agents.example.com", "impostor.example.com"])
        transport = outbound.GuardedTransport(
            allow, transport=lambda: httpx.AsyncHTTPTransport(verify=ssl.create_default_context(cafile=str(ca)))
        )
        async with httpx.AsyncClient(transport=transport) as http:
            good = await http.get(f"https://agents.example.com:{port}/card.json")
            assert good.json()["name"] == "Recorder"
            with pytest.raises(httpx.ConnectError, match="not valid for 'impostor.example.com'"):
                await http.get(f"https://impostor.example.com:{port}/card.json")
    assert recorder.hits == [("GET", "/card.json", None, f"agents.example.com:{port}")]


async def test_every_redirect_is_checked_again(target: Recorder, other: Recorder, fake_dns: Any) -> None:
    names, _ = fake_dns
    names["public.example.com"] = ["127.0.0.1"]
    allow_public = outbound.AllowList.parse(["public.example.com"])
    public = target.url.replace("127.0.0.1", "public.example.com")
    inside = f"{other.url}/card.json"
    for location in [inside, inside.replace("127.0.0.1", "localhost"), "http://169.254.169.254/latest/"]:
        assert await refused(f"{public}/redirect?to={location}", allow_public) == (
            "not allowed: a cloud metadata address" if "169.254" in location else "not allowed: a loopback address"
        )
    assert other.hits == []
    assert len(target.hits) == 3  # only the allow-listed first hops
    assert await refused(f"{target.url}/loop", LOOPBACK) == "too many redirects"
    assert len(target.hits) == 3 + 1 + outbound.MAX_REDIRECTS


async def test_errors_and_logs_never_carry_what_the_target_said(
    target: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    assert await refused(f"{target.url}/missing.json", LOOPBACK) == "HTTP 404"
    with pytest.raises(a2a_client.wire.CardError) as not_a_card:
        await a2a_client.fetch_card(f"{target.url}/secret.json", allow=LOOPBACK)
    assert str(not_a_card.value) == "could not fetch the card: not a valid agent card (it has no name)"
    assert await refused(f"{target.url}/", LOOPBACK) == "HTTP 405"
    assert "could not fetch the card at" in caplog.text
    assert SECRET not in caplog.text
    assert SECRET not in repr(not_a_card.value) and not_a_card.value.__cause__ is None


async def test_the_same_error_whatever_listens_on_a_refused_port(target: Recorder) -> None:
    """Not a port scanner: a loopback port with a server and one without give the same answer."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    free = closed.getsockname()[1]
    closed.close()
    open_port = target.url.rsplit(":", 1)[1]
    assert await refused(f"http://127.0.0.1:{open_port}/") == await refused(f"http://127.0.0.1:{free}/")


# -- item 6: how much is read ----------------------------------------------------------------------


async def test_a_body_over_the_cap_is_refused_and_read_no_further(target: Recorder) -> None:
    tracemalloc.start()
    try:
        category = await refused(f"{target.url}/big.json", LOOPBACK)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert category == "too large (over 1 MiB)"
    await asyncio.sleep(0.2)  # the server notices the client is gone
    assert target.streamed < 32 * MiB, f"the server streamed {target.streamed / MiB:.0f} MiB of 200"
    assert peak < 16 * MiB, f"the fetch took {peak / MiB:.0f} MiB"


async def test_a_remote_agents_answer_over_the_cap_is_refused_and_read_no_further(target: Recorder) -> None:
    agent = a2a_client.HttpRemoteAgent(
        agent_id="rec",
        card=a2a_client.wire.card_from_fetched(card("Recorder", f"{target.url}/big")),
        card_url=f"{target.url}/card.json",
        allow=LOOPBACK,
    )
    try:
        with pytest.raises(RemoteAgentError, match=r"too large \(over 16 MiB\)"):
            async for _ in agent.stream("hello", task_id="t1"):
                pass
    finally:
        await agent.aclose()
    await asyncio.sleep(0.2)
    assert target.streamed < 64 * MiB, f"the server streamed {target.streamed / MiB:.0f} MiB of 200"


# -- item 7: where the bearer token goes ---------------------------------------------------------------


async def test_a_redirect_to_another_origin_does_not_carry_the_token(target: Recorder, other: Recorder) -> None:
    data = await outbound.fetch_card_json(
        f"{target.url}/redirect?to={other.url}/card.json", allow=LOOPBACK, bearer_token=TOKEN
    )
    assert data["name"] == "Recorder"
    assert target.authorizations == [f"Bearer {TOKEN}"]
    assert other.authorizations == [None]


async def test_calls_send_the_token_to_the_cards_origin_only(target: Recorder, other: Recorder) -> None:
    for endpoint, gets_token in [(f"{target.url}/", target), (f"{other.url}/", other)]:
        gets_token.hits.clear()
        agent = a2a_client.HttpRemoteAgent(
            agent_id="rec",
            card=a2a_client.wire.card_from_fetched(card("Recorder", endpoint)),
            card_url=f"{target.url}/card.json",
            allow=LOOPBACK,
            bearer_token=TOKEN,
        )
        try:
            with pytest.raises(RemoteAgentError):
                async for _ in agent.stream("hello", task_id="t1"):
                    pass
        finally:
            await agent.aclose()
        assert [hit[:2] for hit in gets_token.hits] == [("POST", "/")]
        expected = f"Bearer {TOKEN}" if gets_token is target else None
        assert gets_token.authorizations == [expected]


@pytest.fixture
async def services(tmp_path: Path) -> AsyncIterator[Services]:
    """The app's services on SQLite, with no outbound allow-list unless a test sets one."""
    built = Services.build(make_settings(tmp_path))
    built.prepare()
    yield built
    await built.remote_agents.close()


async def test_registering_with_a_token_refuses_an_endpoint_on_another_origin(
    services: Services, target: Recorder, other: Recorder
) -> None:
    services.settings.outbound_allow_hosts = ["127.0.0.1"]
    with pytest.raises(RegistrationError, match="on another origin than the card"):
        await services.remote_agents.register(f"{target.url}/card.json?endpoint={other.url}/", bearer_token=TOKEN)
    assert other.hits == [] and await services.remote_agents.list() == []
    view = await services.remote_agents.register(f"{target.url}/card.json?endpoint={other.url}/")  # no token: fine
    assert view.url == f"{other.url}/"


async def test_registering_refuses_a_card_whose_endpoint_is_not_allowed(
    services: Services, target: Recorder, fake_dns: Any
) -> None:
    names, _ = fake_dns
    names["card.example.com"] = ["127.0.0.1"]
    services.settings.outbound_allow_hosts = ["card.example.com"]
    card_url = f"{target.url.replace('127.0.0.1', 'card.example.com')}/card.json"
    with pytest.raises(RegistrationError) as failure:
        await services.remote_agents.register(f"{card_url}?endpoint=http://10.0.0.7:8080/")
    assert str(failure.value) == "The card's endpoint cannot be called: not allowed: a private address."
    assert await services.remote_agents.list() == []


# -- the app's own doors: the REST API and the broker's ?cardUrl= ---------------------------------------


async def test_the_api_refuses_a_loopback_card_with_the_reason_only(tmp_path: Path, target: Recorder) -> None:
    with live_a2a_app(tmp_path, demo_model_delay_ms=0) as app:
        async with httpx.AsyncClient(timeout=10) as http:
            for url in [f"{target.url}/card.json", f"{app.url}/api/me.json", "http://localhost:6379/"]:
                response = await http.post(f"{app.url}/api/a2a/remote-agents", json={"cardUrl": url})
                assert response.status_code == 422
                assert response.json()["detail"] == "could not fetch the card: not allowed: a loopback address"
    assert target.hits == []


async def test_the_broker_fetches_a_card_url_only_where_allowed(tmp_path: Path, target: Recorder) -> None:
    services = Services.build(make_settings(tmp_path))
    services.prepare()
    async with serve_app(broker_app(services)) as host:
        agent = await FakeAgent.connect(host, card=None, a2a_id="peeker", cardUrl=f"{target.url}/card.json")
        await asyncio.wait_for(agent.ws.wait_closed(), 5)
        assert agent.ws.close_code == 4400
        assert agent.ws.close_reason == "agent card: could not fetch the card: not allowed: a loopback address"
        assert target.hits == []
        await agent.close()
