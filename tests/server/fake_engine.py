"""Test doubles for the `dflash.Engine` contract.

FakeEngine: a deterministic byte-level stand-in with a per-step sleep (so queueing and cancellation
are observable). ProbeEngine: wraps any engine (real or fake) to count steps, detect concurrent use,
slow streams down and inject failures, without changing what the engine returns.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any


class DflashError(Exception):
    pass


class ModelLoadError(DflashError):
    pass


class ContextOverflowError(DflashError):
    def __init__(self, n_prompt: int, n_ctx: int):
        super().__init__(f"prompt has {n_prompt} tokens, context is {n_ctx} (need n_prompt + 1 <= n_ctx)")
        self.n_prompt, self.n_ctx = n_prompt, n_ctx


class InvalidParameterError(DflashError):
    pass


BOS = 256
ALPHABET = b"abcdefghijklmnopqrstuvwxyz "
DRAFT_LEN = 4


class FakeEngine:
    """Bytes are tokens (+BOS). Greedy output is a pure function of the prompt; each step accepts
    1-3 tokens from a draft of DRAFT_LEN; `step_s` is slept per step."""

    def __init__(
        self,
        model_path: str | None = None,
        draft_path: str | None = None,
        n_ctx: int = 512,
        step_s: float = 0.0,
        **_: Any,
    ):
        self.model_path = model_path or "/models/fake-tiny.gguf"
        self.draft_path = draft_path
        self.n_ctx = n_ctx
        self.n_vocab = 257
        self.step_s = step_s
        self._stats = {
            "drafts": 0,
            "draft_tokens": 0,
            "accepted_tokens": 0,
            "accepted_per_pos": [0] * DRAFT_LEN,
        }

    # ---- tokenizer ----
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return ([BOS] if add_special else []) + list(text.encode())

    def detokenize(self, tokens: list[int]) -> str:
        return bytes(t for t in tokens if t < 256).decode(errors="replace")

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        text = "".join(f"<|{m['role']}|>{m.get('content') or ''}\n" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")

    def stats(self) -> dict[str, Any]:
        return {**self._stats, "accepted_per_pos": list(self._stats["accepted_per_pos"])}

    # ---- generation ----
    def create_completion(
        self, prompt: str | list[int], max_tokens: int | None = 16, stream: bool = False, **kw: Any
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        self._check(tokens, kw)
        gen = self._generate(tokens, max_tokens, "text_completion", **kw)
        return gen if stream else _collect_completion(gen)

    def create_chat_completion(
        self, messages: list[dict[str, Any]], max_tokens: int | None = None, stream: bool = False, **kw: Any
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        tokens = self.tokenize(self.apply_chat_template(messages))
        self._check(tokens, kw)
        gen = self._generate(tokens, max_tokens, "chat.completion.chunk", **kw)
        return gen if stream else _collect_chat(gen)

    def _check(self, tokens: list[int], kw: dict[str, Any]) -> None:
        if not tokens:
            raise InvalidParameterError("empty prompt")
        if len(tokens) + 1 > self.n_ctx:
            raise ContextOverflowError(len(tokens), self.n_ctx)
        if kw.get("temperature", 0.8) < 0 or not 0 < kw.get("top_p", 0.95) <= 1 or kw.get("top_k", 40) < 0:
            raise InvalidParameterError(f"bad sampling parameters: {kw}")

    def _generate(
        self,
        prompt: list[int],
        max_tokens: int | None,
        kind: str,
        temperature: float = 0.8,
        top_p: float = 0.95,
        top_k: int = 40,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[dict[str, Any]]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        hold = max((len(s) for s in stops), default=1) - 1
        limit = self.n_ctx - len(prompt) if max_tokens is None else min(max_tokens, self.n_ctx - len(prompt))
        rng = random.Random(seed if seed is not None else time.monotonic_ns())
        ctx, out, sent, finish = list(prompt), "", 0, "length"
        meta = {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "created": int(time.time()), "model": self.model_path}
        t0 = time.perf_counter()
        if kind == "chat.completion.chunk":
            yield {**meta, "object": kind, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
        n_out = 0
        while n_out < limit and not (cancel is not None and cancel.is_set()):
            if self.step_s:
                time.sleep(self.step_s)
            k = min(1 + (sum(ctx[-4:]) + len(ctx)) % 3, limit - n_out)  # tokens this step
            self._stats["drafts"] += 1
            self._stats["draft_tokens"] += DRAFT_LEN
            self._stats["accepted_tokens"] += k - 1
            for pos in range(k - 1):
                self._stats["accepted_per_pos"][pos] += 1
            for _ in range(k):
                if temperature == 0:
                    tok = ALPHABET[(sum(ctx[-3:]) * 31 + len(ctx) * 7) % len(ALPHABET)]
                else:
                    tok = ALPHABET[rng.randrange(len(ALPHABET))]
                ctx.append(tok)
                out += chr(tok)
            n_out += k
            hit = min((i for i in (out.find(s) for s in stops) if i >= 0), default=-1)
            if hit >= 0:
                out, finish = out[:hit], "stop"
                break
            if len(out) - hold > sent:
                yield _chunk(meta, kind, out[sent : len(out) - hold], None)
                sent = len(out) - hold
        if cancel is not None and cancel.is_set():
            finish = "stop"
        dt = max(time.perf_counter() - t0, 1e-9)
        last = _chunk(meta, kind, out[sent:], finish)
        last["usage"] = {
            "prompt_tokens": len(prompt),
            "completion_tokens": n_out,
            "total_tokens": len(prompt) + n_out,
        }
        last["timings"] = {
            "prompt_n": len(prompt),
            "prompt_ms": 0.1,
            "prompt_per_second": len(prompt) / 1e-4,
            "predicted_n": n_out,
            "predicted_ms": dt * 1e3,
            "predicted_per_second": n_out / dt,
            "draft_n": 0,
            "draft_n_accepted": 0,
            "accepted_per_pos": [],
        }
        yield last


def _chunk(meta: dict[str, Any], kind: str, text: str, finish: str | None) -> dict[str, Any]:
    if kind == "text_completion":
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}
    return {**meta, "object": kind, "choices": [choice]}


def _collect_completion(chunks: Iterator[dict[str, Any]]) -> dict[str, Any]:
    parts, last = [], {}
    for c in chunks:
        parts.append(c["choices"][0]["text"])
        last = c
    choice = {
        "text": "".join(parts),
        "index": 0,
        "logprobs": None,
        "finish_reason": last["choices"][0]["finish_reason"],
    }
    return {**last, "choices": [choice]}


def _collect_chat(chunks: Iterator[dict[str, Any]]) -> dict[str, Any]:
    parts, last = [], {}
    for c in chunks:
        parts.append(c["choices"][0]["delta"].get("content", ""))
        last = c
    message = {"role": "assistant", "content": "".join(parts)}
    choice = {"index": 0, "message": message, "finish_reason": last["choices"][0]["finish_reason"]}
    return {**last, "object": "chat.completion", "choices": [choice]}


class ProbeEngine:
    """Delegates to `inner`; counts streamed chunks, flags concurrent calls, can slow streams
    (`chunk_delay_s`) and make the next generation call raise (`fail_next`)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.chunk_delay_s = 0.0
        self.fail_next: BaseException | None = None
        self.chunks = 0  # chunks pulled from streaming generators
        self.generating = False  # a streaming generator is open
        self.concurrent_calls = 0  # calls that overlapped another one: must stay 0
        self._lock = threading.Lock()
        self._active = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _enter(self) -> None:
        with self._lock:
            self._active += 1
            if self._active > 1:
                self.concurrent_calls += 1

    def _exit(self) -> None:
        with self._lock:
            self._active -= 1

    def _call(self, name: str, *args: Any, **kw: Any) -> Any:
        self._enter()
        try:
            return getattr(self.inner, name)(*args, **kw)
        finally:
            self._exit()

    def tokenize(self, *a: Any, **kw: Any) -> list[int]:
        return self._call("tokenize", *a, **kw)

    def detokenize(self, *a: Any, **kw: Any) -> str:
        return self._call("detokenize", *a, **kw)

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def create_completion(self, *a: Any, **kw: Any) -> Any:
        return self._generation("create_completion", *a, **kw)

    def create_chat_completion(self, *a: Any, **kw: Any) -> Any:
        return self._generation("create_chat_completion", *a, **kw)

    def _generation(self, name: str, *a: Any, **kw: Any) -> Any:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        if not kw.get("stream"):
            return self._call(name, *a, **kw)
        return self._stream(name, a, kw)

    def _stream(self, name: str, a: tuple[Any, ...], kw: dict[str, Any]) -> Iterator[dict[str, Any]]:
        self._enter()
        self.generating = True
        try:
            gen = getattr(self.inner, name)(*a, **kw)
            try:
                for chunk in gen:
                    self.chunks += 1
                    yield chunk
                    if self.chunk_delay_s:
                        time.sleep(self.chunk_delay_s)
            finally:
                gen.close()
        finally:
            self.generating = False
            self._exit()
