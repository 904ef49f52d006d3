r"""What every JSON body sent to this app's HTTP routes has in common, and how a bad one is answered.

A body is a `RequestBody`: a field the route does not know is refused (422 naming the field)
rather than silently ignored, and its text must be valid Unicode. JSON can spell a lone surrogate
(`"\ud800"`), which no database column can store; pydantic refuses it in some fields and not in
others, so every string of a body is checked here. The 422 answer repeats the bad input, which
FastAPI's own answer then fails to encode (a 500); the answer here escapes it.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, field_validator
from starlette.responses import Response


def has_lone_surrogate(text: str) -> bool:
    """True when `text` holds a UTF-16 surrogate on its own (it cannot be encoded as UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _strings_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings_in(k), *_strings_in(v))]
    if isinstance(value, list | tuple | set):
        return [s for item in value for s in _strings_in(item)]
    return []


class RequestBody(BaseModel):
    """A JSON body sent to the app: a field it does not know is refused (422 naming it), text must be Unicode."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        if any(has_lone_surrogate(s) for s in _strings_in(value)):
            raise ValueError("Input should be valid Unicode text; it holds a lone UTF-16 surrogate such as \\ud800")
        return value


async def validation_error_response(_request: Request, exc: Exception) -> Response:
    """FastAPI's 422 (`{"detail": [errors]}`, with `code` as every API error, errors.py), as ASCII JSON."""
    assert isinstance(exc, RequestValidationError)
    body = json.dumps(
        {"detail": jsonable_encoder(exc.errors()), "code": "invalid_request"}, ensure_ascii=True, default=repr
    )
    return Response(body, status_code=422, media_type="application/json")
