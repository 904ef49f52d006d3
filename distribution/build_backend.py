"""The checkout's build backend (pyproject.toml, `[build-system]`): setuptools, with the app's packaging.

- A wheel or an sdist of the checkout (`python -m build`, `pip install .`, `pip wheel .`) is the package people
  install: the tree scripts/build_package.py stages (one import package, `a2a_delegation_chat`), built by
  setuptools. The sdist carries that staged tree with a plain setuptools pyproject.toml of its own.
- An editable install (`pip install -e .`, scripts/setup) is the checkout as it is: setuptools on the
  repository's own pyproject.toml (`app`, `core`, `ui`, `models`, the kit), as the repository's tests use it.

docs/ARCHITECTURE.md, "Packaging", says why.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from setuptools import build_meta as setuptools_backend

ROOT = Path(__file__).resolve().parent.parent

# The editable install and what every build needs first: setuptools's own hooks, on the checkout.
build_editable = setuptools_backend.build_editable
get_requires_for_build_editable = setuptools_backend.get_requires_for_build_editable
prepare_metadata_for_build_editable = setuptools_backend.prepare_metadata_for_build_editable
get_requires_for_build_wheel = setuptools_backend.get_requires_for_build_wheel
get_requires_for_build_sdist = setuptools_backend.get_requires_for_build_sdist


@contextmanager
def staged_app() -> Iterator[Path]:
    """The app's staged source tree (scripts/build_package.py), as the working folder until the block ends."""
    spec = importlib.util.spec_from_file_location("build_package", ROOT / "scripts" / "build_package.py")
    assert spec is not None and spec.loader is not None
    build_package = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_package)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    before = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="a2a-stage-") as tmp:
        tree = build_package.stage_app(project, Path(tmp))
        os.chdir(tree)
        try:
            yield tree
        finally:
            os.chdir(before)


def _in_staged_tree(hook: Callable[..., str], directory: str, *args: Any) -> str:
    with staged_app():
        return hook(os.path.abspath(directory), *args)


def build_sdist(sdist_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    """The app's sdist: the staged tree."""
    return _in_staged_tree(setuptools_backend.build_sdist, sdist_directory, config_settings)


def build_wheel(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    """The app's wheel, built from the staged tree."""
    return _in_staged_tree(setuptools_backend.build_wheel, wheel_directory, config_settings)


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    """The wheel's metadata (the staged tree's: its console script, no pytest plugin)."""
    return _in_staged_tree(setuptools_backend.prepare_metadata_for_build_wheel, metadata_directory, config_settings)
