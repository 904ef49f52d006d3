"""Translation: the one place that knows the languages, the catalogs and the reader's locale.

Texts people read are written in English in the code and marked for gettext: `_("…")`,
`ngettext(singular, plural, n)`, `pgettext(context, "…")`; a text defined at import time (a
constant, a table) is marked with `N_("…")` and translated where it is shown (`_(CONSTANT)`).
`pybabel` extracts the marks (`scripts/i18n.py`, `babel.cfg`) into `core/i18n/locale/messages.pot`;
each language's `.po` under `core/i18n/locale/<lang>/LC_MESSAGES/` is its source. The `.po` files are
compiled to `.mo` in memory when a language is first used, so a checkout never runs on a stale
binary catalog (docs/ARCHITECTURE.md, "Languages").

Which language: a context variable per request or page build (`use_language`), else the
resolver a front end installs for its own callbacks (the page's client, `set_language_resolver`),
else English. The REST edge sets it from `Accept-Language` (`core/web/errors.py` `LanguageMiddleware`).
Numbers and dates are formatted with Babel in that language and the reader's time zone
(`use_timezone`; UTC when the browser has not said).

Imports nothing of the app, so every part may use it.
"""

from __future__ import annotations

import gettext as _gettext
import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = [
    "DEFAULT_LANGUAGE",
    "LANGUAGES",
    "LOCALE_DIR",
    "N_",
    "_",
    "current_language",
    "current_timezone",
    "format_datetime",
    "format_number",
    "format_usd",
    "gettext",
    "html_lang",
    "negotiate",
    "ngettext",
    "normalize",
    "npgettext",
    "pgettext",
    "set_language",
    "set_language_resolver",
    "translations",
    "use_language",
    "use_timezone",
]

LOCALE_DIR = Path(__file__).parent / "locale"
DOMAIN = "messages"
DEFAULT_LANGUAGE = "en"
# The languages there is a catalog for, with their own names (the header's switch shows these).
LANGUAGES: dict[str, str] = {"en": "English", "zh_CN": "简体中文"}

_language: ContextVar[str | None] = ContextVar("language", default=None)
_timezone: ContextVar[str | None] = ContextVar("timezone", default=None)
_resolver: Callable[[], tuple[str | None, str | None]] | None = None


def N_(message: str) -> str:  # noqa: N802 (the gettext convention)
    """Mark a text for extraction without translating it now (it is translated where it is shown)."""
    return message


def normalize(tag: str | None) -> str | None:
    """The catalog a language tag means (`zh-CN`, `zh_Hans`, `zh` → `zh_CN`; `en-GB` → `en`), or None."""
    if not tag:
        return None
    tag = tag.strip().replace("-", "_")
    if tag in LANGUAGES:
        return tag
    primary = tag.split("_")[0].lower()
    if primary == "zh":
        rest = tag.lower()
        # Traditional Chinese is not Simplified Chinese: no catalog for it, so it is not claimed.
        if any(part in rest for part in ("_tw", "_hk", "_mo", "hant")):
            return None
        return "zh_CN"
    if primary == "en":
        return "en"
    return None


def negotiate(accept_language: str | None) -> str | None:
    """The best catalog for an `Accept-Language` header (quality values respected), or None."""
    if not accept_language:
        return None
    ranked: list[tuple[float, int, str]] = []
    for index, part in enumerate(accept_language[:1000].split(",")):
        piece = part.strip().split(";")
        tag, quality = piece[0].strip(), 1.0
        for param in piece[1:]:
            name, _, value = param.strip().partition("=")
            if name.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if tag and quality > 0:
            ranked.append((-quality, index, tag))
    for _q, _i, tag in sorted(ranked):
        if tag == "*":
            return DEFAULT_LANGUAGE
        language = normalize(tag)
        if language is not None:
            return language
    return None


def set_language_resolver(resolver: Callable[[], tuple[str | None, str | None]] | None) -> None:
    """Install how to find (language, time zone) when no request or page build set them (UI callbacks)."""
    global _resolver
    _resolver = resolver


def _resolved() -> tuple[str | None, str | None]:
    if _resolver is None:
        return None, None
    try:
        return _resolver()
    except Exception:  # a resolver that cannot tell (no page around) means "not known"
        return None, None


def current_language() -> str:
    """The language texts are translated into now."""
    language = _language.get()
    if language is None:
        language = _resolved()[0]
    return language if language in LANGUAGES else DEFAULT_LANGUAGE


def current_timezone() -> str:
    """The reader's IANA time zone (UTC until the browser has said)."""
    zone = _timezone.get() or _resolved()[1]
    return zone or "UTC"


@contextmanager
def use_language(language: str | None) -> Iterator[None]:
    """Translate into `language` inside the block (None: leave it to the resolver)."""
    token = _language.set(normalize(language) if language else None)
    try:
        yield
    finally:
        _language.reset(token)


def set_language(language: str | None) -> None:
    """Set the language for the rest of this request or task (the REST edge and page builds use it)."""
    _language.set(normalize(language) if language else None)


@contextmanager
def use_timezone(zone: str | None) -> Iterator[None]:
    """Format dates in `zone` inside the block."""
    token = _timezone.set(zone)
    try:
        yield
    finally:
        _timezone.reset(token)


def html_lang(language: str | None = None) -> str:
    """The BCP 47 tag of a catalog, for `<html lang>` and `Content-Language` (`zh_CN` → `zh-CN`)."""
    return (language or current_language()).replace("_", "-")


@cache
def translations(language: str) -> _gettext.NullTranslations:
    """The compiled catalog of a language (compiled from its `.po` on first use; cached).

    English is the source language: its catalog lists every text with an empty translation (the check of
    scripts/i18n.py wants them there), so it is not loaded, and Babel stays off the start-up path.
    """
    if language == DEFAULT_LANGUAGE:
        return _gettext.NullTranslations()
    from babel.messages.mofile import write_mo
    from babel.messages.pofile import read_po

    path = LOCALE_DIR / language / "LC_MESSAGES" / f"{DOMAIN}.po"
    if not path.is_file():
        return _gettext.NullTranslations()
    with path.open("rb") as source:
        catalog = read_po(source, locale=language)
    compiled = io.BytesIO()
    write_mo(compiled, catalog, use_fuzzy=False)
    compiled.seek(0)
    return _gettext.GNUTranslations(compiled)


def gettext(message: str) -> str:
    """`message` in the current language."""
    return translations(current_language()).gettext(message)


_ = gettext


def ngettext(singular: str, plural: str, n: int) -> str:
    """The singular or plural form for `n`, in the current language (format it with `n` after)."""
    return translations(current_language()).ngettext(singular, plural, n)


def pgettext(context: str, message: str) -> str:
    """`message` in the current language, told apart from the same English words by `context`."""
    return translations(current_language()).pgettext(context, message)


def npgettext(context: str, singular: str, plural: str, n: int) -> str:
    """`ngettext` with a context."""
    return translations(current_language()).npgettext(context, singular, plural, n)


def format_number(value: float | int, *, decimals: int | None = None) -> str:
    """A number written the reader's way (`1,234.5`; Chinese uses the same digits and separators)."""
    from babel.numbers import format_decimal

    if decimals is not None:
        pattern = "#,##0." + "0" * decimals if decimals else "#,##0"
        return format_decimal(value, format=pattern, locale=current_language())
    return format_decimal(value, locale=current_language())


def format_usd(amount: float) -> str:
    """A price in US dollars, to a tenth of a cent, or to four significant digits below a cent (`$0.00001650`)."""
    if amount == 0 or amount >= 0.01:
        return "$" + format_number(amount, decimals=3)
    digits = 3
    while amount * 10**digits < 1000 and digits < 12:
        digits += 1
    return "$" + format_number(amount, decimals=digits)


def format_datetime(moment: datetime | None, *, format: str = "medium") -> str:  # noqa: A002 (Babel's name)
    """A moment in the reader's locale and time zone (naive times are UTC, as the database keeps them)."""
    from babel.dates import format_datetime as babel_format_datetime

    if moment is None:
        return ""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        zone = ZoneInfo(current_timezone())
    except (ZoneInfoNotFoundError, ValueError):
        zone = ZoneInfo("UTC")
    return babel_format_datetime(moment, format=format, tzinfo=zone, locale=current_language())
