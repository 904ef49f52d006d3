"""The API documentation: `/openapi.json`, Swagger UI at `/docs` and ReDoc at `/redoc`, offline.

FastAPI's own pages load their scripts and styles from a CDN, so without internet
they are blank. These pages use the same HTML (FastAPI's `get_swagger_ui_html` and
`get_redoc_html`) with the assets that the `fastapi-offline` package ships, served
by this server under `/docs/assets`. ReDoc's script asks for its "by Redocly" logo
from Redocly's CDN whatever its options say: `/docs/redoc.js` serves the script
without that image (issue 40), so the page asks nothing of another site. Nothing
here needs a login: the schema only describes the routes, and each route checks
its caller itself.

Swagger UI takes the pages' theme (issue 40: it stayed light in dark mode): the
app's choice when it gives one (`dark_mode`), else the system's, as the pages do;
its stylesheet has a dark theme under `html.dark-mode`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

OPENAPI_URL = "/openapi.json"
DOCS_URL = "/docs"
REDOC_URL = "/redoc"
ASSETS_URL = "/docs/assets"
ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
REDOC_JS_URL = "/docs/redoc.js"  # ReDoc's script without its remote logo (not under ASSETS_URL: the mount wins)
REDOCLY_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
# The pages may load only from this server (ReDoc's remote logo is taken out of its script, see
# `redoc_script`). Both pages start from an inline script; ReDoc searches in a worker.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'"
)


# Before Swagger UI draws: its dark theme when the reader's is dark (`mode`: true, false, or null to
# follow the system, then also when the system changes).
_THEME_JS = """<script>(() => {{
  const mode = {mode};
  const system = matchMedia("(prefers-color-scheme: dark)");
  const apply = () => {{
    const dark = mode === null ? system.matches : mode;
    document.documentElement.classList.toggle("dark-mode", dark);
    document.documentElement.style.colorScheme = dark ? "dark" : "light";
  }};
  apply();
  if (mode === null) system.addEventListener("change", apply);
}})();</script>"""


def add_api_docs(
    app: FastAPI,
    *,
    title: str,
    description: str = "",
    version: str = "",
    dark_mode: Callable[[], bool | None] | None = None,
) -> None:
    """Serve the OpenAPI schema and both documentation pages on `app`, with local assets only.

    `dark_mode` gives the reader's theme during a request (True dark, False light, None: the system's).
    """
    app.title = title
    app.description = description
    if version:
        app.version = version
    app.openapi_url = OPENAPI_URL  # FastAPI's `openapi()` and Swagger's "download" link read it
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="api-docs-assets")
    app.include_router(_api_docs_router(title, dark_mode or (lambda: None)))


def _api_docs_router(title: str, dark_mode: Callable[[], bool | None]) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get(OPENAPI_URL)
    async def read_openapi(request: Request) -> JSONResponse:
        """The OpenAPI schema of every documented route."""
        return JSONResponse(request.app.openapi())

    @router.get(DOCS_URL)
    async def read_swagger_ui(request: Request) -> HTMLResponse:
        """Swagger UI."""
        root = request.scope.get("root_path", "")
        page = get_swagger_ui_html(
            openapi_url=f"{root}{OPENAPI_URL}",
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        )
        theme = _THEME_JS.format(mode=json.dumps(dark_mode()))
        html = bytes(page.body).decode("utf-8").replace("<head>", "<head>\n" + theme, 1)
        return _same_origin_only(HTMLResponse(html, headers={"Cache-Control": "no-store"}))

    @router.get(REDOC_URL)
    async def read_redoc(request: Request) -> HTMLResponse:
        """ReDoc."""
        root = request.scope.get("root_path", "")
        return _same_origin_only(
            get_redoc_html(
                openapi_url=f"{root}{OPENAPI_URL}",
                title=f"{title} - ReDoc",
                redoc_js_url=f"{root}{REDOC_JS_URL}",
                redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
                with_google_fonts=False,
            )
        )

    @router.get(REDOC_JS_URL)
    async def read_redoc_js() -> Response:
        """ReDoc's script, without the image it would load from Redocly's CDN."""
        return Response(
            redoc_script(),
            media_type="text/javascript; charset=utf-8",
            headers={"Cache-Control": "public, max-age=86400"},
        )

    return router


@functools.cache
def redoc_script() -> str:
    """fastapi-offline's ReDoc with its logo's address emptied (the image is then not drawn at all).

    ReDoc renders `<img src="https://cdn.redoc.ly/redoc/logo-mini.svg">` under its menu, always; with
    the address empty the element asks for nothing and removes itself on its error (its `onError`).
    """
    script = (ASSETS_DIR / "redoc.standalone.js").read_text(encoding="utf-8")
    return script.replace(f'src:"{REDOCLY_LOGO}"', 'src:""').replace(REDOCLY_LOGO, "")


def _same_origin_only(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page
