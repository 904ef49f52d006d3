"""People and who is asking: accounts, password logins, and the routers' `CurrentUser` and ground-floor dependencies.

Owns: the `users` table's rules (`accounts.py`: create, change a password, single-user mode's
`local` user, `PasswordLogin` with its throttle, argon2 off the event loop); the FastAPI
dependencies every router uses (`deps.py`); `GET /api/me` (`routes.py`). API keys for A2A
callers are the A2A layer's (`core.a2a.api_keys`); the broker's JWTs are the broker's.

May import: `core.web`, `core.streaming`, the ground floor (settings, db) and `models`. `deps.py`
reads the composition on `app.state` by attribute, without importing `core.services` (which sits above
every router), not even for type checkers.
"""

from core.auth.accounts import AccountError, PasswordLogin
from core.auth.deps import USER_ID_KEY, AuthState, CurrentUser, client_address, get_current_user
from core.auth.login_throttle import TooManyFailedLoginsError

__all__ = [
    "USER_ID_KEY",
    "AccountError",
    "AuthState",
    "CurrentUser",
    "PasswordLogin",
    "TooManyFailedLoginsError",
    "client_address",
    "get_current_user",
]
