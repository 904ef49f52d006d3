"""Who may dial in on /a2a: JWT ES256 with real keys made here, the IP blacklist, and the
hot-reloaded config file that changes both while the server runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import jwt
import pytest
import websockets
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from core.services import Services
from core.settings import load_settings
from tests.conftest import make_settings
from tests.utils.broker import FakeAgent, broker_app, serve_app, wait_for


def es256_keys() -> tuple[str, str]:
    """A fresh P-256 key pair as PEM (private, public)."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


async def refused(host: str, query: str) -> tuple[int, str]:
    with pytest.raises(websockets.InvalidStatus) as caught:
        await websockets.connect(f"ws://{host}/a2a?{query}", open_timeout=5)
    response = caught.value.response
    return response.status_code, json.loads(response.body)["error"]


async def test_jwt_mode_accepts_only_valid_unexpired_es256_tokens(tmp_path: Path) -> None:
    private, public = es256_keys()
    other_private, other_public = es256_keys()
    services = Services.build(make_settings(tmp_path, auth={"mode": "jwt", "public_keys": [other_public, public]}))
    services.prepare()
    now = int(time.time())
    async with serve_app(broker_app(services)) as host:
        good = jwt.encode({"a2a_id": "travel", "agent_id": 123, "exp": now + 60}, private, algorithm="ES256")
        # The identity comes from the claims; the query's a2a_id is ignored.
        agent = await FakeAgent.connect(host, token=good, a2a_id="spoofed")
        await wait_for(lambda: services.broker.connection("travel") is not None)
        assert services.broker.connection("travel").binding == "123"
        assert services.broker.connection("spoofed") is None
        await agent.close()

        legacy = jwt.encode({"a2a_id": "legacy", "agentId": "9", "exp": now + 60}, other_private, algorithm="ES256")
        agent = await FakeAgent.connect(host, token=legacy, wait_registered=None)
        await wait_for(lambda: services.broker.connection("legacy") is not None)
        assert services.broker.connection("legacy").binding == "9"
        await agent.close()

        wrong_key, _ = es256_keys()
        cases = {
            # Expired for longer than the clock leeway (auth.leeway_s, 30 s).
            "expired": (jwt.encode({"a2a_id": "t", "exp": now - 60}, private, algorithm="ES256"), "expired"),
            "wrong key": (
                jwt.encode({"a2a_id": "t", "exp": now + 60}, wrong_key, algorithm="ES256"),
                "does not match any configured public key",
            ),
            "HS256": (
                jwt.encode({"a2a_id": "t", "exp": now + 60}, "a-shared-secret-that-is-long-enough", algorithm="HS256"),
                "only ES256",
            ),
            "none": (jwt.encode({"a2a_id": "t", "exp": now + 60}, None, algorithm="none"), "only ES256"),
            "no expiry": (jwt.encode({"a2a_id": "t"}, private, algorithm="ES256"), "expiry"),
            "no a2a_id": (jwt.encode({"exp": now + 60}, private, algorithm="ES256"), "a2a_id claim is required"),
            "garbage": ("not.a.jwt", "not a JWT"),
        }
        for name, (token, says) in cases.items():
            status, reason = await refused(host, f"token={token}&a2a_id=t")
            expected = 400 if name == "no a2a_id" else 401
            assert (status, says in reason) == (expected, True), (name, reason)
        status, reason = await refused(host, "a2a_id=travel")
        assert status == 401 and "?token=" in reason
        assert services.broker.stats()["connections"]["refused"] == len(cases) + 1


async def test_blacklisted_ips_are_refused_before_the_upgrade(tmp_path: Path) -> None:
    services = Services.build(make_settings(tmp_path, blacklist_ip=["10.0.0.0/8", "127.0.0.1"]))
    services.prepare()
    async with serve_app(broker_app(services)) as host:
        status, reason = await refused(host, "a2a_id=travel")
        assert status == 403 and "127.0.0.1" in reason and "blacklist_ip" in reason
        assert services.broker.stats()["connections"] == {"total": 0, "refused": 1}
        services.settings.blacklist_ip = ["10.0.0.0/8"]  # read live on every connection
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=services.broker)
        await agent.close()


async def test_config_edits_reload_live_and_bad_edits_are_rejected(
    tmp_path: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "server.json"
    config.write_text(json.dumps({"_comment": "test", "port": 3100, "inject_min_interval": 1000}))
    monkeypatch.setenv("CONFIG_FILE", str(config))
    services = Services.build(load_settings())
    services.prepare()
    broker = services.broker
    caplog.set_level(logging.INFO, logger="core.broker.reload")

    async def edit(content: str, until) -> None:
        config.write_text(content)
        await wait_for(until, timeout=5)

    async with serve_app(broker_app(services)) as host:
        assert broker.reloader.watching
        _, public = es256_keys()
        await edit(
            json.dumps(
                {"port": 3100, "inject_min_interval": 250, "blacklist_ip": ["127.0.0.1"], "task_idle_timeout": 5000}
            ),
            lambda: broker.reloader.reloads == 1,
        )
        assert (services.settings.inject_min_interval, services.settings.task_idle_timeout) == (250, 5000)
        status, _ = await refused(host, "a2a_id=travel")
        assert status == 403  # the blacklist applies to the next connection

        for bad in [
            '{"port": 3100, "blacklist_ip": [',
            '{"inject_min_interval": "soon"}',
            "[1, 2]",
            json.dumps({"blacklist_ip": ["127.0.0.1", "10.0.0.0/33"]}),
            json.dumps({"auth": {"mode": "jwt", "public_keys": ["not a key"]}}),
        ]:
            before = broker.reloader.rejected
            await edit(bad, lambda b=before: broker.reloader.rejected == b + 1)
            if "10.0.0.0/33" in bad:  # an entry that is not an address would have matched nobody, silently
                assert "'10.0.0.0/33' is not an IP address or network" in broker.reloader.last_error
        assert broker.reloader.last_error and "public_keys[0]" in broker.reloader.last_error
        assert "rejected, keeping the last good configuration" in caplog.text
        assert services.settings.inject_min_interval == 250 and services.settings.blacklist_ip == ["127.0.0.1"]
        assert (await refused(host, "a2a_id=travel"))[0] == 403  # still the last good config
        health = broker.health()["config"]
        assert health["watching"] and health["lastError"]

        # Port and Redis are read at start only: changing them is logged, not applied.
        await edit(
            json.dumps(
                {
                    "port": 4100,
                    "redis": {"url": "redis://elsewhere:6379/0"},
                    "inject_min_interval": 250,
                    "auth": {"mode": "jwt", "public_keys": [public]},
                }
            ),
            lambda: broker.reloader.reloads == 2,
        )
        assert services.settings.port == 3100 and services.settings.redis.url is None
        assert "port, redis changed; restart the app" in caplog.text
        assert services.settings.auth.mode == "jwt" and services.settings.blacklist_ip == []
        assert broker.reloader.last_error is None
        status, reason = await refused(host, "a2a_id=travel")
        assert status == 401 and "token" in reason  # jwt mode is on now
    await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("claims", "words"),
    [
        ({"aud": "another-broker"}, "not for this broker"),
        ({}, "must carry the claim 'aud'"),
        ({"aud": "this-broker", "iat": -3600, "exp": 86_400}, "valid for 90000 s"),  # a day and an hour
        ({"aud": "this-broker", "exp": 2 * 86_400}, "at most 86400 s"),  # no iat: counted from now
        ({"aud": "this-broker", "exp": -40}, "expired"),  # past the 30 s leeway
    ],
)
async def test_jwt_audience_lifetime_and_leeway(tmp_path: Path, claims: dict, words: str) -> None:
    private, public = es256_keys()
    services = Services.build(
        make_settings(tmp_path, auth={"mode": "jwt", "public_keys": [public], "audience": "this-broker"})
    )
    services.prepare()
    now = int(time.time())
    timed = {k: now + v if k in {"exp", "iat"} else v for k, v in {"exp": 60, **claims}.items()}
    async with serve_app(broker_app(services)) as host:
        status, reason = await refused(
            host, "token=" + jwt.encode({"a2a_id": "t", **timed}, private, algorithm="ES256")
        )
        assert status == 401 and words in reason, reason
        # Within the leeway (a clock 20 s behind) and the lifetime, with the right audience: accepted.
        fine = jwt.encode(
            {"a2a_id": "clock", "aud": "this-broker", "exp": now - 20, "iat": now - 80}, private, algorithm="ES256"
        )
        agent = await FakeAgent.connect(host, token=fine, wait_registered=None)
        await wait_for(lambda: services.broker.connection("clock") is not None)
        await agent.close()


HOUR = 3600


@pytest.mark.parametrize(
    ("claims", "status", "words"),
    [
        ({"exp": "+60"}, 401, "'exp' claim must be a JSON number"),  # a numeric string: PyJWT's int() takes it
        ({"iat": "+0"}, 401, "'iat' claim must be a JSON number"),
        ({"nbf": "+0"}, 401, "'nbf' claim must be a JSON number"),
        ({"iat": True}, 401, "'iat' claim must be a JSON number"),
        ({"exp": 10**400}, 401, "valid for more than 1e+12 s"),  # too large for float arithmetic
        ({"exp": 1e308}, 401, "valid for more than 1e+12 s"),
        ({"exp": [60]}, 401, "(exp) must be an integer"),
        ({"aud": 5}, 401, "not for this broker"),
        ({"aud": [5, "this-broker"]}, 401, "not for this broker"),
        ({"sub": 5}, 401, "Subject must be a string"),
        ({"a2a_id": 5}, 400, "a2a_id claim must be a string"),
    ],
    ids=lambda v: str(v)[:30],
)
async def test_a_claim_of_the_wrong_type_is_refused_like_any_bad_token(
    tmp_path: Path, caplog, claims: dict, status: int, words: str
) -> None:
    """RFC 7519 dates are JSON numbers and `aud`/`sub` strings; anything else is refused before the upgrade."""
    private, public = es256_keys()
    services = Services.build(
        make_settings(tmp_path, auth={"mode": "jwt", "public_keys": [public], "audience": "this-broker"})
    )
    services.prepare()
    now = int(time.time())
    timed = {k: str(now + int(v)) if isinstance(v, str) else v for k, v in claims.items()}
    token = jwt.encode({"a2a_id": "t", "aud": "this-broker", "exp": now + 60, **timed}, private, algorithm="ES256")
    async with serve_app(broker_app(services)) as host:
        with caplog.at_level(logging.INFO, logger="core.broker.service"):
            got, reason = await refused(host, "token=" + token)
        assert (got, words in reason) == (status, True), reason
        assert f"refused /a2a connection from 127.0.0.1: {reason}" in caplog.text
        assert services.broker.stats()["connections"]["refused"] == 1


async def test_a_token_holding_a_5000_digit_number_is_refused_in_our_words(tmp_path: Path) -> None:
    private, public = es256_keys()
    services = Services.build(make_settings(tmp_path, auth={"mode": "jwt", "public_keys": [public]}))
    services.prepare()
    payload = b'{"a2a_id": "t", "exp": %d, "agent_id": %s}' % (int(time.time()) + 60, b"9" * 5000)
    token = jwt.api_jws.encode(payload, private, algorithm="ES256")  # jwt.encode cannot write such a number
    async with serve_app(broker_app(services)) as host:
        status, reason = await refused(host, "token=" + token)
    assert (status, reason) == (401, "the token is invalid: Invalid payload string: a number has more than 4300 digits")
