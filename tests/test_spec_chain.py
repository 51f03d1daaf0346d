"""Chain DFlash speculative decoding is lossless: greedy output equals autoregressive output
token for token, and sampled output follows the same distribution.

Random-weight drafters almost never agree with a random-weight target, so besides the real
drafter the tests rewrite the drafts (a test-only hook) from the autoregressive reference with
random corruptions: every accept/reject path of the loop runs, including full acceptance.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gpu_policy import ON_GPU, SameTokens
from spec_helpers import corrupted_reference

from dflash import _core

TEST_NGL = int(os.environ.get("DFLASH_TEST_NGL", "0"))  # 99 on the GPU machine


N_PROMPTS, N_GEN = 20, 128


@pytest.fixture(scope="module")
def pair(drafter_pair: Any) -> tuple[Path, Path]:
    return drafter_pair(seed=1, layer_types=("sliding_attention", "full_attention"), sliding_window=8)


def _engines(pair: tuple[Path, Path], n_batch: int = 512) -> tuple[_core.TargetEngine, _core.DraftEngine]:
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_gpu_layers, cfg.n_threads, cfg.n_verify_max = 512, TEST_NGL, 2, 16
    cfg.n_batch = n_batch
    target = _core.TargetEngine(str(pair[0]), cfg)
    dcfg = _core.DraftEngineConfig()
    dcfg.kv_type = "f32"
    return target, _core.DraftEngine(str(pair[1]), target, dcfg)


def _ar(target: _core.TargetEngine, prompt: list[int], n: int, temp: float = 0.0, seed: int = 0) -> list[int]:
    out: list[int] = []
    target.generate(prompt, n, temp, 0, 1.0, seed, [], lambda t: out.append(t) or True)
    return out


def _chain(
    target: Any, draft: Any, prompt: list[int], n: int, rewrite: Any = None, temp: float = 0.0, seed: int = 0
) -> tuple[list[int], dict[str, Any]]:
    out: list[int] = []
    _, spec = _core.generate_chain(
        target, draft, prompt, n, temp, 0, 1.0, seed, [], lambda t: out.append(t) or True, 15, rewrite
    )
    return out, spec


def _prompts(n_vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, n_vocab, size=int(rng.integers(4, 40))).tolist() for _ in range(N_PROMPTS)]


def test_greedy_chain_equals_autoregressive(pair):
    target, draft = _engines(pair)
    rng = np.random.default_rng(0)
    total = Counter()
    rewritten, real = SameTokens("chain, rewritten drafts"), SameTokens("chain, real drafter")
    for n, prompt in enumerate(_prompts(target.hparams["n_vocab"])):
        ref = _ar(target, prompt, N_GEN)

        out, spec = _chain(target, draft, prompt, N_GEN, corrupted_reference(prompt, ref, rng))
        rewritten.check(out, ref, target, prompt)
        if out == ref:  # past a GPU near-tie divergence, drafts rewritten from ref no longer fit
            total.update(accepted=spec["accepted"], drafts=spec["drafts"])
        if n < 4:  # the real (random-weight) drafter: nearly every draft rejected
            plain, _ = _chain(target, draft, prompt, N_GEN)
            real.check(plain, ref, target, prompt)
    rewritten.finish()
    real.finish()
    assert total["drafts"] > 0, "no prompt identical to decoding"
    assert total["accepted"] > 5 * total["drafts"]  # the rewritten drafts were mostly accepted


def test_chain_stats_and_limits(pair):
    target, draft = _engines(pair)
    prompt = list(range(10, 30))
    ref = _ar(target, prompt, 40)
    out, spec = _chain(target, draft, prompt, 40, lambda start, d: ref[start - 20 + 1 :][: len(d)] + [0] * 15)
    assert out == ref and len(out) == 40
    # every draft fully accepted: 15 per step and acceptance length 16, except the budget-capped last steps
    assert spec["accepted_per_pos"][0] == spec["drafts"]
    assert spec["acceptance_length"] > 8
    assert spec["target_forwards"] < 10  # 1 prefill + a few verifies instead of 40 decode steps


def test_chunked_prefill_feeds_the_drafter(pair):
    """A prompt longer than the prefill chunk: each chunk's feature rows reach the drafter before
    the next chunk's forward overwrites them on the device, so the drafts (and the accepted
    counts) are those of a one-chunk prefill."""
    prompt = np.random.default_rng(3).integers(0, 4096, size=45).tolist()
    runs = []
    for n_batch in (16, 512):
        target, draft = _engines(pair, n_batch)
        ref = _ar(target, prompt, 48)
        drafts: list[list[int]] = []

        def record(start: int, d: list[int], drafts: list[list[int]] = drafts) -> list[int]:
            drafts.append(list(d))
            return d

        out, spec = _chain(target, draft, prompt, 48, record)
        same = SameTokens(f"chunked prefill, n_batch {n_batch}")
        same.check(out, ref, target, prompt)
        same.finish()
        runs.append((drafts, spec["accepted_per_pos"]))
    if not ON_GPU:  # on the GPU the chunks' features round differently (another matmul split)
        assert runs[0] == runs[1]


def _topk_probs(logits: np.ndarray, k: int, temp: float) -> dict[int, float]:
    idx = np.argsort(-logits)[:k]
    z = logits[idx] / temp
    p = np.exp(z - z.max())
    return dict(zip(idx.tolist(), (p / p.sum()).tolist(), strict=True))


def test_sampled_chain_matches_target_distribution(pair):
    """Sample-and-match is lossless: the empirical joint distribution of the first two sampled
    tokens equals the exact one computed from the target's logits (temperature 1, top-k 4, so
    16 outcomes; 500 samples give an expected total variation near 0.07; we allow 0.15).
    Drafts are rewritten to the target's most likely token so that matches happen often."""
    target, draft = _engines(pair)
    prompt = [5, 6, 7, 8]
    k, temp, n = 4, 1.0, 500
    p1 = _topk_probs(target.eval_logits(prompt)[-1], k, temp)
    joint: dict[tuple[int, int], float] = {}
    best_after: dict[int, int] = {}
    for t1, q1 in p1.items():
        p2 = _topk_probs(target.eval_logits(prompt + [t1])[-1], k, temp)
        best_after[t1] = max(p2, key=p2.get)
        for t2, q2 in p2.items():
            joint[(t1, t2)] = q1 * q2

    seen: Counter[tuple[int, int]] = Counter()
    accepted = 0
    for seed in range(n):
        out: list[int] = []

        def rewrite(start: int, d: list[int], out: list[int] = out) -> list[int]:
            return [best_after.get(out[-1], 0)] + [0] * (len(d) - 1)

        _, spec = _core.generate_chain(
            target,
            draft,
            prompt,
            3,
            temp,
            k,
            1.0,
            seed,
            [],
            lambda t, out=out: out.append(t) or True,
            15,
            rewrite,
        )
        accepted += spec["accepted"]
        seen[(out[0], out[1])] += 1
    tv = 0.5 * sum(abs(seen[key] / n - joint.get(key, 0.0)) for key in set(joint) | set(seen))
    assert tv < 0.15, tv
    assert accepted > n // 4  # the match path ran


def test_engine_api_with_drafter(pair, tmp_path, monkeypatch):
    """The Python API with a drafter (GGUF or z-lab directory), chain and DDTree: same greedy text
    as without. On the CPU everywhere (exactness on CUDA: gpu_policy.py)."""
    import dflash

    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))
    kw = {"n_ctx": 256, "n_threads": 2, "n_gpu_layers": 0}
    plain = dflash.Engine(model_path=str(pair[0]), **kw)
    spec = dflash.Engine(model_path=str(pair[0]), draft_path=str(pair[1]), max_draft=7, **kw)
    assert spec.speculative and not plain.speculative
    a = plain.create_completion("def f(x):", max_tokens=48, temperature=0)
    b = spec.create_completion("def f(x):", max_tokens=48, temperature=0)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    t = b["timings"]
    assert t["draft_n"] > 0 and len(t["accepted_per_pos"]) == 7
    assert spec.stats()["draft_tokens"] == t["draft_n"]
    # the z-lab directory itself is accepted too (converted once into the cache)
    zdir = pair[1].parent / "drafter"
    spec2 = dflash.Engine(model_path=str(pair[0]), draft_path=str(zdir), **kw)
    c = spec2.create_completion("def f(x):", max_tokens=48, temperature=0)
    assert c["choices"][0]["text"] == a["choices"][0]["text"]
    # DDTree through the same API: same greedy text
    tree = dflash.Engine(model_path=str(pair[0]), draft_path=str(pair[1]), budget=12, **kw)
    d = tree.create_completion("def f(x):", max_tokens=48, temperature=0)
    assert d["choices"][0]["text"] == a["choices"][0]["text"] and d["timings"]["draft_n"] > 0
    with pytest.raises(dflash.InvalidParameterError):
        dflash.Engine(model_path=str(pair[0]), draft_path=str(pair[1]), budget=-1)


@pytest.mark.parametrize("weights", ["q8_0", "f32"])
def test_invariant_switch_keeps_the_cpu_logits(synth_model, weights):
    """The batch_invariant switch tags the target's weight matmuls (on the CPU the same products)
    and gives decodes and verifies ggml_ext's path attention: prefill logits stay bit-identical
    (a prefill keeps ggml's attention) and verify logits agree to float rounding. With an f32 KV
    cache: ggml's CPU flash attention rounds the query to f16 for an f16 cache, which this random
    model amplifies to ~5% of its logits."""
    path = str(synth_model("tiny-b", weights))
    prompt, draft = list(range(40, 300, 7)), [5, 9, 200, 31, 7, 7, 1000, 2]
    out = []
    for flag in (False, True):
        cfg = _core.EngineConfig()
        cfg.n_ctx, cfg.n_gpu_layers, cfg.n_threads, cfg.batch_invariant = 512, 0, 2, flag
        cfg.k_type = cfg.v_type = "f32"
        eng = _core.TargetEngine(path, cfg)
        first, _, _ = eng.forward(prompt, True)
        verify, _, _ = eng.verify(draft, [])
        out.append((first, verify))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=0, atol=1e-5 * float(np.abs(out[0][1]).max()))


GPU = _core.gpu_backend_available()
REQUIRE_GPU = os.environ.get("DFLASH_REQUIRE_CUDA") == "1"


@pytest.mark.skipif(
    not GPU and not REQUIRE_GPU, reason="no GPU backend in this build (run on the GPU machine)"
)
def test_cuda_chain_with_invariant_matmuls_equals_decoding(synth_model, drafter_pair):
    """On CUDA with a q8_0 target and batch_invariant, every verify token's matmuls and attention
    are a decode step's, so greedy chain output equals autoregressive output exactly
    (ggml_ext/BATCH_INVARIANCE.md; 20/20 on the H200, bench/results/h200-s4-cuda-tests.log; DDTree:
    tests/test_batch_invariant.py)."""
    target_path = synth_model("tiny-b", "q8_0")
    _, drafter = drafter_pair(seed=1, layer_types=("sliding_attention", "full_attention"), sliding_window=8)
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_gpu_layers, cfg.n_threads, cfg.n_verify_max, cfg.batch_invariant = 512, 99, 2, 16, True
    target = _core.TargetEngine(str(target_path), cfg)
    dcfg = _core.DraftEngineConfig()
    dcfg.kv_type = "f32"
    draft = _core.DraftEngine(str(drafter), target, dcfg)
    rng = np.random.default_rng(0)
    same = 0
    for prompt in _prompts(target.hparams["n_vocab"]):
        ref = _ar(target, prompt, N_GEN)
        out, _ = _chain(target, draft, prompt, N_GEN, corrupted_reference(prompt, ref, rng))
        same += out == ref
    print(f"invariant matmuls on CUDA: {same}/{N_PROMPTS} prompts identical to decoding")
    assert same == N_PROMPTS
