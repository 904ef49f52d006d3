"""Issue 37, item 1: what the built distributions hold, and where the settings are read from.

The build itself (the wheels, a fresh environment, the console script to a first page and a chat turn, the
kit's examples) is scripts/package-check, run by .ci/run; these are the quick checks of the staged trees.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from core import settings as settings_module
from core.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("staged")
    subprocess.run([sys.executable, "scripts/build_package.py", "--stage-only", str(out)], cwd=ROOT, check=True)
    return out


def test_the_app_distribution_has_one_import_name_and_everything_the_app_reads(staged: Path) -> None:
    tree = staged / "app"
    assert sorted(p.name for p in tree.iterdir()) == [
        "MANIFEST.in",
        "README.md",
        "a2a_delegation_chat",
        "pyproject.toml",
    ]
    package = tree / "a2a_delegation_chat"
    for needed in (
        "__init__.py",
        "__main__.py",
        "app.py",
        "assets/app.css",
        "assets/app.js",
        "config/server.json",
        "examples/echo_agent.py",
        "models/migrations/env.py",
        "models/migrations/script.py.mako",
        "models/migrations/versions/0001_initial_schema.py",
        "core/i18n/locale/zh_CN/LC_MESSAGES/messages.po",
    ):
        assert (package / needed).is_file(), needed
    assert not list(package.rglob("__pycache__"))
    pyproject = tomllib.loads((tree / "pyproject.toml").read_text(encoding="utf-8"))
    root = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert pyproject["project"]["dependencies"] == root["dependencies"]
    assert pyproject["project"]["scripts"] == {"a2a-delegation-chat": "a2a_delegation_chat:main"}
    assert pyproject["tool"]["setuptools"]["packages"]["find"]["include"] == [
        "a2a_delegation_chat",
        "a2a_delegation_chat.*",
    ]
    assert "entry-points" not in pyproject["project"]  # the kit is its own distribution


def test_the_kit_distribution_depends_on_pytest_playwright_and_httpx_only(staged: Path) -> None:
    tree = staged / "kit"
    pyproject = tomllib.loads((tree / "pyproject.toml").read_text(encoding="utf-8"))
    project = pyproject["project"]
    assert project["name"] == "a2a-delegation-chat-testing"
    assert [d.split("<")[0].split(">")[0] for d in project["dependencies"]] == ["pytest", "playwright", "httpx"]
    assert project["entry-points"]["pytest11"] == {"a2a-delegation-chat": "a2a_chat_testing.plugin"}
    assert pyproject["tool"]["setuptools"]["packages"] == ["a2a_chat_testing"]
    assert (tree / "a2a_chat_testing" / "plugin.py").is_file()


def test_the_entry_point_puts_the_app_folder_on_the_path_of_its_own_process_only(staged: Path) -> None:
    package = staged / "app" / "a2a_delegation_chat"
    code = (
        "import sys, a2a_delegation_chat as p; "
        "print(p.APP_DIR); print('core' in sys.modules, any(s == str(p.APP_DIR) for s in sys.path))"
    )
    env = {**os.environ, "PYTHONPATH": str(package.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=package.parent, env=env, capture_output=True, text=True, check=True
    )
    app_dir, imported = out.stdout.splitlines()
    assert Path(app_dir) == package  # installed: the package's own folder holds app.py
    assert imported == "False False"  # importing the package changes nothing; only `main` does
    spec = importlib.util.spec_from_file_location(
        "wrapper", ROOT / "distribution" / "a2a_delegation_chat" / "__init__.py"
    )
    assert spec is not None and spec.loader is not None
    wrapper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wrapper)
    assert wrapper.APP_DIR == ROOT  # a checkout: the repository's root


def test_env_and_config_files_are_read_from_the_working_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENV_FILE")
    monkeypatch.delenv("DATA_DIR")
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("PORT=4321\nDATA_DIR=here\n", encoding="utf-8")
    settings = load_settings()
    assert settings.port == 4321 and settings.data_dir == Path("here")
    assert settings_module.DEFAULT_ENV_FILE == Path(".env")
    # Without a config/server.json in the working folder, the one beside the code (checkout or package).
    assert settings_module.SHIPPED_CONFIG_FILE == ROOT / "config" / "server.json"


def test_the_checkouts_build_backend_builds_the_package_and_installs_the_checkout_editable() -> None:
    spec = importlib.util.spec_from_file_location("build_backend", ROOT / "distribution" / "build_backend.py")
    assert spec is not None and spec.loader is not None
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    from setuptools import build_meta

    assert backend.build_editable is build_meta.build_editable  # pip install -e .: the checkout as it is
    before = Path.cwd()
    with backend.staged_app() as tree:  # python -m build, pip install .: the staged package
        assert Path.cwd() == tree
        assert (tree / "a2a_delegation_chat" / "app.py").is_file()
        assert (
            tomllib.loads((tree / "pyproject.toml").read_text())["build-system"]["build-backend"]
            == "setuptools.build_meta"
        )
    assert Path.cwd() == before and not tree.exists()
