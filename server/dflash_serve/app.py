"""The FastAPI application: routes, authentication, error shapes."""

from __future__ import annotations

import asyncio
import logging
import secrets
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import __version__
from .engine_worker import EngineInfo, EngineWorker, JobFn, State
from .errors import ApiError, engine_error, error_response
from .generation import Generation
from .metrics import Metrics
from .schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from .settings import Settings

log = logging.getLogger("dflash_serve")

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 429, 500, 503)
}
ROUTES = (
    "/health",
    "/metrics",
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
    "/tokenize",
    "/detokenize",
)


def default_engine_factory(settings: Settings) -> Callable[[], Any]:
    def load() -> Any:
        import dflash  # deferred: the HTTP side starts (and answers /health 503) while this loads

        kwargs = settings.engine_kwargs()
        kwargs.setdefault("progress", sys.stderr.isatty())  # a progress bar for the weights
        log.info("loading model %s", kwargs["model_path"] or "(the embedded default model)")
        return dflash.Engine(**kwargs)

    return load


def create_app(settings: Settings, engine_factory: Callable[[], Any] | None = None) -> FastAPI:
    """The app; the engine loads in the worker thread when the app starts (lifespan).

    Hooks appended to `app.state.on_fatal` run if loading fails (main() stops the server)."""
    metrics = Metrics()
    on_fatal: list[Callable[[BaseException], None]] = []

    def fatal(exc: BaseException) -> None:
        for hook in on_fatal:
            hook(exc)

    worker = EngineWorker(
        engine_factory or default_engine_factory(settings), settings.queue_size, metrics, fatal
    )
    api_key = settings.api_key.get_secret_value().encode() if settings.api_key else None
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        worker.start()
        yield
        await asyncio.to_thread(worker.stop)

    app = FastAPI(title="dflash-serve", version=__version__, lifespan=lifespan)
    app.state.worker, app.state.metrics, app.state.settings = worker, metrics, settings
    app.state.on_fatal = on_fatal
    app.add_middleware(CountRequests, metrics=metrics)

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key):
            raise ApiError(401, "Invalid or missing API key (Authorization: Bearer KEY)")

    auth = [Depends(authorize)]

    ready = worker.check_ready

    def model_id(info: EngineInfo) -> str:
        return settings.model_alias or Path(info.model_path).stem or "dflash"

    def shaper(info: EngineInfo) -> Callable[[dict[str, Any]], dict[str, Any]]:
        name = model_id(info)
        return lambda d: {**d, "model": name}

    def check_ids(tokens: list[int], info: EngineInfo, what: str) -> None:
        bad = [t for t in tokens if t >= info.n_vocab]
        if bad:
            raise ApiError(400, f"{what}: token id {bad[0]} out of range (n_vocab = {info.n_vocab})")

    async def quick(fn: JobFn) -> Any:
        job = worker.submit(fn)
        kind, value = await job.get()
        if kind == "error":
            raise engine_error(value)
        await job.get()  # terminal 'end'
        return value

    # ---- routes ----
    @app.get("/health", responses={503: {"model": ErrorResponse}})
    async def health() -> Response:
        if worker.state is State.READY:
            return JSONResponse({"status": "ok"})
        if worker.state is State.LOADING:
            return error_response(503, "Loading model")
        return error_response(503, f"Model not available: {worker.load_error or worker.state.value}")

    @app.get("/metrics", dependencies=auth, response_class=Response)
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models", dependencies=auth, response_model=ModelList, responses=ERRORS)
    async def models() -> dict[str, Any]:
        info = ready()
        meta = {"n_ctx": info.n_ctx, "n_vocab": info.n_vocab, "model_path": info.model_path}
        meta["draft_path"] = info.draft_path  # the packaged drafter too, with the default model
        card = {
            "id": model_id(info),
            "object": "model",
            "created": created,
            "owned_by": "dflash",
            "meta": meta,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions", dependencies=auth, responses={200: {"model": CompletionResponse}, **ERRORS})
    async def completions(body: CompletionRequest, request: Request) -> Response:
        info = ready()
        prompt = body.prompt
        if isinstance(prompt, list):
            check_ids(prompt, info, "prompt")  # type: ignore[arg-type]
        kw = body.engine_kwargs()
        gen = Generation(worker, metrics, request, "completions", shaper(info))
        if body.stream:
            return await gen.stream(
                lambda eng, cancel: eng.create_completion(prompt, stream=True, cancel=cancel, **kw),
                body.include_usage,
            )
        return await gen.complete(lambda eng, cancel: eng.create_completion(prompt, cancel=cancel, **kw))

    @app.post(
        "/v1/chat/completions", dependencies=auth, responses={200: {"model": CompletionResponse}, **ERRORS}
    )
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        info = ready()
        messages = body.message_dicts()
        kw = body.engine_kwargs()
        gen = Generation(worker, metrics, request, "chat", shaper(info))
        if body.stream:
            return await gen.stream(
                lambda eng, cancel: eng.create_chat_completion(messages, stream=True, cancel=cancel, **kw),
                body.include_usage,
            )
        return await gen.complete(
            lambda eng, cancel: eng.create_chat_completion(messages, cancel=cancel, **kw)
        )

    @app.post("/tokenize", dependencies=auth, response_model=TokenizeResponse, responses=ERRORS)
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        ready()
        tokens = await quick(
            lambda eng, _: eng.tokenize(
                body.content, add_special=body.add_special, parse_special=body.parse_special
            )
        )
        return {"tokens": list(tokens)}

    @app.post("/detokenize", dependencies=auth, response_model=DetokenizeResponse, responses=ERRORS)
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        check_ids(body.tokens, ready(), "tokens")
        return {"content": await quick(lambda eng, _: eng.detokenize(body.tokens))}

    # ---- errors, all in the OpenAI shape ----
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        level = logging.ERROR if exc.status >= 500 else logging.INFO
        log.log(level, "%s %s %d %s", request.method, request.url.path, exc.status, exc.message)
        return error_response(exc.status, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        message = validation_message(exc.errors())
        log.info("%s %s 400 %s", request.method, request.url.path, message)
        return error_response(400, message)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail), dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("%s %s 500", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    return app


def validation_message(errors: Any, limit: int = 3) -> str:
    """Pydantic errors as one line: 'body.temperature: Input should be ...; ...'."""
    parts = []
    for err in list(errors)[:limit]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    more = len(errors) - limit
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


class CountRequests:
    """Pure ASGI middleware (keeps disconnect detection intact): counts answers by route and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = scope.get("path", "")
            self.metrics.requests.labels(
                endpoint=path if path in ROUTES else "other", status=str(status)
            ).inc()
