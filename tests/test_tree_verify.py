"""DDTree verify on the target: a tree of drafts in one forward (positions = start + depth,
attention mask = committed prefix + ancestors-or-self, Gated DeltaNet layers through the tree
ops) gives at every node the logits of decoding prompt + root-to-node path one token at a time;
committing a path moves its K/V rows to consecutive positions and replays the recurrent state
along it, so decoding continues exactly. On the CPU all of it is bit for bit (a verify's products
are column-invariant there, ggml_ext/BATCH_INVARIANCE.md); on CUDA within the batched kernels'
rounding. Tested on an all-attention qwen35 model and on the hybrid tiny models."""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gpu_policy import LOGIT_TOL, assert_state_close
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash import _core
from dflash.synth import get_preset, write_qwen35_gguf

TEST_NGL = int(os.environ.get("DFLASH_TEST_NGL", "0"))  # 99 on the GPU machine

TOL = LOGIT_TOL  # relative to 1 + max |logit|: batched vs single-token kernels round differently


@pytest.fixture(scope="module")
def attn_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = replace(get_preset("tiny-b").config, name="all-attention", full_attention_interval=1)
    return write_qwen35_gguf(tmp_path_factory.mktemp("attn") / "attn.gguf", cfg, seed=3)


@functools.cache
def _engine(path: Path, role: str = "spec") -> _core.TargetEngine:
    """One engine per model and role for the whole module: hypothesis runs many examples, and a
    GPU engine per example would hold device memory until the garbage collector ran."""
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_gpu_layers, cfg.n_threads, cfg.n_verify_max = 256, TEST_NGL, 1, 32
    return _core.TargetEngine(str(path), cfg)


def _path_to(parents: list[int], i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


trees = st.integers(2, 24).flatmap(
    lambda n: st.tuples(
        st.just(n),
        st.lists(st.integers(0, 10**6), min_size=n - 1, max_size=n - 1),  # parent choice seeds
        st.lists(st.integers(0, 4095), min_size=n, max_size=n),  # tokens
        st.integers(0, 10**6),  # which node's path to commit
    )
)


def _decode(ar: _core.TargetEngine, prompt: list[int], tokens: list[int]) -> list[np.ndarray]:
    """Prefill the prompt, then decode `tokens` one forward each: their logits."""
    ar.reset()
    ar.forward(prompt, False)
    return [np.asarray(ar.forward([t], True)[0])[-1] for t in tokens]


def _assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if TEST_NGL == 0:
        assert np.array_equal(got, want), f"{what}: max |diff| {float(np.abs(got - want).max()):.3g}"
    else:
        assert float(np.abs(got - want).max()) <= TOL * (1 + float(np.abs(want).max())), what


def _check_tree(model: Path, case: tuple) -> None:
    n, seeds, tokens, pick = case
    parents = [-1] + [s % i for i, s in zip(range(1, n), seeds, strict=True)]
    prompt = [7, 8, 9, 10, 11, 12]
    spec, ar = _engine(model), _engine(model, "ar")
    spec.reset()
    spec.forward(prompt, False)
    logits, _ = spec.verify_tree(tokens, parents)
    # every node lies on a leaf's path: decoding each leaf's path gives every node's reference
    leaves = set(range(n)) - set(parents)
    for leaf in sorted(leaves):
        path = _path_to(parents, leaf)
        for node, ref in zip(path, _decode(ar, prompt, [tokens[j] for j in path]), strict=True):
            _assert_same(logits[node], ref, f"node {node}")

    path = _path_to(parents, pick % n)
    spec.commit_path(path)
    assert spec.n_past == len(prompt) + len(path)
    # the committed recurrent state is decoding's after prompt + path
    _decode(ar, prompt, [tokens[j] for j in path])
    for layer, recurrent in enumerate(spec.hparams["is_recurrent"]):
        if recurrent:
            for got, want in zip(spec.recurrent_state(layer), ar.recurrent_state(layer), strict=True):
                if TEST_NGL == 0:
                    assert np.array_equal(got, want), f"layer {layer}"
                else:
                    assert_state_close(got, want, f"layer {layer}")
    nxt = 99
    after, _, _ = spec.forward([nxt], True)
    ref, _, _ = ar.forward([nxt], True)
    _assert_same(np.asarray(after)[0], np.asarray(ref)[0], "the token after the path")


@settings(max_examples=15, deadline=None)
@given(trees)
def test_tree_on_attention_only_model(attn_model: Path, case: tuple) -> None:
    _check_tree(attn_model, case)


@pytest.mark.parametrize("preset", ["tiny-a", "tiny-b"])
@settings(max_examples=12, deadline=None)
@given(case=trees)
def test_tree_on_hybrid_model(synth_model, preset: str, case: tuple) -> None:
    _check_tree(synth_model(preset, "f32"), case)


def test_tree_guards(attn_model: Path) -> None:
    eng = _engine(attn_model)
    eng.reset()
    eng.forward([1, 2, 3], False)
    with pytest.raises(_core.InvalidParameterError, match="parent must be -1"):
        eng.verify_tree([1, 2], [0, 0])
    with pytest.raises(_core.InvalidParameterError, match="must be in"):
        eng.verify_tree([1, 2, 3], [-1, 2, 0])
    eng.verify_tree([1, 2, 3], [-1, 0, 0])
    with pytest.raises(_core.InvalidParameterError, match="commit_path"):
        eng.commit(1)
    with pytest.raises(_core.InvalidParameterError, match="not a child"):
        eng.commit_path([0, 1, 2])
    eng.commit_path([0, 2])
    assert eng.n_past == 5


GPU = _core.gpu_backend_available()
REQUIRE_GPU = os.environ.get("DFLASH_REQUIRE_CUDA") == "1"


@pytest.mark.skipif(
    not GPU and not REQUIRE_GPU, reason="no GPU backend in this build (run on the GPU machine)"
)
@pytest.mark.parametrize("preset", ["tiny-a", "tiny-b"])
def test_cuda_tree_verify_tracks_the_cpu(synth_model, preset: str) -> None:
    """The tree machinery on CUDA, apart from the batched kernels' rounding: a tree verify's
    logits on the GPU are as close to the CPU's (exact there) as the GPU's plain batched forward
    of each root-to-node sequence is to the CPU's. A deep node of a mostly-flat tree (the shape
    hypothesis shrank a GPU failure to) and a chain-shaped branch."""
    model = synth_model(preset, "f32")

    def eng(ngl: int) -> _core.TargetEngine:
        cfg = _core.EngineConfig()
        cfg.n_ctx, cfg.n_gpu_layers, cfg.n_threads, cfg.n_verify_max = 256, ngl, 2, 32
        return _core.TargetEngine(str(model), cfg)

    gpu, cpu = eng(99), eng(0)
    prompt = [7, 8, 9, 10, 11, 12]
    parents = [-1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 10, 15, 16, 17, 18]
    tokens = [0] * 15 + [3028, 3871, 5, 77, 1024]
    out = {}
    for name, e in (("gpu", gpu), ("cpu", cpu)):
        e.reset()
        e.forward(prompt, False)
        out[name], _ = e.verify_tree(tokens, parents)
    worst_tree, worst_seq = 0.0, 0.0
    for i in range(len(tokens)):
        seq = prompt + [tokens[j] for j in _path_to(parents, i)]
        ref = cpu.eval_logits(seq)[-1]
        worst_tree = max(worst_tree, float(np.abs(out["gpu"][i] - out["cpu"][i]).max()))
        worst_seq = max(worst_seq, float(np.abs(gpu.eval_logits(seq)[-1] - ref).max()))
        np.testing.assert_allclose(out["cpu"][i], ref, rtol=0, atol=TOL * (1 + float(np.abs(ref).max())))
    print(f"{preset}: max |GPU - CPU| tree verify {worst_tree:.3g}, plain batched forwards {worst_seq:.3g}")
    assert worst_tree <= 3 * worst_seq + 1e-3
