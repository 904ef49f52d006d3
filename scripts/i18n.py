"""Keep the catalogs in step with the code (docs/ARCHITECTURE.md, "Languages"; README, "Translations").

    python scripts/i18n.py extract   # the code's marked texts → core/i18n/locale/messages.pot
    python scripts/i18n.py update    # extract, then merge the template into every language's .po
    python scripts/i18n.py check     # fail on a text missing from a catalog, untranslated (zh_CN) or fuzzy
    python scripts/i18n.py compile   # write the .mo files beside the .po (optional: the app compiles in memory)

`extract` and `update` run `pybabel` itself (Babel's command line) with `babel.cfg` and the
keywords below; tests/test_i18n_catalog.py runs `problems()`.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCALE_DIR = ROOT / "core" / "i18n" / "locale"
TEMPLATE = LOCALE_DIR / "messages.pot"
LANGUAGES = ["en", "zh_CN"]
# English is the source language: its catalog lists every text with msgstr left empty (the msgid is shown).
MUST_TRANSLATE = ["zh_CN"]
# `N_` marks texts defined at import time; the rest are Babel's defaults (_, gettext, ngettext, pgettext, ...).
KEYWORDS = ["N_"]


def pybabel(*args: str) -> None:
    """Run Babel's command line (`pybabel …`) in the project folder."""
    from babel.messages.frontend import CommandLineInterface

    CommandLineInterface().run(["pybabel", "-q", *args])


def extract(output: Path = TEMPLATE, source_dir: Path = ROOT, mapping: Path = ROOT / "babel.cfg") -> Path:
    """Extract the marked texts of the code into a `.pot` template."""
    args = [
        "extract",
        "-F",
        str(mapping),
        "-o",
        str(output),
        "--no-location",
        "--sort-output",
        "--project=a2a-delegation-chat",
        "--no-wrap",
    ]
    for keyword in KEYWORDS:
        args += ["-k", keyword]
    pybabel(*args, str(source_dir))
    return output


def update() -> None:
    """Extract, then merge the template into each language's `.po` (new texts arrive untranslated)."""
    extract()
    for language in LANGUAGES:
        po = LOCALE_DIR / language / "LC_MESSAGES" / "messages.po"
        if po.exists():
            pybabel(
                "update",
                "-i",
                str(TEMPLATE),
                "-d",
                str(LOCALE_DIR),
                "-l",
                language,
                "--no-wrap",
                "--ignore-obsolete",
                "--no-fuzzy-matching",
            )
        else:
            pybabel("init", "-i", str(TEMPLATE), "-d", str(LOCALE_DIR), "-l", language, "--no-wrap")


def compile_catalogs() -> None:
    """Write `messages.mo` beside each `.po` (for tools that want files; the app does not need them)."""
    pybabel("compile", "-d", str(LOCALE_DIR), "--statistics")


def _key(message) -> tuple[str, str | None]:
    msgid = message.id[0] if isinstance(message.id, tuple | list) else message.id
    return msgid, message.context


def problems(source_dir: Path = ROOT, locale_dir: Path = LOCALE_DIR, mapping: Path = ROOT / "babel.cfg") -> list[str]:
    """What is wrong with the catalogs against the code: missing, untranslated or fuzzy texts (empty: all good)."""
    from babel.messages.pofile import read_po

    with tempfile.TemporaryDirectory() as tmp:
        pot = extract(Path(tmp) / "messages.pot", source_dir, mapping)
        with pot.open("rb") as f:
            template = read_po(f)
    wanted = {_key(m): m for m in template if m.id}
    found: list[str] = []
    for language in LANGUAGES:
        path = locale_dir / language / "LC_MESSAGES" / "messages.po"
        if not path.exists():
            found.append(f"{language}: no catalog at {path}")
            continue
        with path.open("rb") as f:
            catalog = read_po(f, locale=language)
        have = {_key(m): m for m in catalog if m.id}
        for key, message in wanted.items():
            entry = have.get(key)
            label = f"{language}: {key[0]!r}" + (f" (context {key[1]!r})" if key[1] else "")
            if entry is None:
                found.append(f"{label} is not in the catalog (run: python scripts/i18n.py update)")
                continue
            if entry.fuzzy:
                found.append(f"{label} is fuzzy (check the translation and remove the fuzzy flag)")
            if language in MUST_TRANSLATE:
                strings = entry.string if isinstance(entry.string, tuple | list) else (entry.string,)
                if not all(s and s.strip() for s in strings):
                    found.append(f"{label} has no translation")
                if message.pluralizable != entry.pluralizable:
                    found.append(f"{label} differs in plural forms from the code")
    return found


def main(argv: list[str]) -> int:
    """The command line (see the module docstring)."""
    command = argv[1] if len(argv) > 1 else "check"
    if command == "extract":
        print(extract())
    elif command == "update":
        update()
    elif command == "compile":
        compile_catalogs()
    elif command == "check":
        found = problems()
        for line in found:
            print(line)
        print(f"{len(found)} problem(s)" if found else "catalogs complete")
        return 1 if found else 0
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
