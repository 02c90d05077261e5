"""HTTP helpers shared by the native and OpenAI-compatible routes: JSON bodies, SSE, errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

SSE_DONE = b"data: [DONE]\n\n"


class BadRequestBody(Exception):
    """The body is not JSON (FastAPI's RequestValidationError, answered as 400 upstream)."""


def dumps(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def sse_event(payload: Any) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"


async def read_json_object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else None
    except ValueError as exc:
        raise BadRequestBody(f"JSON decode error: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequestBody("The request body must be a JSON object.")
    return body


def openai_error(
    message: str, *, err_type: str = "BadRequestError", status: int = HTTPStatus.BAD_REQUEST
) -> dict[str, Any]:
    """SGLang's OpenAI-style ``ErrorResponse`` object."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


def openai_error_response(
    message: str, *, err_type: str = "BadRequestError", status: int = HTTPStatus.BAD_REQUEST
) -> JSONResponse:
    return JSONResponse(openai_error(message, err_type=err_type, status=status), status_code=status)


def validation_error_response(message: str) -> JSONResponse:
    """What SGLang's RequestValidationError handler sends (400 instead of FastAPI's 422)."""
    return openai_error_response(message, err_type=HTTPStatus.BAD_REQUEST.phrase)


def native_error_response(message: str, status: int = HTTPStatus.BAD_REQUEST) -> JSONResponse:
    """SGLang's native ``{"error": {"message": ...}}`` body."""
    return JSONResponse({"error": {"message": message}}, status_code=status)


def error_stream(error: dict[str, Any]) -> StreamingResponse:
    """An error inside a 200 stream: one ``data: {"error": ...}`` event, then ``[DONE]``."""

    async def events() -> AsyncIterator[bytes]:
        yield sse_event({"error": error})
        yield SSE_DONE

    return StreamingResponse(events(), media_type="text/event-stream")


def require_json_content_type(request: Request) -> None:
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise BadRequestBody(
            "1 validation error: {'loc': ('header', 'content-type'), "
            "'msg': \"Unsupported Media Type: Only 'application/json' is allowed\", "
            "'type': 'value_error'}"
        )
