"""The Starlette application: routes, API-key middleware, lifespan (engine and warm-up)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import time
from collections.abc import AsyncIterator

import anyio
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from pytest_specdecode.sim import native, openai_api
from pytest_specdecode.sim.faults import kill_self
from pytest_specdecode.sim.logs import SIM_LOGGER
from pytest_specdecode.sim.server import ServerStatus, SimServer

log = logging.getLogger(SIM_LOGGER)

FLUSH_CACHE_BODY = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
#: How long the warm-up keeps /health at 503, relative to the load phases (real 0.5.15: ~35 s of
#: 503 after ~50 s with the port closed).
WARMUP_SHARE_OF_LOAD = 0.7
WARMUP_REQUEST = {
    "text": "The capital city of France is",
    "sampling_params": {"temperature": 0, "max_new_tokens": 8},
}


class ApiKeyMiddleware:
    """``--api-key``: ``Authorization: Bearer <key>`` or 401, like SGLang's middleware.

    Upstream lets OPTIONS, ``/health*`` and ``/metrics`` through without a key.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS":
            path: str = scope["path"]
            exempt = path.startswith(("/health", "/metrics"))
            if not exempt and Headers(scope=scope).get("authorization") != self._expected:
                response = JSONResponse({"error": "Unauthorized"}, status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _sim(request: Request) -> SimServer:
    server: SimServer = request.app.state.sim
    return server


async def health(request: Request) -> Response:
    return Response(status_code=await _sim(request).health_status())


async def model_info(request: Request) -> Response:
    return JSONResponse(_sim(request).model_info())


async def get_model_info(request: Request) -> Response:
    server = _sim(request)
    server.log_deprecated_once("/get_model_info", "/model_info")
    return JSONResponse(server.model_info())


async def server_info(request: Request) -> Response:
    return JSONResponse(_sim(request).server_info())


async def get_server_info(request: Request) -> Response:
    server = _sim(request)
    server.log_deprecated_once("/get_server_info", "/server_info")
    return JSONResponse(server.server_info())


async def flush_cache(request: Request) -> Response:
    flushed = _sim(request).engine.flush_cache()
    return PlainTextResponse(FLUSH_CACHE_BODY, status_code=200 if flushed else 400)


def _model_card(server: SimServer, name: str) -> dict[str, object]:
    return {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": name,
        "parent": None,
        "max_model_len": server.memory.context_len,
    }


async def list_models(request: Request) -> Response:
    server = _sim(request)
    return JSONResponse(
        {"object": "list", "data": [_model_card(server, server.args.served_model_name)]}
    )


async def retrieve_model(request: Request) -> Response:
    server = _sim(request)
    model = request.path_params["model"]
    if model != server.args.served_model_name:
        return JSONResponse(
            {
                "error": {
                    "message": f"The model '{model}' does not exist",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            },
            status_code=404,
        )
    return JSONResponse(_model_card(server, model))


async def metrics(request: Request) -> Response:
    server = _sim(request)
    if server.metrics is None:  # the route only exists with --enable-metrics
        return JSONResponse({"detail": "Not Found"}, status_code=404)
    return Response(server.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


async def get_load(request: Request) -> Response:
    return JSONResponse(_sim(request).load())


async def weight_version_gone(request: Request) -> Response:
    return JSONResponse(
        {
            "object": "error",
            "message": "Endpoint '/get_weight_version' or '/weight_version' is deprecated. "
            "Please use '/model_info' instead.",
            "type": "404",
            "param": None,
            "code": 404,
        },
        status_code=404,
    )


async def ping(request: Request) -> Response:
    return Response(status_code=200)


async def _http_error(request: Request, exc: Exception) -> Response:
    # FastAPI's shape for unknown routes and methods: {"detail": "Not Found"}.
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "Internal Server Error"
    return JSONResponse({"detail": detail}, status_code=status)


def _request_self(
    host: str,
    port: int,
    method: str,
    path: str,
    *,
    timeout: float,
    headers: dict[str, str],
    body: bytes | None = None,
) -> int:
    """One request to this server, from the warm-up's thread; returns the status code.

    The standard library's client, as SGLang's warm-up uses a plain ``requests`` call: httpx
    would import httpcore and, where installed, trio (0.3 s of CPU at every launch). It reads
    no proxy variable, so a proxy never routes localhost (upstream issue #2468)."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


async def run_warmup(server: SimServer) -> None:
    """SGLang's warm-up thread: wait for HTTP, send one generate to itself, then declare Up."""
    args = server.args
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(args.host, args.host)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    poll = min(1.0, 1.0 / server.sim.speed)
    for _ in range(120):
        await asyncio.sleep(poll)
        try:
            status = await asyncio.to_thread(
                _request_self, host, args.port, "GET", "/model_info", timeout=5, headers=headers
            )
        except (OSError, http.client.HTTPException):  # refused, reset, cut off: not serving yet
            continue
        if status == 200:
            break
    # The rest of SGLang's warm-up (tokenizer, detokenizer, first batches): /health answers
    # 503 meanwhile, ~35 s after a ~50 s load on real 0.5.15, so 0.7 x the load time here.
    await asyncio.sleep(WARMUP_SHARE_OF_LOAD * server.sim.load_seconds / server.sim.speed)
    if not args.skip_server_warmup:
        body = json.dumps(WARMUP_REQUEST).encode()
        try:
            status = await asyncio.to_thread(
                _request_self, host, args.port, "POST", "/generate", timeout=600, body=body,
                headers={**headers, "Content-Type": "application/json"},
            )  # fmt: skip
            failure = None if 200 <= status < 300 else f"HTTP {status} from POST /generate"
        except (OSError, http.client.HTTPException) as exc:
            failure = repr(exc)
        if failure is not None:
            # Upstream kills its whole process tree when the warm-up fails.
            log.error("Initialization failed. warmup error: %s", failure)
            kill_self()
    server.status = ServerStatus.UP
    server.faults.armed = True
    if server.faults.kind == "hang":
        server.engine.freeze()
    log.info("The server is fired up and ready to roll!")


def build_app(server: SimServer) -> Starlette:
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health, methods=["GET"]),
        Route("/model_info", model_info, methods=["GET"]),
        Route("/get_model_info", get_model_info, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/get_server_info", get_server_info, methods=["GET"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
        Route("/generate", native.generate, methods=["POST", "PUT"]),
        Route("/v1/completions", openai_api.completions, methods=["POST"]),
        Route("/v1/chat/completions", openai_api.chat_completions, methods=["POST"]),
        Route("/ping", ping, methods=["GET"]),
    ]
    if server.era.get_load_route:
        routes.append(Route("/get_load", get_load, methods=["GET"]))
    if server.era.weight_version_gone:
        routes.append(Route("/weight_version", weight_version_gone, methods=["GET"]))
        routes.append(Route("/get_weight_version", weight_version_gone, methods=["GET"]))
    if server.metrics is not None:
        routes.append(Route("/metrics", metrics, methods=["GET"]))
    middleware = []
    if server.args.api_key:
        middleware.append(Middleware(ApiKeyMiddleware, api_key=server.args.api_key))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Starlette streams through anyio, whose asyncio backend is imported at its first use:
        # 25-50 ms in which the first streamed request's tokens would pile up into one chunk.
        async with anyio.create_task_group():
            pass
        engine_task = asyncio.create_task(server.engine.run(), name="sim-engine")
        warmup_task = asyncio.create_task(run_warmup(server), name="sim-warmup")
        try:
            yield
        finally:
            for task in (warmup_task, engine_task):
                task.cancel()
            await asyncio.gather(warmup_task, engine_task, return_exceptions=True)

    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={404: _http_error, 405: _http_error},
        lifespan=lifespan,
    )
    app.state.sim = server
    return app
