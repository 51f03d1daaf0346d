"""The Python API: an Engine in the style of llama-cpp-python's `Llama`, and `generate`.

Results are OpenAI-shaped dicts ("text_completion", "chat.completion" and their stream
chunks) with a `usage` block and a `timings` block like llama.cpp's server.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from dflash import _core
from dflash.chat import ChatTemplate
from dflash.errors import InvalidParameterError, context_overflow
from dflash.textstream import TextStream

Message = dict[str, Any]


def _stop_list(stop: str | Sequence[str] | None) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    return [s for s in stop if isinstance(s, str)]


class Engine:
    """One loaded target model and, optionally, its drafter. Not thread-safe: one call at a time.

    With no `model_path`, the embedded default model loads, and with it the packaged drafter
    (chain DFlash; `budget=N` for DDTree) unless `draft_path` is given or `default_draft=False`.
    An explicit `model_path` never gets the packaged drafter: pass `draft_path` for speculation.
    `batch_invariant=True` makes greedy speculative output equal autoregressive output bit for bit
    on the GPU too (ggml_ext/BATCH_INVARIANCE.md); on the CPU it always does.
    """

    def __init__(
        self,
        model_path: str | None = None,
        draft_path: str | None = None,
        n_ctx: int = 4096,
        kv_type: str = "f16",
        n_gpu_layers: int = -1,
        n_batch: int = 512,
        n_threads: int = 0,
        seed: int = 0,
        verbose: bool = False,
        kv_type_k: str | None = None,
        kv_type_v: str | None = None,
        progress: bool = False,
        default_draft: bool = True,
        batch_invariant: bool = False,
        **spec_options: Any,
    ) -> None:
        from dflash.models import default_draft_path, default_model_path

        _core.set_log_verbosity(verbose)
        if model_path is None:
            model_path = str(default_model_path())
            packaged = default_draft_path() if draft_path is None and default_draft else None
            draft_path = str(packaged) if packaged is not None else draft_path
        self.model_path = str(model_path)
        self.draft_path = str(draft_path) if draft_path is not None else None
        self.spec_options = dict(spec_options)
        unknown = set(spec_options) - {
            "max_draft",
            "draft_kv_type",
            "all_bidirectional",
            "budget",
            "chain_seed",
            "draft_top_k",
            "tree_temperature",
        }
        if unknown:
            raise InvalidParameterError(f"unknown speculative option(s): {', '.join(sorted(unknown))}")
        # budget > 0: DDTree with that many draft nodes per step; else chain DFlash.
        self.budget = int(spec_options.get("budget") or 0)
        if not 0 <= self.budget <= 1023:
            raise InvalidParameterError(f"budget must be in [0, 1023], got {self.budget}")
        self.chain_seed = bool(spec_options.get("chain_seed", True))
        self.max_draft = int(spec_options.get("max_draft", 15))
        if not 0 <= self.max_draft <= 63:
            raise InvalidParameterError(f"max_draft must be in [0, 63], got {self.max_draft}")
        cfg = _core.EngineConfig()
        cfg.n_verify_max = max(self.max_draft, self.budget) + 1
        cfg.n_ctx = int(n_ctx)
        cfg.k_type = kv_type_k or kv_type
        cfg.v_type = kv_type_v or kv_type
        cfg.n_gpu_layers = int(n_gpu_layers)
        cfg.n_threads = int(n_threads)
        cfg.n_batch = int(n_batch)
        # Every verified token computed as a decode step computes it: greedy speculative output
        # equals autoregressive output bit for bit on the GPU too (slower; f16/bf16/f32 KV only).
        cfg.batch_invariant = bool(batch_invariant)
        # The engine goes first: its own checks validate the file before libllama's vocabulary
        # loader (which asserts on some malformed files) ever sees it.
        self._target = _core.TargetEngine(self.model_path, cfg, _progress_bar() if progress else None)
        self._vocab = _core.Vocab(self.model_path)
        self._eog = self._vocab.eog_tokens()
        self._chat = ChatTemplate(self._vocab.chat_template, self._vocab)
        self.n_ctx = cfg.n_ctx
        self.n_vocab = int(self._target.hparams["n_vocab"])
        self.seed = seed
        self._stats: dict[str, Any] = {
            "drafts": 0,
            "draft_tokens": 0,
            "accepted_tokens": 0,
            "accepted_per_pos": [],
        }
        self._draft: Any = None
        if draft_path is not None:
            from dflash.drafter import resolve_drafter

            dcfg = _core.DraftEngineConfig()
            dcfg.kv_type = str(spec_options.get("draft_kv_type", "f16"))
            dcfg.all_bidirectional = bool(spec_options.get("all_bidirectional", False))
            dcfg.top_k = int(spec_options.get("draft_top_k", 8))
            dcfg.tree_temperature = float(spec_options.get("tree_temperature", 1.0))
            gguf_path = resolve_drafter(str(draft_path), self.model_path)
            self._draft = _core.DraftEngine(str(gguf_path), self._target, dcfg)

    @property
    def speculative(self) -> bool:
        """True when a drafter is loaded (chain DFlash decoding)."""
        return self._draft is not None

    # ---- tokens --------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return list(self._vocab.tokenize(text, add_special, parse_special))

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._vocab.detokenize(list(tokens)).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[Message], add_generation_prompt: bool = True) -> str:
        return self._chat.render(messages, add_generation_prompt=add_generation_prompt)

    @property
    def backend(self) -> str:
        return str(self._target.backend)

    @property
    def hparams(self) -> dict[str, Any]:
        return dict(self._target.hparams)

    @property
    def memory_plan(self) -> dict[str, int]:
        return dict(self._target.memory_plan)

    def _add_stats(self, spec: dict[str, Any]) -> None:
        st = self._stats
        st["drafts"] += spec["drafts"]
        st["draft_tokens"] += spec["draft_tokens"]
        st["accepted_tokens"] += spec["accepted"]
        per = st["accepted_per_pos"]
        for i, v in enumerate(spec["accepted_per_pos"]):
            if i == len(per):
                per.append(0)
            per[i] += v

    def stats(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self._stats.items()}

    # ---- low level -----------------------------------------------------------------
    def eval_logits(self, tokens: Sequence[int]) -> Any:
        """Every token's logits (numpy array n x n_vocab) from an empty context."""
        return self._target.eval_logits(list(tokens))

    # ---- completions ---------------------------------------------------------------
    def create_completion(
        self,
        prompt: str | list[int],
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        top_k: int = 40,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        stream: bool = False,
        cancel: threading.Event | None = None,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        tokens = self._prompt_tokens(prompt)
        run = _Run(self, tokens, max_tokens, temperature, top_p, top_k, seed, _stop_list(stop), cancel)
        if stream:
            return run.stream_chunks("text_completion")
        return run.complete("text_completion")

    def create_chat_completion(
        self,
        messages: list[Message],
        max_tokens: int | None = None,
        temperature: float = 0.8,
        top_p: float = 0.95,
        top_k: int = 40,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        stream: bool = False,
        cancel: threading.Event | None = None,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        text = self.apply_chat_template(messages, add_generation_prompt=True)
        tokens = self._vocab.tokenize(text, False, True)
        run = _Run(self, list(tokens), max_tokens, temperature, top_p, top_k, seed, _stop_list(stop), cancel)
        if stream:
            return run.stream_chunks("chat.completion.chunk")
        return run.complete("chat.completion")

    def _prompt_tokens(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return list(self._vocab.tokenize(prompt, True, True))
        toks = [int(t) for t in prompt]
        bad = [t for t in toks if t < 0 or t >= self.n_vocab]
        if bad:
            raise InvalidParameterError(f"token id {bad[0]} is outside the vocabulary ({self.n_vocab})")
        return toks


class _Run:
    """One generation request: validation, the native loop, text assembly and the result dicts."""

    def __init__(
        self,
        eng: Engine,
        tokens: list[int],
        max_tokens: int | None,
        temperature: float,
        top_p: float,
        top_k: int,
        seed: int | None,
        stop: list[str],
        cancel: threading.Event | None,
    ) -> None:
        if not tokens:
            raise InvalidParameterError("the prompt is empty")
        if max_tokens is not None and max_tokens < 0:
            raise InvalidParameterError(f"max_tokens must be >= 0, got {max_tokens}")
        if len(tokens) + 1 > eng.n_ctx:
            raise context_overflow(len(tokens) + 1, eng.n_ctx)
        self.eng = eng
        self.tokens = tokens
        self.max_tokens = eng.n_ctx - len(tokens) if max_tokens is None else max_tokens
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k)
        self.seed = eng.seed if seed is None else int(seed)
        self.stop = stop
        self.cancel = cancel
        self.id = f"cmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.text = TextStream(lambda t: eng._vocab.token_to_piece(t, False), stop)
        self.n_out = 0
        self.stats: Any = None
        self.spec: dict[str, Any] | None = None  # chain statistics of this request
        # Created now so that bad parameters raise here, before any chunk is streamed.
        self.session = _core.DecodeSession(
            eng._target,
            eng._draft,
            tokens,
            self.max_tokens,
            self.temperature,
            self.top_k,
            self.top_p,
            self.seed,
            eng._eog,
            eng.max_draft,
            eng.budget,
            eng.chain_seed,
        )
        self.finish_reason = "length"

    def _deltas(self) -> Iterator[str]:
        """Text pieces as the engine produces them. The caller's thread pulls one engine step at
        a time (the GIL is released inside), so stopping - a stop string, `cancel`, or simply
        not asking for more - takes effect after the current step, with no thread to join."""
        eng = self.eng
        session = self.session
        eog = set(eng._eog)
        try:
            while not session.done:
                if self.cancel is not None and self.cancel.is_set():
                    self.finish_reason = "stop"
                    break
                for tok in session.step():
                    if tok in eog:
                        continue
                    delta = self.text.push(tok)
                    if delta:
                        yield delta
                    if self.text.stopped:
                        break
                if self.text.stopped:
                    break
        finally:
            # Runs also when the consumer stops early (GeneratorExit): the statistics stay valid.
            self.stats = session.stats
            if eng._draft is not None:
                self.spec = session.spec
                eng._add_stats(self.spec)
        if self.stats.stop_reason == "eog" or self.text.stopped:
            self.finish_reason = "stop"
        if not self.text.stopped:
            rest = self.text.flush()
            if rest:
                yield rest

    def _usage(self) -> dict[str, int]:
        n = self.stats.n_generated if self.stats else 0
        return {
            "prompt_tokens": len(self.tokens),
            "completion_tokens": n,
            "total_tokens": len(self.tokens) + n,
        }

    def _timings(self) -> dict[str, Any]:
        st = self.stats
        pn, pms = len(self.tokens), st.prompt_ms if st else 0.0
        gn, gms = (st.n_generated if st else 0), (st.predict_ms if st else 0.0)
        return {
            "prompt_n": pn,
            "prompt_ms": pms,
            "prompt_per_second": pn / (pms / 1000) if pms > 0 else 0.0,
            "predicted_n": gn,
            "predicted_ms": gms,
            # decode rate over the tokens after the first (REFERENCE.md section 8)
            "predicted_per_second": (gn - 1) / (gms / 1000) if gms > 0 and gn > 1 else 0.0,
            "draft_n": self.spec["draft_tokens"] if self.spec else 0,
            "draft_n_accepted": self.spec["accepted"] if self.spec else 0,
            "accepted_per_pos": list(self.spec["accepted_per_pos"]) if self.spec else [],
            "acceptance_length": self.spec["acceptance_length"] if self.spec else 0.0,
        }

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.eng.model_path}

    def complete(self, obj: str) -> dict[str, Any]:
        text = "".join(self._deltas())
        if obj == "chat.completion":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": self.finish_reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason}
        return {**self._head(obj), "choices": [choice], "usage": self._usage(), "timings": self._timings()}

    def stream_chunks(self, obj: str) -> Iterator[dict[str, Any]]:
        chat = obj == "chat.completion.chunk"

        def chunk(delta: dict[str, Any] | str, finish: str | None) -> dict[str, Any]:
            if chat:
                c: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                c = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}
            return {**self._head(obj), "choices": [c]}

        def gen() -> Iterator[dict[str, Any]]:
            if chat:
                yield chunk({"role": "assistant", "content": ""}, None)
            for piece in self._deltas():
                yield chunk({"content": piece} if chat else piece, None)
            last = chunk({} if chat else "", self.finish_reason)
            last["usage"] = self._usage()
            last["timings"] = self._timings()
            yield last

        return gen()


def _progress_bar() -> Any:
    from tqdm import tqdm

    bar: dict[str, Any] = {}

    def cb(done: int, total: int) -> None:
        if "b" not in bar:
            # disable=None: no bar when stderr is not a terminal (logs, CI)
            bar["b"] = tqdm(
                total=total, unit="B", unit_scale=True, desc="loading weights", mininterval=0.5, disable=None
            )
        bar["b"].update(done - bar["b"].n)
        if done >= total:
            bar["b"].close()

    return cb


_default_engine: Engine | None = None
_default_lock = threading.Lock()


def generate(
    prompt: str | list[Message],
    *,
    model: str | None = None,
    max_tokens: int | None = 64,
    temperature: float = 0.0,
    top_p: float = 0.95,
    top_k: int = 40,
    seed: int | None = None,
    stop: str | Sequence[str] | None = None,
    stream: bool = False,
    **engine_options: Any,
) -> str | Iterator[str]:
    """Generate text for a prompt (or chat messages). Greedy by default; the engine for the
    model is loaded once and reused. With stream=True, yields text pieces as they come."""
    global _default_engine
    with _default_lock:
        path = model
        if (
            _default_engine is None
            or (path is not None and _default_engine.model_path != str(path))
            or engine_options
        ):
            _default_engine = Engine(model_path=path, **engine_options)
        eng = _default_engine
    kw: dict[str, Any] = dict(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=stop
    )
    if isinstance(prompt, list):
        res = eng.create_chat_completion(prompt, stream=stream, **kw)
        if stream:
            return (c["choices"][0]["delta"].get("content", "") for c in res)  # type: ignore[union-attr]
        return res["choices"][0]["message"]["content"]  # type: ignore[index]
    res = eng.create_completion(prompt, stream=stream, **kw)
    if stream:
        return (c["choices"][0]["text"] for c in res)  # type: ignore[union-attr]
    return res["choices"][0]["text"]  # type: ignore[index]
