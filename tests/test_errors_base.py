"""Every exception class of `core/` is an `AppError` with a stable, unique `code` and a name ending in Error.

The classes are found by importing every module under `core/` and keeping the exception classes defined
there, so an error added or moved later is checked without this file changing (issue 35, item 4).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import core
from core.errors import AppError

# Errors whose `code` is a number of a wire protocol, set per instance, rather than a class-level string:
# the JSON-RPC error of a broker line or answer (seed 003's wire; tests/test_broker_wire.py reads `.code`).
NUMERIC_WIRE_CODE = {"RpcError", "RpcLineError"}


def core_exception_classes() -> list[type[BaseException]]:
    """Every exception class defined (not merely imported) in a module under `core/`."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(core.__path__, "core."):
        if info.name.endswith("__main__"):
            continue  # running it would start the program
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


def test_the_walk_finds_the_errors_of_core() -> None:
    names = {cls.__name__ for cls in core_exception_classes()}
    assert {"ChatError", "LLMError", "ApiError"} <= names
    assert len(names) > 30


def test_every_core_error_is_an_app_error() -> None:
    strays = [
        f"{cls.__module__}.{cls.__qualname__}" for cls in core_exception_classes() if not issubclass(cls, AppError)
    ]
    assert strays == []


def test_every_core_error_name_ends_in_error() -> None:
    misnamed = [
        f"{cls.__module__}.{cls.__qualname__}" for cls in core_exception_classes() if not cls.__name__.endswith("Error")
    ]
    assert misnamed == []


def test_every_core_error_defines_its_own_non_empty_code() -> None:
    missing = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in core_exception_classes()
        if cls.__name__ not in NUMERIC_WIRE_CODE
        and not (isinstance(cls.__dict__.get("code"), str) and cls.__dict__["code"])
    ]
    assert missing == []


def test_codes_are_unique_across_classes() -> None:
    owners: dict[str, list[str]] = {}
    for cls in core_exception_classes():
        code = cls.__dict__.get("code")
        if isinstance(code, str):
            owners.setdefault(code, []).append(f"{cls.__module__}.{cls.__qualname__}")
    assert {code: names for code, names in owners.items() if len(names) > 1} == {}


def test_app_error_has_a_code_of_its_own() -> None:
    assert AppError.code == "app_error"
    assert issubclass(AppError, Exception)
