"""Login page, logout, and the middleware that sends anonymous visitors to `/login`.

In single-user mode (no accounts) there is nothing to log in to: every visitor
is the `local` user, which `app.py` only allows on a loopback address.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import Request
from fastapi.responses import RedirectResponse
from nicegui import app, ui
from starlette.middleware.base import BaseHTTPMiddleware

from core.auth import accounts
from core.auth.deps import USER_ID_KEY
from core.services import Services

# Paths that work without a browser login: NiceGUI's own assets and socket, the login page,
# the API (it answers 401 itself), the A2A hub and the API docs.
PUBLIC_PREFIXES = ("/_nicegui", "/login", "/api", "/a2a", "/docs", "/redoc", "/openapi.json", "/favicon", "/assets")


def safe_local_path(target: str) -> str:
    """`target` when it is a path on this site, else `/` (no open redirect after login).

    Browsers read `/\\host` and `/<TAB>/host` as `//host` (WHATWG URL parsing strips
    tabs and newlines and treats backslashes as slashes), so anything but a plain
    `/path` without backslashes or control characters is refused.
    """
    if not target.startswith("/") or target.startswith("//"):
        return "/"
    if "\\" in target or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in target):
        return "/"
    return target


def current_user_id(services: Services) -> int | None:
    """The logged-in user's id in this browser (the `local` user in single-user mode)."""
    if not services.auth.multi_user:
        return services.auth.local_user_id
    value = app.storage.user.get(USER_ID_KEY)
    return value if isinstance(value, int) else None


def install_login_middleware(services: Services) -> None:
    """Redirect page requests without a login to `/login` (multi-user mode only)."""

    class LoginRequired(BaseHTTPMiddleware):
        async def dispatch(self, request: Request, call_next):
            if services.auth.multi_user and not request.url.path.startswith(PUBLIC_PREFIXES):
                if not isinstance(app.storage.user.get(USER_ID_KEY), int):
                    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                    return RedirectResponse(f"/login?redirect_to={quote(target, safe='')}")
            return await call_next(request)

    app.add_middleware(LoginRequired)


def register_login_pages(services: Services) -> None:
    """`/login` and `/logout`."""

    @ui.page("/login", title="Log in")
    async def login_page(redirect_to: str = "/") -> RedirectResponse | None:
        target = safe_local_path(redirect_to)
        if not services.auth.multi_user or isinstance(app.storage.user.get(USER_ID_KEY), int):
            return RedirectResponse(target)

        async def try_login() -> None:
            try:
                user = await services.logins.authenticate(username.value.strip(), password.value,
                                                          address=ui.context.client.ip)
            except accounts.TooManyFailedLogins as exc:
                ui.notify(str(exc), color="negative")
                return
            if user is None:
                # Same words whether the name or the password is wrong: names cannot be probed.
                ui.notify("Wrong username or password.", color="negative")
                return
            app.storage.user[USER_ID_KEY] = user.id
            ui.navigate.to(target)

        with ui.card().classes("absolute-center w-80"):
            ui.label("Log in").classes("text-h6")
            username = ui.input("Username").props("autofocus data-testid=login-username").mark("login-username")
            password = (
                ui.input("Password", password=True, password_toggle_button=True)
                .props("data-testid=login-password")
                .mark("login-password")
                .on("keydown.enter", try_login)
            )
            ui.button("Log in", on_click=try_login).props("data-testid=login-btn").mark("login-btn")
        return None

    @ui.page("/logout")
    def logout_page() -> RedirectResponse:
        app.storage.user.pop(USER_ID_KEY, None)
        return RedirectResponse("/login")
