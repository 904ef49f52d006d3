"""Who is dialing in on `/a2a`: the IP blacklist, then the identity (seed 003 `auth.mode`).

- `none` (development): `?a2a_id=<name>&agent_id=<chat agent id>` from the query
  (the legacy `?agentId=` is accepted for `agent_id`).
- `jwt`: `?token=<JWT>`, ES256 only, verified against the configured PEM public
  keys (any of them), expiry required and enforced; `a2a_id` and `agent_id`
  (or legacy `agentId`) come from the claims, never from the query. Every
  token that is refused, whatever is wrong in it, is a 401 with the reason.

Both checks run before the WebSocket upgrade completes, so a refused peer costs
one HTTP response and holds no connection.

`?cardUrl=` is only checked for its scheme here; the broker fetches it under the
outbound policy (`core/a2a/outbound.py`: public addresses only unless allow-listed,
redirects re-checked, 1 MiB at most), since in mode `none` anyone may name one.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.broker.wire import A2A_ID_PATTERN
from core.errors import AppError
from core.settings import AuthSettings
from core.web.input_limits import json_error
from core.web.logtext import loggable

log = logging.getLogger(__name__)

ALGORITHM = "ES256"
NUMERIC_DATES = ("exp", "iat", "nbf")  # RFC 7519 NumericDate claims: JSON numbers, seconds since 1970


class BrokerRefusedError(AppError):
    """The connection is refused before the upgrade: `status` (HTTP) and a reason to show the peer."""

    code = "broker_refused"

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Identity:
    """A remote agent's id and its binding (None: global, visible to every chat agent)."""

    a2a_id: str
    agent_id: str | None = None
    card_url: str | None = None


def is_blacklisted(host: str | None, blacklist: list[str]) -> bool:
    """True when `host` is one of the blacklisted addresses or inside a blacklisted network (CIDR)."""
    if not host or not blacklist:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host in blacklist
    for entry in blacklist:
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:  # Settings refuses such entries; one that got here matches nothing
            continue
    return False


def identify(query: Mapping[str, str], auth: AuthSettings) -> Identity:
    """The identity the peer claims, checked as `auth.mode` says.

    Raises:
        BrokerRefusedError: 400 for a missing or malformed id, 401 for a missing, invalid or expired token.
    """
    card_url = query.get("cardUrl") or None
    if card_url is not None and not card_url.startswith(("http://", "https://")):
        raise BrokerRefusedError(400, "cardUrl must be an http:// or https:// URL")
    if auth.mode == "jwt":
        claims = _verify(query.get("token"), auth)
        a2a_id, agent_id = claims.get("a2a_id"), claims.get("agent_id", claims.get("agentId"))
        where = "the token's a2a_id claim"
    else:
        a2a_id, agent_id = query.get("a2a_id"), query.get("agent_id") or query.get("agentId")
        where = "?a2a_id="
    if a2a_id is not None and not isinstance(a2a_id, str):
        raise BrokerRefusedError(400, f"{where} must be a string: the remote agent's name (the dispatch targetAgent)")
    if not a2a_id:
        raise BrokerRefusedError(400, f"{where} is required: the remote agent's name (the dispatch targetAgent)")
    if not A2A_ID_PATTERN.fullmatch(a2a_id):
        raise BrokerRefusedError(
            400,
            f"{where} {a2a_id[:64]!r} is not a valid id: use 1-60 of a-z, 0-9, '-' and '_', "
            "starting with a letter or digit",
        )
    if agent_id is not None and (isinstance(agent_id, bool) or not isinstance(agent_id, (str, int))):
        raise BrokerRefusedError(400, "agent_id must be a string or a number")
    agent = str(agent_id) if agent_id not in (None, "") else None
    return Identity(a2a_id=a2a_id, agent_id=agent, card_url=card_url)


def _verify(token: str | None, auth: AuthSettings) -> dict[str, Any]:
    import jwt  # PyJWT (and cryptography) only when jwt mode is on

    if not token:
        raise BrokerRefusedError(401, "auth mode is jwt: pass ?token=<ES256 JWT>")
    if not auth.public_keys:
        raise BrokerRefusedError(
            401, "auth mode is jwt but the broker has no public keys configured (auth.public_keys)"
        )
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise BrokerRefusedError(401, f"the token is not a JWT: {_reason(exc)}") from exc
    if header.get("alg") != ALGORITHM:
        alg = loggable(header.get("alg"), 20)
        raise BrokerRefusedError(401, f"the token is signed with {alg!r}; only {ALGORITHM} is accepted")
    last: Exception | None = None
    for pem in auth.public_keys:
        try:
            claims = jwt.decode(
                token,
                pem,
                algorithms=[ALGORITHM],
                audience=auth.audience,
                leeway=auth.leeway_s,
                options={"require": ["exp", *(["aud"] if auth.audience else [])], "verify_aud": bool(auth.audience)},
            )
        except jwt.ExpiredSignatureError as exc:
            raise BrokerRefusedError(401, "the token has expired") from exc
        except jwt.MissingRequiredClaimError as exc:
            what = "an expiry ('exp')" if exc.claim == "exp" else f"the claim {exc.claim!r}"
            raise BrokerRefusedError(401, f"the token must carry {what}") from exc
        except jwt.InvalidAudienceError as exc:
            raise BrokerRefusedError(
                401, f"the token is not for this broker: its aud must be {auth.audience!r}"
            ) from exc
        except (jwt.InvalidSignatureError, jwt.InvalidKeyError, ValueError) as exc:
            last = exc  # try the next key
            continue
        except jwt.PyJWTError as exc:
            raise BrokerRefusedError(401, f"the token is invalid: {_reason(exc)}") from exc
        _check_dates(claims)
        _check_lifetime(claims, auth)
        return claims
    log.info("refused a token: no configured key verifies it (%s)", loggable(last, 120))
    raise BrokerRefusedError(401, "the token's signature does not match any configured public key")


def _reason(exc: Exception) -> str:
    """PyJWT's reason; for JSON it could not read, ours (`json_error`) rather than Python's advice to a programmer."""
    cause = exc.__cause__
    if isinstance(cause, ValueError) and not isinstance(cause, json.JSONDecodeError):
        return f"{str(exc).split(':', 1)[0]}: {json_error(cause)}"
    return loggable(exc, 120)


def _check_dates(claims: dict[str, Any]) -> None:
    """`exp`, `iat` and `nbf` are JSON numbers; PyJWT checks them with `int()`, which takes "1767225600" too."""
    for name in NUMERIC_DATES:
        value = claims.get(name)
        if name in claims and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise BrokerRefusedError(
                401,
                f"the token's {name!r} claim must be a JSON number (seconds since 1970, RFC 7519 "
                f"NumericDate), not {loggable(json.dumps(value), 40)}",
            )


def _check_lifetime(claims: dict[str, Any], auth: AuthSettings) -> None:
    """A token valid for longer than `max_lifetime_s` is refused (from `iat`, or from now without one).

    Only comparisons, no subtraction, until the span is known to be small: a claim may be an
    integer of hundreds of digits, which float arithmetic (`time.time()`) cannot take.
    """
    exp = claims["exp"]
    start = claims.get("iat", time.time())
    if exp <= start + auth.max_lifetime_s + auth.leeway_s:
        return
    span = f"{int(exp - start)} s" if exp < start + MAX_SHOWN_SPAN_S else f"more than {MAX_SHOWN_SPAN_S:.0e} s"
    raise BrokerRefusedError(
        401,
        f"the token is valid for {span}; the broker accepts at most "
        f"{auth.max_lifetime_s} s (auth.max_lifetime_s): ask for a shorter-lived token",
    )


MAX_SHOWN_SPAN_S = 10**12


def check_public_keys(public_keys: list[str]) -> None:
    """Make sure every configured key is a PEM EC P-256 public key (what ES256 needs).

    Raises:
        ValueError: which key (by position) is not, and why.
    """
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    for i, pem in enumerate(public_keys):
        try:
            key = load_pem_public_key(pem.encode("utf-8"))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"auth.public_keys[{i}] is not a PEM public key: {exc}") from exc
        if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
            raise ValueError(f"auth.public_keys[{i}] is not an EC P-256 key, which ES256 needs")
