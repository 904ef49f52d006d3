"""Login page, logout, and the middleware that sends anonymous visitors to `/login`.

In single-user mode (no accounts) there is nothing to log in to: every visitor
is the `local` user, which `app.py` only allows on a loopback address.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi.responses import RedirectResponse
from nicegui import app, ui
from starlette.types import ASGIApp, Receive, Scope, Send

from core.auth import accounts
from core.auth.deps import USER_ID_KEY, AuthState
from core.auth.login_throttle import TooManyFailedLoginsError
from core.i18n import _
from ui.language import page

# Paths that work without a browser login: NiceGUI's own assets and socket, the login page,
# the API (it answers 401 itself), the A2A hub and the API docs.
PUBLIC_PREFIXES = (
    "/_nicegui",
    "/login",
    "/api",
    "/a2a",
    "/docs",
    "/redoc",
    "/openapi.json",
    "/favicon",
    "/assets",
    "/metrics",
)


def safe_local_path(target: str) -> str:
    r"""`target` when it is a path on this site, else `/` (no open redirect after login).

    Browsers read `/\host` and `/<TAB>/host` as `//host` (WHATWG URL parsing strips
    tabs and newlines and treats backslashes as slashes), so anything but a plain
    `/path` without backslashes or control characters is refused.
    """
    if not target.startswith("/") or target.startswith("//"):
        return "/"
    if "\\" in target or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in target):
        return "/"
    return target


def current_user_id(auth: AuthState) -> int | None:
    """The logged-in user's id in this browser (the `local` user in single-user mode)."""
    if not auth.multi_user:
        return auth.local_user_id
    value = app.storage.user.get(USER_ID_KEY)
    return value if isinstance(value, int) and value not in auth.disabled_ids else None


def install_login_middleware(auth: AuthState) -> None:
    """Redirect page requests without a login to `/login` (multi-user mode only)."""

    class LoginRequired:
        # Pure ASGI: a `BaseHTTPMiddleware` would copy every chunk of every stream through a task.
        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            path = scope.get("path", "")
            if scope["type"] == "http" and auth.multi_user and not path.startswith(PUBLIC_PREFIXES):
                user_id = app.storage.user.get(USER_ID_KEY)
                if isinstance(user_id, int) and user_id in auth.disabled_ids:  # an admin disabled the account
                    app.storage.user.pop(USER_ID_KEY, None)
                    user_id = None
                if not isinstance(user_id, int):
                    query = scope.get("query_string", b"").decode("latin-1")
                    target = path + (f"?{query}" if query else "")
                    response = RedirectResponse(f"/login?redirect_to={quote(target, safe='')}")
                    await response(scope, receive, send)
                    return
            await self.app(scope, receive, send)

    app.add_middleware(LoginRequired)


def register_login_pages(*, auth: AuthState, logins: accounts.PasswordLogin) -> None:
    """`/login` and `/logout`."""

    @page("/login", title="Log in")
    async def login_page(redirect_to: str = "/") -> RedirectResponse | None:
        target = safe_local_path(redirect_to)
        if not auth.multi_user or isinstance(app.storage.user.get(USER_ID_KEY), int):
            return RedirectResponse(target)

        async def try_login() -> None:
            try:
                user = await logins.authenticate(username.value.strip(), password.value, address=ui.context.client.ip)
            except TooManyFailedLoginsError as exc:
                ui.notify(str(exc), color="negative")
                return
            if user is None:
                # Same words whether the name or the password is wrong: names cannot be probed.
                ui.notify(_("Wrong username or password."), color="negative")
                return
            app.storage.user[USER_ID_KEY] = user.id
            ui.navigate.to(target)

        ui.page_title(_("Log in"))
        with ui.card().classes("absolute-center w-80"):
            ui.label(_("Log in")).classes("text-h6")
            username = ui.input(_("Username")).props("autofocus data-testid=login-username").mark("login-username")
            password = (
                ui.input(_("Password"), password=True, password_toggle_button=True)
                .props("data-testid=login-password")
                .mark("login-password")
                .on("keydown.enter", try_login)
            )
            ui.button(_("Log in"), on_click=try_login).props("data-testid=login-btn").mark("login-btn")
        return None

    @ui.page("/logout")
    def logout_page() -> RedirectResponse:
        app.storage.user.pop(USER_ID_KEY, None)
        return RedirectResponse("/login")
