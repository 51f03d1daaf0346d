"""The delta rule over a chain of tokens (ggml_gated_delta_net with a scalar gate, one state out):
the op against the numpy reference of the equations (REFERENCE.md section 4) on the CPU; on the
GPU, ggml_ext's chain kernel (several state columns a warp, kernels/gdn_chain.cu) bit-equal to
ggml's own kernel for 1, 2 and 4 columns a warp, inputs staged in shared memory or not (outputs
and final state), and the tree kernel's
columns and forms (walk, paths) bit-equal to each other. The emulator runs the same kernels in CI
(test_cuda_emu.py).

Tolerance against numpy: 2e-5 of the output scale (float32 against float64 sums)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_tree_ops import gdn_inputs, ref_gdn

from dflash import _core

GPU = _core.gpu_backend_available()
needs_gpu = pytest.mark.skipif(
    not GPU and os.environ.get("DFLASH_REQUIRE_CUDA") != "1",
    reason="no GPU backend in this build (run on the GPU machine)",
)


def ref_chain(q, k, v, g, beta, state):  # noqa: ANN001, ANN201
    """A chain token by token in float64: the outputs [n, Hv, S] (ref_gdn's per-node paths, linear
    in the tokens) and the final state [Hv, S, S] (row j = column j of S)."""
    n, hv, s = v.shape
    hk = k.shape[1]
    out, final = np.zeros((n, hv, s)), np.zeros((hv, s, s))
    for h in range(hv):
        m = state[h].T.astype(np.float64)
        for t in range(n):
            kk, qq = k[t, h % hk].astype(np.float64), q[t, h % hk].astype(np.float64)
            m = m * np.exp(g[t, h, 0])
            m = m + np.outer(kk, (v[t, h] - m.T @ kk) * beta[t, h, 0])
            out[t, h] = m.T @ qq / np.sqrt(s)
        final[h] = m.T
    return out, final


@pytest.mark.parametrize(("s", "n"), [(16, 1), (32, 9), (64, 24), (128, 5)])
def test_chain_op_matches_the_equations(s: int, n: int) -> None:
    args = gdn_inputs(np.random.default_rng(s + n), n, s=s, hk=2, hv=4)
    out, state = _core.op_gated_delta_net(*args)
    want = ref_gdn(*args, [-1, *range(n - 1)])
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * scale)
    chain_out, chain_state = ref_chain(*args)
    np.testing.assert_allclose(out, chain_out, rtol=0, atol=2e-5 * scale)
    marked, marked_state = _core.op_gated_delta_net(*args, reordered=True)  # the CPU ignores the mark
    assert np.array_equal(marked, out) and np.array_equal(marked_state, state)
    np.testing.assert_allclose(state, chain_state, rtol=0, atol=2e-5 * scale)


def test_chunked_delta_rule_is_off_by_default() -> None:
    """Slower than the chain kernel on the H200 so far (kernels/gdn_chunked.cu): marked nodes take
    it only when DFLASH_GDN_CHUNKED=1 (CUDA builds); 8 tokens or more by default."""
    assert _core.gdn_chunked() == (GPU and os.environ.get("DFLASH_GDN_CHUNKED") == "1")
    assert _core.gdn_chunked_min_tokens() == 8 or "DFLASH_GDN_CHUNKED_MIN" in os.environ


@pytest.fixture
def gdn_switches_restored():  # noqa: ANN201
    cols, chain, tree, staged = (
        _core.gdn_columns(),
        _core.gdn_chain_enabled(),
        _core.tree_gdn_mode(),
        _core.gdn_staged(),
    )
    chunked, chunked_min = _core.gdn_chunked(), _core.gdn_chunked_min_tokens()
    one_round, one_round_columns = _core.gdn_one_round(), _core.gdn_one_round_columns()
    one_round_lanes, gram = _core.gdn_one_round_lanes(), _core.gdn_gram()
    one_round_step = _core.gdn_one_round_step()
    yield
    _core.set_gdn_one_round_step(one_round_step)
    _core.set_gdn_gram(gram)
    _core.set_gdn_one_round(one_round)
    _core.set_gdn_one_round_columns(one_round_columns)
    _core.set_gdn_one_round_lanes(one_round_lanes)
    _core.set_gdn_chunked(chunked)
    _core.set_gdn_chunked_min_tokens(chunked_min)
    _core.set_gdn_columns(cols)
    _core.set_gdn_chain_enabled(chain)
    _core.set_tree_gdn_mode(tree)
    _core.set_gdn_staged(staged)


@needs_gpu
@pytest.mark.parametrize("s", [16, 32, 64, 128])
@pytest.mark.parametrize("n", [1, 7, 64])
@pytest.mark.parametrize("staged", [False, True])
def test_cuda_chain_kernel_is_bit_equal_to_ggml(
    s: int, n: int, staged: bool, gdn_switches_restored: None
) -> None:
    """staged: inputs staged in shared memory a chunk of tokens at a time (S >= 64)."""
    args = gdn_inputs(np.random.default_rng(100 * s + n), n, s=s, hk=2, hv=6)
    _core.set_gdn_chain_enabled(False)
    ref_out, ref_state = _core.op_gated_delta_net(*args, gpu=True)
    _core.set_gdn_chain_enabled(True)
    _core.set_gdn_staged(staged)
    for cols in (1, 2, 4):
        _core.set_gdn_columns(cols)
        out, state = _core.op_gated_delta_net(*args, gpu=True)
        assert np.array_equal(out, ref_out), f"outputs, {cols} columns a warp"
        assert np.array_equal(state, ref_state), f"state, {cols} columns a warp"


def _check_reordered_chain(args: tuple, form_takes_it: bool) -> None:
    """A marked chain under the switches set: the numpy reference's outputs and final state within
    2e-5 of their scale; the chain kernel's bits exactly when the form should not take it, and
    with both reordered forms off."""
    out, state = _core.op_gated_delta_net(*args, gpu=True, reordered=True)
    want, want_state = ref_chain(*args)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * scale)
    np.testing.assert_allclose(state, want_state, rtol=0, atol=2e-5 * scale)
    chain_out, chain_state = _core.op_gated_delta_net(*args, gpu=True)
    assert np.array_equal(out, chain_out) != form_takes_it, "which kernel took the marked node"
    _core.set_gdn_chunked(False)
    _core.set_gdn_one_round(False)
    off_out, off_state = _core.op_gated_delta_net(*args, gpu=True, reordered=True)
    assert np.array_equal(off_out, chain_out) and np.array_equal(off_state, chain_state)


@needs_gpu
@pytest.mark.parametrize("s", [64, 128])
@pytest.mark.parametrize("n", [8, 16, 64, 65, 200])
def test_cuda_chunked_delta_rule_matches_the_equations(s: int, n: int, gdn_switches_restored: None) -> None:
    """The chunked form (kernels/gdn_chunked.cu; 65 and 200 tokens: chunks after a full one, the
    state carried) on a node marked for it."""
    _core.set_gdn_chunked(True)
    _core.set_gdn_chunked_min_tokens(0)
    _check_reordered_chain(gdn_inputs(np.random.default_rng(7 * s + n), n, s=s, hk=2, hv=6), True)


@needs_gpu
@pytest.mark.parametrize("s", [64, 128])
@pytest.mark.parametrize("n", [1, 2, 16, 17, 64, 200])
@pytest.mark.parametrize("columns", [1, 2, 4])
@pytest.mark.parametrize("lanes", [8, 16])
def test_cuda_one_round_chain_matches_the_equations(
    s: int, n: int, columns: int, lanes: int, gdn_switches_restored: None
) -> None:
    """The chain with one reduction round a token (kernels/gdn_chain_one_round.cu; on by default for
    marked nodes of 2 tokens or more, 2 columns a lane for a chain; 8 or 16 lanes a column; 17 and 200
    tokens: staged chunks after a full one; 200 with strongly decaying gates); one token keeps the chain
    kernel's bits."""
    assert _core.gdn_one_round() == (os.environ.get("DFLASH_GDN_ONE_ROUND") != "0")
    assert _core.gdn_one_round_columns() == int(os.environ.get("DFLASH_GDN_ONE_ROUND_COLUMNS", "0"))
    assert _core.gdn_one_round_lanes() == int(os.environ.get("DFLASH_GDN_ONE_ROUND_LANES", "0"))
    _core.set_gdn_chunked(False)
    _core.set_gdn_one_round(True)
    _core.set_gdn_one_round_columns(columns)
    _core.set_gdn_one_round_lanes(lanes)
    args = gdn_inputs(np.random.default_rng(11 * s + n), n, s=s, hk=2, hv=6)
    if n == 200:  # strong decay and a zero gate: the gates' product is folded into the state
        args[3][:] *= 30
        args[3][77] = -1e4
    _check_reordered_chain(args, n > 1)


@needs_gpu
@pytest.mark.parametrize("s", [64, 128])
@pytest.mark.parametrize("n", [2, 3, 16, 17, 64, 200])
@pytest.mark.parametrize("columns", [1, 2, 4])
@pytest.mark.parametrize("step", [2, 4])
def test_cuda_one_round_chain_steps_match_the_equations(
    s: int, n: int, columns: int, step: int, gdn_switches_restored: None
) -> None:
    """The one-round kernel with 2 or 4 tokens a step (DFLASH_GDN_ONE_ROUND_STEP; 1 by default): one
    butterfly a step, the step's tokens after it in scalars. 3 and 17 tokens: a chunk's last tokens
    under a step, one by one (fewer tokens than a step: the walk's bits); 200 with strongly decaying
    gates and a zero gate (steps whose gates' product is folded into the state first, or walked
    token by token)."""
    assert _core.gdn_one_round_step() == int(os.environ.get("DFLASH_GDN_ONE_ROUND_STEP", "1"))
    _core.set_gdn_chunked(False)
    _core.set_gdn_one_round(True)
    _core.set_gdn_one_round_columns(columns)
    _core.set_gdn_one_round_lanes(8)
    args = gdn_inputs(np.random.default_rng(17 * s + n + step), n, s=s, hk=2, hv=6)
    if n == 200:
        args[3][:] *= 30
        args[3][77] = -1e4
    _core.set_gdn_one_round_step(1)
    walk, _ = _core.op_gated_delta_net(*args, gpu=True, reordered=True)
    _core.set_gdn_one_round_step(step)
    stepped, _ = _core.op_gated_delta_net(*args, gpu=True, reordered=True)
    assert np.array_equal(stepped, walk) == (n < step), "which tokens went a step at a time"
    _check_reordered_chain(args, True)


@needs_gpu
@pytest.mark.parametrize("s", [64, 128])
@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 64, 200])
def test_cuda_gram_chain_matches_the_equations(s: int, n: int, gdn_switches_restored: None) -> None:
    """A marked chain 16 tokens at a time in parallel (kernels/gdn_chain_gram.cu; DFLASH_GDN_GRAM=1,
    off by default; 15 and 17: a padded chunk; 200 with strongly decaying gates and a zero gate);
    one token keeps the chain kernel's bits."""
    assert _core.gdn_gram() == (os.environ.get("DFLASH_GDN_GRAM") == "1")
    _core.set_gdn_chunked(False)
    _core.set_gdn_one_round(True)
    _core.set_gdn_gram(True)
    args = gdn_inputs(np.random.default_rng(13 * s + n), n, s=s, hk=2, hv=6)
    if n == 200:
        args[3][:] *= 30
        args[3][77] = -1e4
    _check_reordered_chain(args, n > 1)
    if n > 1:  # not the one-round kernel's bits either
        _core.set_gdn_gram(False)
        _core.set_gdn_one_round(True)
        one_round, _ = _core.op_gated_delta_net(*args, gpu=True, reordered=True)
        _core.set_gdn_gram(True)
        gram, _ = _core.op_gated_delta_net(*args, gpu=True, reordered=True)
        assert not np.array_equal(gram, one_round), "the gram kernel did not take the marked chain"


@needs_gpu
@pytest.mark.parametrize("s", [64, 128])
@pytest.mark.parametrize("n", [2, 21, 64, 65, 300])
@pytest.mark.parametrize("columns", [1, 2, 4])
@pytest.mark.parametrize("lanes", [8, 16])
def test_cuda_one_round_tree_matches_the_cpu_op(
    s: int, n: int, columns: int, lanes: int, gdn_switches_restored: None
) -> None:
    """The one-round kernel over a tree in preorder (two roots; states saved on a per-depth stack)
    on a marked node: the CPU op's values within 2e-5 of their scale, not the walk's bits."""
    rng = np.random.default_rng(3 * s + n)
    parents = _random_tree(rng, n)
    args = gdn_inputs(rng, n, s=s, hk=2, hv=6)
    _core.set_gdn_chunked(False)
    _core.set_gdn_one_round(True)
    _core.set_gdn_one_round_columns(columns)
    _core.set_gdn_one_round_lanes(lanes)
    got = _core.op_tree_gated_delta_net(*args, parents, gpu=True, reordered=True)
    want = _core.op_tree_gated_delta_net(*args, parents)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(1.0, float(np.abs(want).max())))
    assert not np.array_equal(got, _core.op_tree_gated_delta_net(*args, parents, gpu=True))


@needs_gpu
@pytest.mark.parametrize("s", [64, 128])
@pytest.mark.parametrize("n", [21, 65, 300])
@pytest.mark.parametrize("columns", [1, 2])
@pytest.mark.parametrize("step", [2, 4])
def test_cuda_one_round_tree_steps_match_the_cpu_op(
    s: int, n: int, columns: int, step: int, gdn_switches_restored: None
) -> None:
    """The one-round kernel over a tree with 2 or 4 nodes a step (runs of parent-child links in
    preorder, none but the last saving its state; the other nodes one by one): the CPU op's values
    within 2e-5 of their scale, not one node a step's bits."""
    rng = np.random.default_rng(5 * s + n + step)
    parents = _random_tree(rng, n, chain=0.8)
    args = gdn_inputs(rng, n, s=s, hk=2, hv=6)
    _core.set_gdn_chunked(False)
    _core.set_gdn_one_round(True)
    _core.set_gdn_one_round_columns(columns)
    _core.set_gdn_one_round_lanes(8)
    _core.set_gdn_one_round_step(1)
    one = _core.op_tree_gated_delta_net(*args, parents, gpu=True, reordered=True)
    _core.set_gdn_one_round_step(step)
    got = _core.op_tree_gated_delta_net(*args, parents, gpu=True, reordered=True)
    want = _core.op_tree_gated_delta_net(*args, parents)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(1.0, float(np.abs(want).max())))
    assert not np.array_equal(got, one), "no run of the tree went a step at a time"


def _random_tree(rng: np.random.Generator, n: int, chain: float = 0.5) -> list[int]:
    """Parents of n nodes (a chain link with probability `chain`), a second root, depths within the
    tree kernel's."""
    parents, depth = [-1], [0]
    for i in range(1, n):
        p = i - 1 if rng.random() < chain else int(rng.integers(0, i))
        p = p if depth[p] < 24 else 0  # within the tree kernel's depth
        parents.append(p)
        depth.append(depth[p] + 1)
    parents[n // 2] = -1  # its subtree keeps its depths: it only gets shallower
    return parents


@needs_gpu
@pytest.mark.parametrize("s", [64, 128])
@pytest.mark.parametrize("n", [21, 64, 65])
def test_cuda_chunked_tree_delta_rule_matches_the_cpu_op(s: int, n: int, gdn_switches_restored: None) -> None:
    """The chunked form over a tree's ancestors (two roots; 65 nodes: past its one chunk, so the
    tree kernel's bits) on a marked node: the CPU op's values within 2e-5 of their scale."""
    rng = np.random.default_rng(s + n)
    parents = _random_tree(rng, n)
    args = gdn_inputs(rng, n, s=s, hk=2, hv=6)
    _core.set_gdn_chunked(True)
    _core.set_gdn_chunked_min_tokens(0)
    _core.set_gdn_one_round(False)  # beyond 64 nodes: the walk
    got = _core.op_tree_gated_delta_net(*args, parents, gpu=True, reordered=True)
    want = _core.op_tree_gated_delta_net(*args, parents)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(1.0, float(np.abs(want).max())))
    walk = _core.op_tree_gated_delta_net(*args, parents, gpu=True)
    assert np.array_equal(got, walk) == (n > 64), "a tree of at most 64 nodes takes the chunked form"


@needs_gpu
@pytest.mark.parametrize("s", [64, 128])
def test_cuda_tree_kernel_columns_are_bit_equal(s: int, gdn_switches_restored: None) -> None:
    rng = np.random.default_rng(s)
    parents = [-1, 0, 0, 1, 1, 2, 5, 5, 6, 3, 9, 10, 11, 11, 2]
    args = gdn_inputs(rng, len(parents), s=s, hk=2, hv=6)
    outs = []
    for cols in (1, 2, 4):
        _core.set_gdn_columns(cols)
        outs.append(_core.op_tree_gated_delta_net(*args, parents, gpu=True))
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


@needs_gpu
@pytest.mark.parametrize("s", [16, 32, 64, 128])
def test_cuda_tree_kernel_forms_are_bit_equal(s: int, gdn_switches_restored: None) -> None:
    """The walk (a warp every node) and the paths (a warp a preorder segment) on a branchy tree
    with two roots, for every column count: the same bits, and the CPU op's values."""
    rng = np.random.default_rng(s + 3)
    parents = [-1, 0, 0, 1, 1, 2, 5, 5, 6, -1, 9, 10, 11, 11, 2, 14, 15, 16, 3, 3, 19]
    args = gdn_inputs(rng, len(parents), s=s, hk=2, hv=6)
    _core.set_tree_gdn_mode(1)
    walk = _core.op_tree_gated_delta_net(*args, parents, gpu=True)
    _core.set_tree_gdn_mode(2)
    for cols in (1, 2, 4):
        _core.set_gdn_columns(cols)
        paths = _core.op_tree_gated_delta_net(*args, parents, gpu=True)
        assert np.array_equal(paths, walk), f"{cols} columns"
    want = _core.op_tree_gated_delta_net(*args, parents)
    np.testing.assert_allclose(walk, want, rtol=0, atol=2e-5 * max(1.0, float(np.abs(want).max())))
