"""The single engine, owned by one worker thread: loads it, then runs queued jobs one at a time (FIFO).

A job is a function of (engine, cancel event) returning a dict or an iterator of chunks. Its results
go back to the asyncio side through an asyncio.Queue. A running job is never interrupted by a new
one; setting a job's cancel event stops it after the current step (or drops it while it waits).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError
from .metrics import Metrics, acceptance_length, stats_delta

log = logging.getLogger("dflash_serve")

JobFn = Callable[[Any, threading.Event], Any]


class State(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class EngineInfo:
    model_path: str
    n_ctx: int
    n_vocab: int
    draft_path: str | None = None


@dataclass(eq=False)
class Job:
    fn: JobFn
    loop: asyncio.AbstractEventLoop
    generation: bool
    cancel: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.monotonic)
    started: float | None = None
    spec_delta: dict[str, Any] | None = None  # Engine.stats() difference over this job
    # results, worker thread -> event loop; one loop wake-up per burst, not per token
    _items: deque[tuple[str, Any]] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wake_pending: bool = False
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def acceptance_length(self) -> float | None:
        return acceptance_length(self.spec_delta) if self.spec_delta else None

    def put(self, kind: str, value: Any = None) -> None:
        """From the worker thread: 'item's, then one terminal 'end' or 'error'."""
        with self._lock:
            self._items.append((kind, value))
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            self.loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # event loop closed: nobody is listening any more
            self.cancel.set()

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        self._ready.set()

    async def get(self) -> tuple[str, Any]:
        """The next result (event loop side)."""
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                self._ready.clear()
            await self._ready.wait()

    def drain(self) -> list[tuple[str, Any]]:
        """All results available now, without waiting."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items


class EngineWorker:
    def __init__(
        self,
        factory: Callable[[], Any],
        queue_size: int,
        metrics: Metrics | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ):
        self.factory = factory
        self.queue_size = queue_size
        self.metrics = metrics
        self.on_fatal = on_fatal
        self.state = State.LOADING
        self.load_error: str | None = None
        self.info: EngineInfo | None = None
        self._engine: Any = None
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._stopping = False
        self._mean_job_s = 1.0
        self._settled = threading.Event()  # loading finished, either way
        self._thread = threading.Thread(target=self._main, name="dflash-engine", daemon=True)

    # ---- lifecycle ----
    def start(self) -> None:
        self._thread.start()

    def begin_shutdown(self) -> None:
        """Graceful stop: waiting requests get 503 now, the running one may finish, nothing new starts."""
        with self._cv:
            self._stopping = True
            for job in self._waiting:
                job.put("error", ApiError(503, "Server shutting down"))
            self._waiting.clear()
            self._gauges()
            self._cv.notify_all()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stopping = True
            if self._running is not None:
                self._running.cancel.set()
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._settled.wait(timeout)
        return self.state is State.READY

    @property
    def busy(self) -> bool:
        return self._running is not None

    @property
    def n_waiting(self) -> int:
        with self._cv:
            return sum(not j.cancel.is_set() for j in self._waiting)

    # ---- asyncio side ----
    def submit(self, fn: JobFn, generation: bool = False) -> Job:
        """Queue a job; ApiError 503 while not ready, 429 (with Retry-After) when the queue is full."""
        self.check_ready()
        job = Job(fn=fn, loop=asyncio.get_running_loop(), generation=generation)
        with self._cv:
            if self._stopping:
                raise ApiError(503, "Server shutting down")
            self._waiting = deque(j for j in self._waiting if not j.cancel.is_set())
            if len(self._waiting) + (self._running is not None) > self.queue_size:
                retry = self.retry_after()
                raise ApiError(
                    429,
                    f"Server busy: {len(self._waiting)} requests waiting (queue size {self.queue_size}); "
                    f"retry after {retry} s",
                    headers={"Retry-After": str(retry)},
                )
            self._waiting.append(job)
            self._gauges()
            self._cv.notify()
        return job

    def check_ready(self) -> EngineInfo:
        """The engine's facts, or ApiError 503 while loading (with Retry-After) or after a failure."""
        if self.state is State.LOADING:
            raise ApiError(503, "Loading model", headers={"Retry-After": "5"})
        if self.state is not State.READY or self.info is None:
            raise ApiError(503, f"Model not available: {self.load_error or self.state.value}")
        return self.info

    def retry_after(self) -> int:
        """Seconds until a queue slot is likely free: mean job time x jobs ahead, 1..60."""
        return max(1, min(60, math.ceil(self._mean_job_s * (len(self._waiting) + 1))))

    # ---- worker thread ----
    def _main(self) -> None:
        if not self._load():
            return
        while (job := self._next_job()) is not None:
            self._run(job)
            with self._cv:
                self._running = None
                self._gauges()
        self.state = State.STOPPED

    def _load(self) -> bool:
        t0 = time.monotonic()
        ticker = threading.Thread(target=self._loading_ticker, args=(t0,), daemon=True)
        ticker.start()
        try:
            eng = self.factory()
            draft = getattr(eng, "draft_path", None)
            self.info = EngineInfo(
                str(eng.model_path), int(eng.n_ctx), int(eng.n_vocab), str(draft) if draft else None
            )
        except BaseException as exc:  # noqa: BLE001 - report any load failure, then give up
            self.load_error = f"{type(exc).__name__}: {exc}"
            self.state = State.FAILED
            log.error("model load failed: %s", self.load_error)
            self._settled.set()
            if self.on_fatal is not None:
                self.on_fatal(exc)
            return False
        self._engine = eng
        self.state = State.READY
        self._settled.set()
        log.info(
            "model ready in %.1f s: %s (n_ctx=%d, n_vocab=%d, drafter %s)",
            time.monotonic() - t0,
            self.info.model_path,
            self.info.n_ctx,
            self.info.n_vocab,
            self.info.draft_path or "none",
        )
        return True

    def _loading_ticker(self, t0: float) -> None:
        while not self._settled.wait(10.0):
            log.info("still loading the model (%.0f s)", time.monotonic() - t0)

    def _next_job(self) -> Job | None:
        with self._cv:
            while not self._stopping:
                while self._waiting:
                    job = self._waiting.popleft()
                    if job.cancel.is_set():
                        job.put("end")
                        continue
                    self._running = job
                    self._gauges()
                    return job
                self._cv.wait()
            for job in self._waiting:  # shutting down: answer whoever still waits
                job.put("error", ApiError(503, "Server shutting down"))
            self._waiting.clear()
            return None

    def _run(self, job: Job) -> None:
        eng = self._engine
        job.started = time.monotonic()
        if self.metrics is not None:
            self.metrics.queue_wait.observe(job.started - job.enqueued)
        before = self._stats(eng) if job.generation else None
        try:
            result = job.fn(eng, job.cancel)
            if isinstance(result, Iterator):
                self._drain(job, result)
            else:
                job.put("item", result)
            terminal: tuple[str, Any] = ("end", None)
        except Exception as exc:  # noqa: BLE001 - any engine failure goes back to its request
            if not _is_client_error(exc):
                log.exception("engine failure")
            terminal = ("error", exc)
        if before is not None:
            after = self._stats(eng)
            if after is not None:
                job.spec_delta = stats_delta(before, after)
                if self.metrics is not None:
                    self.metrics.add_spec_stats(job.spec_delta)
        elapsed = time.monotonic() - job.started
        if job.generation:
            self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * elapsed
        job.put(*terminal)

    @staticmethod
    def _drain(job: Job, chunks: Iterator[Any]) -> None:
        try:
            while not job.cancel.is_set():
                try:
                    chunk = next(chunks)
                except StopIteration:
                    break
                job.put("item", chunk)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    @staticmethod
    def _stats(eng: Any) -> dict[str, Any] | None:
        try:
            return dict(eng.stats())
        except Exception:  # noqa: BLE001 - statistics are optional
            log.debug("engine.stats() failed", exc_info=True)
            return None

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.waiting.set(len(self._waiting))
            self.metrics.running.set(self._running is not None)


def _is_client_error(exc: BaseException) -> bool:
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"ContextOverflowError", "InvalidParameterError", "ApiError"})
