"""The reader's language and time zone in the pages, and the header's switch that changes it in place.

Every page is registered with `page(...)` (instead of `ui.page`), which picks the language before the
page is built: `?lang=` (links and tests; it is kept), else the account's choice (with accounts; kept
in NiceGUI's general storage under the user's id, so it follows the person to another browser), else
this browser's choice (`app.storage.user`), else its `Accept-Language`, else English. The choice is
kept on the page's client, so callbacks, timers and background tasks of that page translate into it too
(`core.i18n` asks `_client_settings` when no request set a language).

The switch changes the language without a reload: the page's elements are deleted and its
builder runs again on the same client (same tab, same socket); a page that holds subscriptions
lets go of them first (`on_rebuild`). NiceGUI's own "connection lost" popup gets the same
language (`_browser_texts_js`). See docs/ARCHITECTURE.md, "Languages".
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

from nicegui import Client, __version__, app, background_tasks, ui
from nicegui.slot import Slot

from core.auth.deps import USER_ID_KEY
from core.i18n import (
    DEFAULT_LANGUAGE,
    LANGUAGES,
    N_,
    _,
    html_lang,
    negotiate,
    normalize,
    set_language,
    set_language_resolver,
)

LANGUAGE_KEY = "language"  # app.storage.user: the reader's choice (a key of core.i18n.LANGUAGES)
ACCOUNT_LANGUAGE_KEY = "language-of-user-{user_id}"  # app.storage.general: an account's choice
TIMEZONE_KEY = "timezone"  # app.storage.user: the browser's IANA time zone, as it last said
# NiceGUI's reconnect popup (its index.html has the two lines); ours are in the catalog.
CONNECTION_LOST = N_("Connection lost.")
TRYING_TO_RECONNECT = N_("Trying to reconnect…")
# The words assets/app.js writes itself (a code block's Copy button), as `window.appTexts`.
BROWSER_TEXTS = {"copy": N_("Copy"), "copyCode": N_("Copy code"), "copied": N_("Copied")}

_LANGUAGE_ATTR = "app_language"
_TIMEZONE_ATTR = "app_timezone"
_REBUILD_ATTR = "app_rebuild"
_TEARDOWN_ATTR = "app_teardown"
_HANDLERS_ATTR = "app_build_connect_handlers"
_TIMEZONE_ASKED_ATTR = "app_timezone_asked"


def _client_of_this_task() -> Client | None:
    stack = Slot.get_stack()
    if not stack:
        return None
    return stack[-1].parent.client


def _client_settings() -> tuple[str | None, str | None]:
    client = _client_of_this_task()
    if client is None:
        return None, None
    return getattr(client, _LANGUAGE_ATTR, None), getattr(client, _TIMEZONE_ATTR, None)


def install() -> None:
    """Let `core.i18n` find the language of the page whose callback is running."""
    set_language_resolver(_client_settings)


def _stored(key: str) -> Any:
    try:
        return app.storage.user.get(key)
    except RuntimeError:  # no storage secret (some unit tests)
        return None


def _store(key: str, value: Any) -> None:
    try:
        app.storage.user[key] = value
    except RuntimeError:
        pass


def _account_key() -> str | None:
    """The general storage key of the logged-in account's language (None without accounts or a login)."""
    user_id = _stored(USER_ID_KEY)
    return ACCOUNT_LANGUAGE_KEY.format(user_id=user_id) if isinstance(user_id, int) else None


def keep_choice(language: str) -> None:
    """Keep the reader's language for this browser and, when logged in to an account, for the account."""
    _store(LANGUAGE_KEY, language)
    key = _account_key()
    if key is not None:
        app.storage.general[key] = language


def choose_language(client: Client) -> str:
    """`?lang=` (kept), else the account's choice, else this browser's, else `Accept-Language`, else English."""
    request = client.request
    asked = normalize(request.query_params.get("lang")) if request is not None else None
    if asked is not None:
        keep_choice(asked)
        return asked
    key = _account_key()
    for saved in (app.storage.general.get(key) if key else None, _stored(LANGUAGE_KEY)):
        if isinstance(saved, str) and saved in LANGUAGES:
            return saved
    header = request.headers.get("accept-language") if request is not None else None
    return negotiate(header) or DEFAULT_LANGUAGE


def page(path: str, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`ui.page`, with the reader's language chosen first and the page rebuildable by the switch."""

    def decorator(builder: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(builder)
        async def wrapper(*args: Any, **kw: Any) -> Any:
            client = ui.context.client
            language = choose_language(client)
            setattr(client, _LANGUAGE_ATTR, language)
            setattr(client, _TIMEZONE_ATTR, _stored(TIMEZONE_KEY))
            set_language(language)

            async def rebuild() -> None:
                await _tracking_connect_handlers(client, lambda: builder(*args, **kw))

            setattr(client, _REBUILD_ATTR, rebuild)
            ui.add_head_html(f"<script>{_browser_texts_js(language, on_load=True)}</script>")
            if not getattr(client, _TIMEZONE_ASKED_ATTR, False):  # once per client (a rebuild asks no more)
                setattr(client, _TIMEZONE_ASKED_ATTR, True)
                client.on_connect(
                    lambda: background_tasks.create(_learn_timezone(client), name="browser time zone", context=client)
                )
            return await _tracking_connect_handlers(client, lambda: builder(*args, **kw))

        return ui.page(path, **kwargs)(wrapper)

    return decorator


async def _tracking_connect_handlers(client: Client, build: Callable[[], Any]) -> Any:
    """Build the page, noting the connect handlers its elements add (a left drawer adds one)."""
    before = list(client.connect_handlers)
    result = build()
    if inspect.isawaitable(result):
        result = await result
    setattr(client, _HANDLERS_ATTR, [h for h in client.connect_handlers if h not in before])
    return result


def set_rebuild(client: Client, rebuild: Callable[[], Awaitable[None]]) -> None:
    """How the switch builds this page again (a page whose address changed, like a new chat once sent)."""
    setattr(client, _REBUILD_ATTR, lambda: _tracking_connect_handlers(client, rebuild))


def on_rebuild(client: Client, teardown: Callable[[], None]) -> None:
    """Call `teardown` before the page is built again (cancel what the old page follows)."""
    teardowns = getattr(client, _TEARDOWN_ATTR, None)
    if teardowns is None:
        teardowns = []
        setattr(client, _TEARDOWN_ATTR, teardowns)
    teardowns.append(teardown)


async def switch_language(client: Client, language: str) -> None:
    """Keep the choice and build the page again in that language, in place (no reload)."""
    language = normalize(language) or DEFAULT_LANGUAGE
    keep_choice(language)
    setattr(client, _LANGUAGE_ATTR, language)
    set_language(language)
    rebuild = getattr(client, _REBUILD_ATTR, None)
    if rebuild is None:
        return
    for teardown in getattr(client, _TEARDOWN_ATTR, None) or []:
        teardown()
    setattr(client, _TEARDOWN_ATTR, [])
    for child in list(client.layout.default_slot.children):
        if child is not client.page_container:
            child.delete()
    client.content.clear()
    client.layout._event_listeners.clear()  # the page's `ui.on` handlers; the new build adds its own
    for handler in getattr(client, _HANDLERS_ATTR, None) or []:  # those of deleted elements (drawers)
        if handler in client.connect_handlers:
            client.connect_handlers.remove(handler)
    client.layout.update()
    with client:
        ui.run_javascript(_browser_texts_js(language))
        await rebuild()


def _browser_texts_js(language: str, *, on_load: bool = False) -> str:
    """JavaScript that puts the browser's side in the reader's language.

    `<html lang>`; NiceGUI's reconnect popup; Quasar's own words (a table's "Records per page", a
    select's empty list), from the Quasar language pack NiceGUI ships (loaded when first needed).
    In the page's head (`on_load`) the language is set at once, the rest once the page is there.
    """
    tag = html_lang(language)
    if tag == "en":
        tag = "en-US"  # Quasar's English pack
    texts = json.dumps([_(CONNECTION_LOST), _(TRYING_TO_RECONNECT)], ensure_ascii=True)
    pack = json.dumps(f"/_nicegui/{__version__}/static/lang/{tag}.umd.prod.js")
    key = json.dumps(tag.replace("-", ""))
    rest = (
        f"(() => {{ const t = {texts}; document.querySelectorAll('#popup span')"
        ".forEach((s, i) => { if (t[i]) s.textContent = t[i]; });"
        f"const q = window.Quasar; if (!q) return; const set = () => q.lang[{key}] && q.lang.set(q.lang[{key}]);"
        f"if (q.lang[{key}]) {{ set(); return; }}"
        f"const s = document.createElement('script'); s.src = {pack}; s.onload = set; document.head.appendChild(s);"
        "})()"
    )
    app_texts = json.dumps({key: _(text) for key, text in BROWSER_TEXTS.items()}, ensure_ascii=True)
    lang = f"document.documentElement.lang = {json.dumps(html_lang(language))}; window.appTexts = {app_texts};"
    if on_load:
        return lang + f"document.addEventListener('DOMContentLoaded', () => {rest});"
    return lang + rest + ";"


async def _learn_timezone(client: Client) -> None:
    """Ask the browser for its time zone (it has connected); later pages format dates in it."""
    try:
        zone = await client.run_javascript("Intl.DateTimeFormat().resolvedOptions().timeZone", timeout=10)
    except Exception:  # a tab closed before it connected, or a browser that does not say: stay on UTC
        return
    if isinstance(zone, str) and 0 < len(zone) <= 64:
        setattr(client, _TIMEZONE_ATTR, zone)
        _store(TIMEZONE_KEY, zone)


def language_switch(client: Client) -> ui.select:
    """The header's language select (`language-switch`): changes the language of this page in place."""
    current = getattr(client, _LANGUAGE_ATTR, None) or DEFAULT_LANGUAGE

    async def changed(event: Any) -> None:
        if event.value and event.value != getattr(client, _LANGUAGE_ATTR, None):
            await switch_language(client, event.value)

    select = (
        ui.select(dict(LANGUAGES), value=current, on_change=changed)
        .props(
            f"dense borderless dark options-dense data-testid=language-switch data-language={current} "
            f"aria-label='" + _("Language") + "'"
        )
        .classes("language-switch")
        .mark("language-switch")
    )
    return select
