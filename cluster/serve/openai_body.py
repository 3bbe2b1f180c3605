"""A route's JSON body parsed and validated as FastAPI would, but a large one on a worker thread: a
body of megabytes (a prompt of a million token ids) took the event loop every stream shares for
over a second."""

from __future__ import annotations

import asyncio
import email.message
import json

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

OFF_LOOP_BYTES = 64 << 10  # smaller bodies parse in well under a millisecond: not worth the thread hop


def parse_body(model_cls: type[BaseModel], raw: bytes, content_type: str | None) -> BaseModel:
    """`raw` as `model_cls`, refusing as FastAPI's own body parameter does (the same error types, so
    openai_protocol.validation_error words them alike)."""
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    data = _json(raw) if _is_json(content_type) else raw
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None


def _is_json(content_type: str | None) -> bool:
    """FastAPI's rule: no Content-Type, or one of type */json or */*+json."""
    if not content_type:
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def _json(raw: bytes):
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": e.msg}}]) from None
    except Exception:  # noqa: BLE001 - bytes that are not UTF-8 (nor UTF-16/32), nesting past the recursion limit
        raise HTTPException(400, "There was an error parsing the body") from None


def parsed(model_cls: type[BaseModel], handler):
    """A route `(request)` that calls `handler(body, request)` with the parsed body."""
    async def route(request: Request):
        raw = await request.body()
        content_type = request.headers.get("content-type")
        if len(raw) < OFF_LOOP_BYTES:
            body = parse_body(model_cls, raw, content_type)
        else:
            body = await asyncio.to_thread(parse_body, model_cls, raw, content_type)
        return await handler(body, request)
    route.__name__ = route.__qualname__ = handler.__name__  # the OpenAPI operation's name
    return route
