"""DDTree decoding is lossless: greedy output equals autoregressive output token for token for
every budget, and sampled output follows the target's distribution. The drafter is a random
synthetic one, so a test-only hook also rewrites the top-1 candidate of each depth (the seeded
chain) from the autoregressive reference with random corruptions: accepts of every length,
and branches off the chain, all run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gpu_policy import SameTokens
from spec_helpers import corrupted_reference

from dflash import _core

TEST_NGL = int(os.environ.get("DFLASH_TEST_NGL", "0"))  # 99 on the GPU machine


@pytest.fixture(scope="module")
def pair(drafter_pair: Any) -> tuple[Path, Path]:
    return drafter_pair(seed=2)


def _engines(pair: tuple[Path, Path], n_verify_max: int) -> tuple[Any, Any]:
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_gpu_layers, cfg.n_threads, cfg.n_verify_max = 512, TEST_NGL, 1, n_verify_max
    target = _core.TargetEngine(str(pair[0]), cfg)
    dcfg = _core.DraftEngineConfig()
    dcfg.kv_type, dcfg.top_k = "f32", 4
    return target, _core.DraftEngine(str(pair[1]), target, dcfg)


def _ar(target: Any, prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    target.generate(prompt, n, 0.0, 0, 1.0, 0, [], lambda t: out.append(t) or True)
    return out


def _tree(
    target: Any,
    draft: Any,
    prompt: list[int],
    n: int,
    budget: int,
    rewrite: Any = None,
    temp: float = 0.0,
    seed: int = 0,
    top_k: int = 0,
) -> tuple[list[int], dict[str, Any]]:
    out: list[int] = []
    _, spec = _core.generate_chain(
        target,
        draft,
        prompt,
        n,
        temp,
        top_k,
        1.0,
        seed,
        [],
        lambda t: out.append(t) or True,
        15,
        rewrite,
        budget,
    )
    return out, spec


@pytest.mark.parametrize("budget,n_prompts", [(1, 20), (4, 20), (16, 20), (64, 20)])
def test_greedy_ddtree_equals_autoregressive(pair, budget, n_prompts):
    target, draft = _engines(pair, max(budget, 16) + 1)
    rng = np.random.default_rng(budget)
    accepted = 0
    rewritten, real = SameTokens(f"budget {budget}, rewritten"), SameTokens(f"budget {budget}, real drafter")
    for k in range(n_prompts):
        prompt = rng.integers(0, 4096, size=int(rng.integers(4, 30))).tolist()
        ref = _ar(target, prompt, 128)

        out, spec = _tree(target, draft, prompt, 128, budget, corrupted_reference(prompt, ref, rng))
        rewritten.check(out, ref, target, prompt)
        accepted += spec["accepted"]
        if k < 2:  # the real drafter's trees: nearly every node rejected
            plain, _ = _tree(target, draft, prompt, 128, budget)
            real.check(plain, ref, target, prompt)
    rewritten.finish()
    real.finish()
    assert accepted > 0


def _topk_probs(logits: np.ndarray, k: int) -> dict[int, float]:
    idx = np.argsort(-logits)[:k]
    p = np.exp(logits[idx] - logits[idx].max())
    return dict(zip(idx.tolist(), (p / p.sum()).tolist(), strict=True))


def test_sampled_ddtree_matches_target_distribution(pair):
    """Sampling on the tree (sample the target at each node, follow the matching child) is
    lossless: the joint distribution of the first two tokens equals the exact one from the
    target's logits (temperature 1, top-k 3: 9 outcomes; 400 samples, TV bound 0.15). The
    chain's depth-1 candidate is rewritten to the likeliest next token so matches happen."""
    target, draft = _engines(pair, 17)
    prompt = [5, 6, 7, 8]
    k, n = 3, 400
    p1 = _topk_probs(target.eval_logits(prompt)[-1], k)
    joint: dict[tuple[int, int], float] = {}
    best_after: dict[int, int] = {}
    for t1, q1 in p1.items():
        p2 = _topk_probs(target.eval_logits(prompt + [t1])[-1], k)
        best_after[t1] = max(p2, key=p2.get)
        for t2, q2 in p2.items():
            joint[(t1, t2)] = q1 * q2
    seen: dict[tuple[int, int], int] = {}
    accepted = 0
    for seed in range(n):
        out: list[int] = []

        def rewrite(start: int, top1: list[int], out: list[int] = out) -> list[int]:
            return [best_after.get(out[-1], 0)] + top1[1:]

        _, spec = _core.generate_chain(
            target,
            draft,
            prompt,
            3,
            1.0,
            k,
            1.0,
            seed,
            [],
            lambda t, out=out: out.append(t) or True,
            15,
            rewrite,
            8,
        )
        accepted += spec["accepted"]
        seen[(out[0], out[1])] = seen.get((out[0], out[1]), 0) + 1
    tv = 0.5 * sum(abs(seen.get(key, 0) / n - joint.get(key, 0.0)) for key in set(joint) | set(seen))
    assert tv < 0.15, tv
    assert accepted > n // 4


@pytest.mark.parametrize("budget", [0, 1, 8, 64])
def test_step_statistics_are_consistent(pair, budget):
    """SpecStats of chain (budget 0) and DDTree steps add up: every generated token after the
    first comes from a decode step (accepted drafts + the target's own token), per-depth
    acceptance counts steps whose accepted path reached that depth (non-increasing, summing to
    the accepted tokens), and every step verifies its anchor plus its draft nodes."""
    target, draft = _engines(pair, 65)
    prompt = [11, 12, 13, 14, 15]
    n = 48
    ref = _ar(target, prompt, n + 20)
    rng = np.random.default_rng(budget)

    def rewrite(start: int, top1: list[int]) -> list[int]:
        i = start - len(prompt) + 1
        good = ref[i : i + len(top1)] + [0] * len(top1)
        bad_at = int(rng.integers(1, 8))  # accepts of 0..7 drafts
        return [t if j < bad_at else (t + 1) % 4096 for j, t in enumerate(good[: len(top1)])]

    out: list[int] = []
    st, spec = _core.generate_chain(
        target, draft, prompt, n, 0.0, 0, 1.0, 0, [], lambda t: out.append(t) or True, 15, rewrite, budget
    )
    same = SameTokens(f"statistics, budget {budget}")
    same.check(out, ref[:n], target, prompt)
    same.finish()
    assert st.n_generated == n
    per = spec["accepted_per_pos"]
    assert sum(per) == spec["accepted"] > 0
    assert all(a >= b for a, b in zip(per, per[1:], strict=False))
    assert per[0] <= spec["drafts"] <= spec["steps"]
    assert spec["steps"] == spec["target_forwards"] - 1  # one prefill forward
    assert spec["committed"] == n - 1 == spec["accepted"] + spec["steps"]
    assert spec["verified_tokens"] == spec["draft_tokens"] + spec["steps"]
    assert spec["tokens_per_forward"] == pytest.approx(spec["committed"] / spec["steps"])
    assert spec["acceptance_length"] == pytest.approx(1 + spec["accepted"] / spec["drafts"])
    assert spec["draft_tokens"] <= max(budget, 15) * spec["drafts"]
    for k in ("draft_ms", "verify_ms", "commit_ms"):
        assert spec[k] > 0, k
    assert (spec["tree_ms"] > 0) == (budget > 0)

    # The same through DecodeSession, stepped by hand with the rewrite hook.
    rng = np.random.default_rng(budget)
    s = _core.DecodeSession(
        target, draft, prompt, n, 0.0, 0, 1.0, 0, [], budget=budget, rewrite_drafts=rewrite
    )
    got: list[int] = []
    while not s.done:
        got += s.step()
    assert got == out
    spec2 = s.spec
    for k in ("steps", "committed", "accepted", "draft_tokens", "verified_tokens", "accepted_per_pos"):
        assert spec2[k] == spec[k], k


def test_drafter_blocks_deeper_than_the_tree_ops_are_refused_up_front(drafter_pair: Any) -> None:
    """A DDTree over a drafter whose block is deeper than the tree ops allow (32 levels) is refused
    when the session is created, not in the middle of a request; chain decoding still works."""
    deep = drafter_pair(seed=3, block_size=40)
    target, draft = _engines(deep, 48)
    with pytest.raises(_core.InvalidParameterError, match="block size 40"):
        _core.DecodeSession(target, draft, [1, 2, 3], 8, 0.0, 0, 1.0, 0, [], budget=8)
    s = _core.DecodeSession(target, draft, [1, 2, 3], 8, 0.0, 0, 1.0, 0, [], budget=0)
    got: list[int] = []
    while not s.done:
        got += s.step()
    same = SameTokens("chain over a deep drafter")
    same.check(got, _ar(target, [1, 2, 3], 8), target, [1, 2, 3])
    same.finish()


@pytest.mark.parametrize("budget", [0, 16])
def test_forced_acceptance_for_benches(pair, budget):
    """Bench-only forced acceptance (upstream's --spec-synth-len counterpart): every step keeps
    exactly k drafts - the chain's first ones or the tree's top-1 path - whatever the target says,
    so engine speed at acceptance length k + 1 can be measured on random weights."""
    target, draft = _engines(pair, 17)
    k, n = 5, 64
    out: list[int] = []
    st, spec = _core.generate_chain(
        target,
        draft,
        [3, 4, 5],
        n,
        0.0,
        0,
        1.0,
        0,
        [],
        lambda t: out.append(t) or True,
        15,
        None,
        budget,
        forced_accept=k,
    )
    assert len(out) == n == st.n_generated
    per = spec["accepted_per_pos"]
    full = per[k - 1]  # steps that kept all k (all but the budget-capped last one)
    assert full >= spec["drafts"] - 1 and per[k] == 0
    assert spec["accepted"] >= k * full
    assert 1 + k - 0.5 <= spec["acceptance_length"] <= 1 + k
