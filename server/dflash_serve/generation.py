"""Run one generation job for an HTTP request: wait for the engine, watch for the client hanging up,
answer a dict or an SSE stream, then record metrics and the request's log line."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .engine_worker import EngineWorker, Job, JobFn
from .errors import ApiError, engine_error, error_body
from .metrics import Metrics

log = logging.getLogger("dflash_serve")

CLIENT_GONE = 499  # nginx's code for "client closed request": only in metrics and logs
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    pass


async def _until_disconnect(request: Request) -> None:
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # noqa: BLE001 - a broken connection counts as gone
        return


async def _next(job: Job, disconnect: asyncio.Future[None]) -> tuple[str, Any]:
    """The job's next result, or ClientGone (and the job cancelled) if the client hangs up first."""
    get: asyncio.Future[tuple[str, Any]] = asyncio.ensure_future(job.get())
    waiting: set[asyncio.Future[Any]] = {get, disconnect}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled (server shutdown): stop the engine too
        get.cancel()
        job.cancel.set()
        raise
    if get.done():
        return get.result()
    get.cancel()
    job.cancel.set()
    raise ClientGone


class Generation:
    """One request's generation: `endpoint` names it in logs and metrics; `shape` post-processes
    each dict or chunk (model id)."""

    def __init__(
        self,
        worker: EngineWorker,
        metrics: Metrics,
        request: Request,
        endpoint: str,
        shape: Callable[[dict[str, Any]], dict[str, Any]],
    ):
        self.worker, self.metrics, self.request = worker, metrics, request
        self.endpoint, self.shape = endpoint, shape
        self.t0 = time.monotonic()

    async def complete(self, fn: JobFn) -> Response:
        job = self.worker.submit(fn, generation=True)
        disconnect = asyncio.ensure_future(_until_disconnect(self.request))
        try:
            kind, value = await _next(job, disconnect)
            if kind == "item":  # then the terminal 'end' or 'error' of a dict-returning job
                await _next(job, disconnect)
            elif kind == "error":
                raise engine_error(value)
            else:
                raise ApiError(500, "engine returned no result")
        except ClientGone:
            self.finish(job, CLIENT_GONE, None)
            return Response(status_code=CLIENT_GONE)
        finally:
            disconnect.cancel()
        result = self.shape(value)
        self.finish(job, 200, result)
        return JSONResponse(result)

    async def stream(self, fn: JobFn, include_usage: bool) -> Response:
        job = self.worker.submit(fn, generation=True)
        disconnect = asyncio.ensure_future(_until_disconnect(self.request))
        try:  # errors before the first chunk (bad parameters, context overflow) get a plain status
            kind, first = await _next(job, disconnect)
        except ClientGone:
            self.finish(job, CLIENT_GONE, None)
            return Response(status_code=CLIENT_GONE)
        finally:
            disconnect.cancel()  # from here StreamingResponse watches for the disconnect itself
        if kind == "error":
            raise engine_error(first)
        if kind != "item":
            raise ApiError(500, "engine returned no result")
        return StreamingResponse(
            self._sse(job, first, include_usage), media_type="text/event-stream", headers=SSE_HEADERS
        )

    async def _sse(self, job: Job, first: dict[str, Any], include_usage: bool) -> AsyncIterator[str]:
        status, last, done = CLIENT_GONE, None, False
        try:
            pending: list[tuple[str, Any]] = [("item", first)]
            while not done:
                out: list[str] = []  # everything available now goes out in one write
                for kind, value in pending + job.drain():
                    if kind == "item":
                        chunk = self.shape(value)
                        if chunk.get("usage") is not None:
                            last = chunk
                        out.extend(_sse_lines(chunk, include_usage))
                    elif kind == "error":
                        err = engine_error(value)
                        status, done = err.status, True
                        out.append(_sse_line(error_body(err.status, err.message)))
                    else:
                        status, done = 200, True
                if done:
                    out.append("data: [DONE]\n\n")
                yield "".join(out)
                if not done:
                    pending = [await job.get()]
        finally:
            job.cancel.set()  # no-op when finished; stops the engine when the client hung up
            self.finish(job, status, last)

    def finish(self, job: Job, status: int, result: dict[str, Any] | None) -> None:
        """Generation metrics and the one log line of this request (requests are counted by the app)."""
        usage = (result or {}).get("usage") or {}
        timings = (result or {}).get("timings") or {}
        al = job.acceptance_length
        if result is not None:
            self.metrics.observe_generation(usage, timings, al)
        finish = ((result or {}).get("choices") or [{}])[0].get("finish_reason")
        wait = (job.started or time.monotonic()) - job.enqueued
        log.info(
            "%s %d prompt=%s completion=%s prompt_t/s=%.1f t/s=%.1f al=%s finish=%s wait=%.3fs total=%.3fs",
            self.endpoint,
            status,
            usage.get("prompt_tokens", "-"),
            usage.get("completion_tokens", "-"),
            float(timings.get("prompt_per_second") or 0.0),
            float(timings.get("predicted_per_second") or 0.0),
            f"{al:.2f}" if al is not None else "-",
            finish or ("cancelled" if status == CLIENT_GONE else "-"),
            wait,
            time.monotonic() - self.t0,
        )


def _sse_lines(chunk: dict[str, Any], include_usage: bool) -> list[str]:
    if include_usage and chunk.get("usage") is not None:  # OpenAI: usage in an extra chunk without choices
        content = {k: v for k, v in chunk.items() if k not in ("usage", "timings")}
        return [_sse_line(content), _sse_line({**chunk, "choices": []})]
    return [_sse_line(chunk)]


def _sse_line(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
