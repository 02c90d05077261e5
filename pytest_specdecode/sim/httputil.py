"""HTTP helpers shared by the native and OpenAI-compatible routes: JSON bodies, SSE, errors."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from pytest_specdecode.sim.logs import SIM_LOGGER

log = logging.getLogger(SIM_LOGGER)

SSE_DONE = b"data: [DONE]\n\n"

SENT_AT_HEADER = "x-specdecode-sent-monotonic"
"""The plugin's client adds this header to requests for a simulated server only: its
``time.monotonic()`` when it began sending. The simulator starts the request's schedule there
instead of at its own receipt, so the host's delay between the two (a few ms, more on a busy
machine, all of it at the measured request's expense) does not lengthen the simulated request.
The same name is ``pytest_specdecode.client.SIM_SENT_AT_HEADER`` (the core does not import
the simulator)."""

MAX_SEND_DELAY = 1.0
"""Longest send-to-receipt delay (s) the simulator takes from the header. Larger gaps are not a
busy host's scheduling but another machine's clock (monotonic clocks of two hosts differ by
hours) or a replayed header; the request then starts at its receipt, as without the header."""


def client_sent_at(request: Request, received: float) -> float | None:
    """When the client says it sent ``request`` (event-loop seconds, the same clock as
    ``time.monotonic()``), or None: no header, a value that is not a number, or one that does
    not fit a send on this host before ``received`` (see :data:`MAX_SEND_DELAY`)."""
    raw = request.headers.get(SENT_AT_HEADER)
    if raw is None:
        return None
    try:
        sent = float(raw)
    except ValueError:
        sent = math.nan
    if not math.isfinite(sent):
        log.warning(
            "Ignoring header %s: %r is not a time.monotonic() reading; the request starts "
            "at its receipt.",
            SENT_AT_HEADER,
            raw,
        )
        return None
    if not 0.0 <= received - sent <= MAX_SEND_DELAY:
        return None  # another host's clock, or not a delay of this host: use the receipt
    return sent


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
