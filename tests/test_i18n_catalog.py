"""The catalogs against the code: every text people read is in both catalogs, and zh_CN translates it.

The check extracts the marked texts with Babel (`pybabel extract`, babel.cfg) and fails on a text
missing from a catalog, an untranslated zh_CN entry or a fuzzy one (scripts/i18n.py `problems`).
The last tests show that the check fails when it should, on a copy of the catalogs.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from babel.messages.pofile import read_po, write_po

from core.i18n import LOCALE_DIR, translations

ROOT = Path(__file__).resolve().parent.parent


def _load_script():
    spec = importlib.util.spec_from_file_location("i18n_script", ROOT / "scripts" / "i18n.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


i18n_script = _load_script()


def test_every_text_in_the_code_is_in_both_catalogs_and_translated_into_chinese() -> None:
    assert i18n_script.problems() == []


def test_the_catalogs_compile_and_chinese_has_the_seeds_words() -> None:
    zh = translations("zh_CN")
    assert zh.gettext("completed") == "完成"
    assert zh.pgettext("task state, before the first token", "working") == "等待回复…"
    assert zh.gettext("working") == "生成中…"
    assert zh.pgettext("task state, timed out", "failed") == "任务超时"
    assert zh.pgettext("task state, its stream was lost", "failed") == "连接中断"
    assert translations("en").gettext("completed") == "completed"


@pytest.fixture
def project_copy(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A one-file project with the real catalogs copied beside it: (source dir, locale dir, babel mapping)."""
    source = tmp_path / "src"
    (source / "core").mkdir(parents=True)
    locale = tmp_path / "locale"
    shutil.copytree(LOCALE_DIR, locale)
    # The copied catalogs hold every real text; the project copy marks just one of them and one new text.
    (source / "core" / "page.py").write_text(
        'from core.i18n import _\n\nLABELS = [_("Save"), _("A text nobody has translated yet")]\n'
    )
    mapping = tmp_path / "babel.cfg"
    mapping.write_text("[python: core/**.py]\n")
    return source, locale, mapping


def _edit_catalog(locale: Path, language: str, msgid: str, *, string: str = "", fuzzy: bool = False) -> None:
    path = locale / language / "LC_MESSAGES" / "messages.po"
    with path.open("rb") as f:
        catalog = read_po(f, locale=language)
    catalog.delete(msgid)  # a replaced entry would keep its old flags
    catalog.add(msgid, string, flags=["fuzzy"] if fuzzy else [])
    with path.open("wb") as f:
        write_po(f, catalog)


def test_the_check_fails_on_a_text_missing_from_the_catalogs(project_copy) -> None:
    source, locale, mapping = project_copy
    found = i18n_script.problems(source, locale, mapping)
    assert any("en: 'A text nobody has translated yet' is not in the catalog" in p for p in found)
    assert any("zh_CN: 'A text nobody has translated yet' is not in the catalog" in p for p in found)
    assert not any("'Save'" in p for p in found)


def test_the_check_fails_on_an_untranslated_chinese_entry(project_copy) -> None:
    source, locale, mapping = project_copy
    _edit_catalog(locale, "en", "A text nobody has translated yet")
    _edit_catalog(locale, "zh_CN", "A text nobody has translated yet")
    assert i18n_script.problems(source, locale, mapping) == [
        "zh_CN: 'A text nobody has translated yet' has no translation"
    ]


def test_the_check_fails_on_a_fuzzy_entry(project_copy) -> None:
    source, locale, mapping = project_copy
    _edit_catalog(locale, "en", "A text nobody has translated yet")
    _edit_catalog(locale, "zh_CN", "A text nobody has translated yet", string="一段文字", fuzzy=True)
    assert i18n_script.problems(source, locale, mapping) == [
        "zh_CN: 'A text nobody has translated yet' is fuzzy (check the translation and remove the fuzzy flag)"
    ]
    _edit_catalog(locale, "zh_CN", "A text nobody has translated yet", string="一段还没人翻译的文字")
    assert i18n_script.problems(source, locale, mapping) == []
