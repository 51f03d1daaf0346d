"""The modes of `dflash bench --pair`: each runs every prompt greedily for the same number of tokens
and returns one sample per prompt (REFERENCE.md section 8 quantities).

- ours: our engine through `DecodeSession` (what `dflash.Engine` runs): autoregressive, chain
  DFlash (`max_draft`), or DDTree (`budget`).
- upstream AR: libllama from the vendor tree in this process (`_core.UpstreamModel`).
- upstream spec: upstream's `llama-speculative-simple` with the DFlash drafter, through
  `dflash.upstream_tools`.

Decode t/s = (generated - 1) / (first generated token -> last); each prompt runs `repeats` times
(median) after one warm-up run of the first prompt.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Prompt:
    kind: str  # "code" | "prose"
    text: str
    tokens: list[int]
    source: str


@dataclass(frozen=True)
class RunConfig:
    n_predict: int
    repeats: int
    n_ctx: int
    n_batch: int
    n_gpu_layers: int
    threads: int
    kv_type: str
    batch_invariant: bool = False  # verifies computed as decode steps are (ggml_ext/BATCH_INVARIANCE.md)


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def _repeat(
    prompts: Sequence[Prompt],
    cfg: RunConfig,
    once: Callable[[Prompt], dict[str, Any]],
    samples: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Warm-up on the first prompt, then `repeats` runs of each prompt, appended to `samples` as they
    finish; timings become lists with their median alongside, the rest comes from the first run."""
    once(prompts[0])
    samples = [] if samples is None else samples
    for i, p in enumerate(prompts):
        runs = [once(p) for _ in range(cfg.repeats)]
        s: dict[str, Any] = {"prompt": i, "kind": p.kind, "source": p.source, "n_prompt": len(p.tokens)}
        s.update(runs[0])
        for key in ("decode_tps", "prefill_tps", "ttft_ms"):
            s[key] = [r[key] for r in runs]
            s[key + "_median"] = _median(s[key])
        samples.append(s)
    return samples


def _engine_config(cfg: RunConfig, n_verify_max: int) -> Any:
    from dflash import _core

    ec = _core.EngineConfig()
    ec.n_ctx, ec.k_type, ec.v_type = cfg.n_ctx, cfg.kv_type, cfg.kv_type
    ec.n_gpu_layers, ec.n_threads, ec.n_batch = cfg.n_gpu_layers, cfg.threads, cfg.n_batch
    ec.n_verify_max = n_verify_max
    ec.batch_invariant = cfg.batch_invariant
    return ec


def run_ours(
    target: str,
    draft: str | None,
    prompts: Sequence[Prompt],
    cfg: RunConfig,
    max_draft: int,
    budget: int,
    chain_seed: bool = True,
    tree_temperature: float = 1.0,
) -> dict[str, Any]:
    """Our engine; `draft` None = autoregressive, else chain DFlash (budget 0) or DDTree (its tree
    seeded with the drafter's top-1 chain or not)."""
    from dflash import _core

    eng = _core.TargetEngine(target, _engine_config(cfg, max(max_draft, budget) + 1))
    dcfg = _core.DraftEngineConfig()
    dcfg.tree_temperature = tree_temperature
    dr = _core.DraftEngine(draft, eng, dcfg) if draft else None

    def once(p: Prompt) -> dict[str, Any]:
        s = _core.DecodeSession(
            eng, dr, p.tokens, cfg.n_predict, 0.0, 0, 1.0, 0, [], max_draft, budget, chain_seed
        )
        out: list[int] = []
        while not s.done:
            out.extend(s.step())
        st, spec = s.stats, s.spec
        # decode forwards: the target forwards after the prefill's n_batch chunks
        fwd = spec["target_forwards"] - math.ceil(len(p.tokens) / cfg.n_batch)
        r: dict[str, Any] = {
            "tokens": out,
            "n_generated": st.n_generated,
            "decode_tps": (st.n_generated - 1) / (st.predict_ms / 1000) if st.predict_ms > 0 else 0.0,
            "prefill_tps": len(p.tokens) / (st.prompt_ms / 1000) if st.prompt_ms > 0 else 0.0,
            "ttft_ms": st.prompt_ms,
            "target_forwards": fwd,
            "tokens_per_forward": (st.n_generated - 1) / fwd if fwd > 0 else 0.0,
        }
        if dr is not None:
            drafts = spec["drafts"]
            r.update(
                acceptance_length=spec["acceptance_length"],
                drafts=drafts,
                draft_tokens=spec["draft_tokens"],
                accepted=spec["accepted"],
                accepted_per_pos=list(spec["accepted_per_pos"]),
                per_depth_acceptance=[c / drafts if drafts else 0.0 for c in spec["accepted_per_pos"]],
            )
            r.update({k: spec[k] for k in ("draft_ms", "tree_ms", "verify_ms", "commit_ms") if k in spec})
        return r

    samples = _repeat(prompts, cfg, once)
    # the last graphs' scheduler splits and nodes (> 1 split on a GPU: an op ran on the CPU)
    shapes = {"target": eng.graph_shapes, "draft": dr.graph_shape if dr is not None else None}
    return {"backend": eng.backend, "graph_shapes": shapes, "samples": samples}


def run_upstream_ar(target: str, prompts: Sequence[Prompt], cfg: RunConfig) -> dict[str, Any]:
    from dflash import _core

    uc = _core.UpstreamConfig()
    uc.n_ctx, uc.k_type, uc.v_type = cfg.n_ctx, cfg.kv_type, cfg.kv_type
    uc.n_gpu_layers, uc.n_threads, uc.n_batch = cfg.n_gpu_layers, cfg.threads, cfg.n_batch
    up = _core.UpstreamModel(target, uc)

    def once(p: Prompt) -> dict[str, Any]:
        out, t = up.greedy(p.tokens, cfg.n_predict)
        dec = sum(t["decode_ms"])
        return {
            "tokens": list(out),
            "n_generated": len(out),
            "decode_tps": len(t["decode_ms"]) / (dec / 1000) if dec > 0 else 0.0,
            "prefill_tps": len(p.tokens) / (t["prefill_ms"] / 1000) if t["prefill_ms"] > 0 else 0.0,
            "ttft_ms": t["prefill_ms"],
            "target_forwards": len(t["decode_ms"]),
            "tokens_per_forward": 1.0,
        }

    return {"samples": _repeat(prompts, cfg, once)}


def run_upstream_spec(
    target: str, draft: str, prompts: Sequence[Prompt], cfg: RunConfig, max_draft: int, binary: str | None
) -> dict[str, Any]:
    """llama-speculative-simple per prompt (text prompts: it tokenizes them itself). A failure ends
    the mode with an "error" entry and the samples done so far."""
    samples: list[dict[str, Any]] = []
    try:
        from dflash import upstream_tools

        binary = binary or str(upstream_tools.upstream_binary("llama-speculative-simple"))
        ngl = cfg.n_gpu_layers if cfg.n_gpu_layers >= 0 else 999

        def once(p: Prompt) -> dict[str, Any]:
            r = upstream_tools.run_speculative_simple(
                binary, target, draft, p.text, cfg.n_predict, ngl=ngl, draft_max=max_draft
            )
            n_drafted = int(r.get("n_drafted", 0))
            return {
                "decode_tps": float(r["decode_tps"]),
                "prefill_tps": float(r.get("prefill_tps", 0.0)),
                "ttft_ms": float(r.get("ttft_ms", 0.0)),
                "acceptance_length": float(r["acceptance_length"]),
                "n_drafted": n_drafted,
                "n_accept": int(r.get("n_accept", 0)),
                "draft_acceptance_rate": int(r.get("n_accept", 0)) / n_drafted if n_drafted else 0.0,
                "upstream": {k: v for k, v in r.items() if isinstance(v, int | float | str)},
            }

        _repeat(prompts, cfg, once, samples)
    except Exception as e:  # noqa: BLE001 - recorded in the JSON; the other modes stand
        return {"binary": binary, "samples": samples, "error": f"{type(e).__name__}: {e}"}
    return {"binary": binary, "samples": samples}
