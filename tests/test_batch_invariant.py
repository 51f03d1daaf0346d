"""The batch-invariant mode (EngineConfig.batch_invariant, ggml_ext/BATCH_INVARIANCE.md): every token
of a verify and every node of a DDTree gets the bits a one-token decode gives it, on the CPU and on
CUDA, so greedy speculative output equals autoregressive output token for token on the GPU too
(the default mode's CUDA kernels round a batch otherwise: tests/gpu_policy.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from spec_helpers import corrupted_reference

import dflash
from dflash import _core

TEST_NGL = int(os.environ.get("DFLASH_TEST_NGL", "0"))  # 99 on the GPU machine
ON_GPU = TEST_NGL > 0
# Weight types whose products the mode covers on CUDA (mul_mat_invariant: quantized weights).
MODELS = [("tiny-b", "q8_0"), ("tiny-c", "q4_K_M")]
TREES = [
    [-1, 0, 1, 2, 3, 4, 5],  # a chain
    [-1, 0, 0, 1, 1, 2, 5, 3, 7, 7],  # branches at several depths
    [-1, 0, 0, 0, 0, 0],  # a star
]


def _target(path: Path, n_verify_max: int = 17, kv: str = "f16") -> Any:
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_gpu_layers, cfg.n_threads, cfg.n_verify_max = 512, TEST_NGL, 2, n_verify_max
    cfg.k_type = cfg.v_type = kv
    cfg.batch_invariant = True
    return _core.TargetEngine(str(path), cfg)


def _decoded(eng: Any, prompt: list[int], path: list[int]) -> np.ndarray:
    """Logits after each token of `path`, decoded one at a time after the prompt."""
    eng.reset()
    eng.forward(prompt, False)
    return np.stack([eng.forward([t], False)[0][0] for t in path])


@pytest.mark.parametrize(("preset", "weights"), MODELS)
def test_verify_tokens_and_tree_nodes_are_decode_steps_bit_for_bit(
    synth_model, preset: str, weights: str
) -> None:
    eng = _target(synth_model(preset, weights))
    rng = np.random.default_rng(3)
    n_vocab = eng.hparams["n_vocab"]
    prompt = rng.integers(0, n_vocab, size=300).tolist()  # past a 256-row padding step
    chain = rng.integers(0, n_vocab, size=9).tolist()
    eng.reset()
    eng.forward(prompt, False)
    got = eng.verify(chain)[0]
    np.testing.assert_array_equal(got, _decoded(eng, prompt, chain), err_msg="chain verify")
    for parents in TREES:
        tokens = rng.integers(0, n_vocab, size=len(parents)).tolist()
        eng.reset()
        eng.forward(prompt, False)
        got = eng.verify_tree(tokens, parents)[0]
        for i in range(len(parents)):
            path, a = [], i
            while a >= 0:
                path.append(tokens[a])
                a = parents[a]
            want = _decoded(eng, prompt, path[::-1])[-1]
            np.testing.assert_array_equal(got[i], want, err_msg=f"tree {parents}, node {i}")


def test_quantized_kv_is_refused_up_front(synth_model) -> None:
    with pytest.raises(_core.InvalidParameterError, match="batch_invariant needs an f16, bf16 or f32 KV"):
        _target(synth_model("tiny-b", "q8_0"), kv="q8_0")
    with pytest.raises(dflash.InvalidParameterError, match="batch_invariant"):
        dflash.Engine(model_path=str(synth_model("tiny-b", "q8_0")), kv_type="q4_0", batch_invariant=True)


def _generate(target: Any, draft: Any, prompt: list[int], n: int, budget: int, rewrite: Any) -> list[int]:
    out: list[int] = []
    _core.generate_chain(
        target, draft, prompt, n, 0.0, 0, 1.0, 0, [], lambda t: out.append(t) or True, 15, rewrite, budget
    )
    return out


def _ar(target: Any, prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    target.generate(prompt, n, 0.0, 0, 1.0, 0, [], lambda t: out.append(t) or True)
    return out


# On the CPU every mode is exact (test_ddtree, test_spec_chain); here the mode's graphs run there
# on a few prompts, and on the GPU machine on the 20 prompts x 128 tokens per budget.
N_PROMPTS = 20 if ON_GPU else 2


@pytest.mark.parametrize("budget", [0, 1, 4, 16, 64])
def test_greedy_chain_and_ddtree_equal_decoding(synth_model, drafter_pair, budget: int) -> None:
    """Budget 0 is chain DFlash. The synthetic drafter's top-1 candidates are rewritten from the
    reference with a random corruption (spec_helpers.py), so accepts of every length run."""
    target = _target(synth_model("tiny-b", "q8_0"), n_verify_max=max(budget, 15) + 1)
    dcfg = _core.DraftEngineConfig()
    dcfg.kv_type, dcfg.top_k = "f32", 4
    draft = _core.DraftEngine(str(drafter_pair(seed=2)[1]), target, dcfg)
    rng = np.random.default_rng(budget)
    same = 0
    for _ in range(N_PROMPTS):
        prompt = rng.integers(0, 4096, size=int(rng.integers(4, 30))).tolist()
        ref = _ar(target, prompt, 128)

        same += _generate(target, draft, prompt, 128, budget, corrupted_reference(prompt, ref, rng)) == ref
    print(f"batch-invariant, budget {budget}: {same}/{N_PROMPTS} prompts identical to decoding")
    assert same == N_PROMPTS


@pytest.mark.skipif(not ON_GPU, reason="the trained pair on the GPU machine (DFLASH_TEST_NGL=99)")
def test_trained_pair_ddtree_equals_decoding_on_the_gpu() -> None:
    """The packaged trained pair and its real drafter, 20 held-out prompts x 128 tokens: greedy
    DDTree text equals autoregressive text for budgets 1, 4, 16 and 64 (and chain DFlash)."""
    held_out = Path(__file__).resolve().parents[1] / "bench" / "prompts" / "pair-heldout-code48.jsonl"
    prompts = [json.loads(line)["prompt"] for line in held_out.read_text().splitlines()][:20]
    kw: dict[str, Any] = {"n_ctx": 2048, "batch_invariant": True}
    ar = dflash.Engine(default_draft=False, **kw)
    want = [ar.create_completion(p, max_tokens=128, temperature=0)["choices"][0]["text"] for p in prompts]
    for budget in (0, 1, 4, 16, 64):
        eng = dflash.Engine(budget=budget, **kw)
        got = [eng.create_completion(p, max_tokens=128, temperature=0)["choices"][0]["text"] for p in prompts]
        same = sum(g == w for g, w in zip(got, want, strict=True))
        print(f"trained pair, batch-invariant, budget {budget}: {same}/{len(prompts)} identical")
        assert same == len(prompts)
