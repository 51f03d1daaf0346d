"""DDTree tree builder and walk (`_core.build_tree`, `_core.walk_tree`), host side.

Properties over random candidate tables (L depths x K candidates, best first): the tree is
prefix-closed and topological, it is exactly the N most probable prefixes (brute force over all
prefixes), the chain seed puts the top-1 chain first and fills the rest best-first, the walk
follows the target's choices, and bad arguments raise InvalidParameterError.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash import _core

Table = tuple[np.ndarray, np.ndarray]  # (L, K) int32 ids, (L, K) float32 log-probs
Tree = dict[str, Any]

BRUTE_MAX = 4000  # prefixes enumerated by the brute force

SETTINGS = settings(max_examples=150, deadline=None, database=None)


@st.composite
def tables(draw: st.DrawFn, max_depth: int = 8, brute: bool = False) -> Table:
    """A random candidate table; `ties` quantises the log-probs so that many prefixes tie."""
    k = draw(st.integers(1, 5))
    depth = draw(st.integers(1, max_depth))
    if brute:
        while depth > 1 and sum(k**d for d in range(1, depth + 1)) > BRUTE_MAX:
            depth -= 1
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ties = draw(st.booleans())
    ids = np.stack([rng.choice(1000, size=k, replace=False) for _ in range(depth)]).astype(np.int32)
    if ties:
        logp = -np.log(2.0) * rng.integers(0, 4, size=(depth, k))
    else:
        logits = rng.normal(scale=draw(st.sampled_from([0.5, 2.0, 6.0])), size=(depth, k + 3))
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        logp = logp[:, :k]
    logp = -np.sort(-logp, axis=1)
    return ids, logp.astype(np.float32)


def n_prefixes(depth: int, k: int) -> int:
    return sum(k**d for d in range(1, depth + 1))


def all_prefixes(logp: np.ndarray) -> dict[tuple[int, ...], float]:
    """Every prefix as a rank tuple -> its cumulative log-prob (summed from depth 1, in float64)."""
    depth, k = logp.shape
    out: dict[tuple[int, ...], float] = {}
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(k), repeat=d):
            q = 0.0
            for i, r in enumerate(ranks):
                q += float(logp[i, r])
            out[ranks] = q
    return out


def rank_tuples(tree: Tree) -> list[tuple[int, ...]]:
    parents, ranks = tree["parents"], tree["ranks"]
    tuples: list[tuple[int, ...]] = []
    for i in range(len(parents)):
        prefix = () if parents[i] < 0 else tuples[parents[i]]
        tuples.append((*prefix, int(ranks[i])))
    return tuples


def check_structure(tree: Tree, ids: np.ndarray, logp: np.ndarray, budget: int) -> None:
    """Prefix-closed, topological, tokens/logq consistent with the table, child map consistent."""
    depth, k = ids.shape
    n = len(tree["tokens"])
    assert n == min(budget, n_prefixes(depth, k))
    for name in ("tokens", "parents", "depths", "ranks", "child_list"):
        assert tree[name].dtype == np.int32 and tree[name].shape == (n,), name
    assert tree["logq"].dtype == np.float32 and tree["logq"].shape == (n,)
    assert tree["child_start"].shape == (n + 2,)
    tuples = rank_tuples(tree)
    assert len(set(tuples)) == n  # no prefix twice
    for i in range(n):
        p, d, r = int(tree["parents"][i]), int(tree["depths"][i]), int(tree["ranks"][i])
        assert -1 <= p < i
        assert d == (1 if p < 0 else int(tree["depths"][p]) + 1)
        assert 1 <= d <= depth and 0 <= r < k
        assert tree["tokens"][i] == ids[d - 1, r]
        parent_q = 0.0 if p < 0 else float(tree["logq"][p])
        assert math.isclose(
            float(tree["logq"][i]), parent_q + float(logp[d - 1, r]), rel_tol=1e-5, abs_tol=1e-5
        )
    assert tree["max_depth"] == (int(tree["depths"].max()) if n else 0)
    # Child map: position 0 = root, i+1 = node i; children in increasing node order.
    cs, cl = tree["child_start"], tree["child_list"]
    assert cs[0] == 0 and cs[-1] == n
    for pos in range(n + 1):
        kids = [int(c) for c in cl[cs[pos] : cs[pos + 1]]]
        assert kids == [i for i in range(n) if tree["parents"][i] == pos - 1]


def top_values(values: list[float], n: int) -> np.ndarray:
    return np.sort(np.array(values, dtype=np.float64))[::-1][:n]


@SETTINGS
@given(tables(brute=True), st.integers(1, 40))
def test_best_prefixes_without_chain_seed(table: Table, budget: int) -> None:
    ids, logp = table
    tree = _core.build_tree(ids, logp, budget, chain_seed=False)
    check_structure(tree, ids, logp, budget)
    assert tree["n_chain"] == 0
    n = len(tree["tokens"])
    best = top_values(list(all_prefixes(logp).values()), n)
    got = np.sort(tree["logq"].astype(np.float64))[::-1]
    np.testing.assert_allclose(got, best, rtol=1e-6, atol=1e-6)
    # Pop order: logq non-increasing (a child is never better than its parent here: logp <= 0).
    assert all(np.diff(tree["logq"]) <= 1e-6)


@SETTINGS
@given(tables(brute=True), st.integers(1, 40))
def test_chain_seed_then_best_first(table: Table, budget: int) -> None:
    ids, logp = table
    depth, k = ids.shape
    tree = _core.build_tree(ids, logp, budget)  # chain_seed defaults to True
    check_structure(tree, ids, logp, budget)
    n = len(tree["tokens"])
    n_chain = min(depth, budget)
    assert tree["n_chain"] == n_chain
    assert list(tree["parents"][:n_chain]) == list(range(-1, n_chain - 1))
    assert list(tree["ranks"][:n_chain]) == [0] * n_chain
    assert list(tree["tokens"][:n_chain]) == list(ids[:n_chain, 0])
    # The rest: the best prefixes outside the chain.
    prefixes = all_prefixes(logp)
    chain = {(0,) * d for d in range(1, n_chain + 1)}
    rest = [q for t, q in prefixes.items() if t not in chain]
    got = np.sort(tree["logq"][n_chain:].astype(np.float64))[::-1]
    np.testing.assert_allclose(got, top_values(rest, n - n_chain), rtol=1e-6, atol=1e-6)
    # Expected acceptance: at least the chain's, at most the unseeded optimum's.
    mass = float(np.exp(tree["logq"].astype(np.float64)).sum())
    chain_mass = float(np.exp(tree["logq"][:n_chain].astype(np.float64)).sum())
    best = _core.build_tree(ids, logp, budget, chain_seed=False)
    assert chain_mass <= mass + 1e-9
    assert mass <= float(np.exp(best["logq"].astype(np.float64)).sum()) + 1e-6


@SETTINGS
@given(tables(), st.integers(1, 40), st.booleans())
def test_structure_larger_tables(table: Table, budget: int, chain_seed: bool) -> None:
    ids, logp = table
    tree = _core.build_tree(ids, logp, budget, chain_seed=chain_seed)
    check_structure(tree, ids, logp, budget)
    again = _core.build_tree(ids, logp, budget, chain_seed=chain_seed)
    for key in ("tokens", "parents", "ranks"):  # deterministic
        np.testing.assert_array_equal(tree[key], again[key])


def ref_walk(tree: Tree, choices: list[int]) -> tuple[list[int], int]:
    pos = 0
    path: list[int] = []
    while True:
        y = choices[pos]
        kids = [
            i for i in range(len(tree["tokens"])) if tree["parents"][i] == pos - 1 and tree["tokens"][i] == y
        ]
        if not kids:
            return path, y
        path.append(kids[0])
        pos = kids[0] + 1


@SETTINGS
@given(tables(), st.integers(1, 40), st.booleans(), st.data())
def test_walk(table: Table, budget: int, chain_seed: bool, data: st.DataObject) -> None:
    ids, logp = table
    tree = _core.build_tree(ids, logp, budget, chain_seed=chain_seed)
    n = len(tree["tokens"])
    vocab = sorted({int(t) for t in ids.flat} | {1000, 1001})
    choices = data.draw(st.lists(st.sampled_from(vocab), min_size=n + 1, max_size=n + 1))
    path, nxt = _core.walk_tree(tree, np.array(choices, dtype=np.int32))
    assert (path, nxt) == ref_walk(tree, choices)
    assert _core.walk_tree(tree["tokens"], tree["parents"], choices) == (path, nxt)
    # A choice table that spells a root-to-node path accepts the whole path.
    target = data.draw(st.integers(0, n - 1))
    want = [target]
    while tree["parents"][want[-1]] >= 0:
        want.append(int(tree["parents"][want[-1]]))
    want.reverse()
    spelled = list(choices)
    spelled[0] = int(tree["tokens"][want[0]])
    for a, b in itertools.pairwise(want):
        spelled[a + 1] = int(tree["tokens"][b])
    stop = 1000  # not a candidate token: the walk stops at the target node
    spelled[target + 1] = stop
    assert _core.walk_tree(tree, spelled) == (want, stop)


@pytest.mark.parametrize("chain_seed", [True, False])
def test_every_budget_up_to_4096(chain_seed: bool) -> None:
    rng = np.random.default_rng(0)
    depth, k = 15, 8
    ids = np.stack([rng.choice(150000, size=k, replace=False) for _ in range(depth)]).astype(np.int32)
    logits = rng.normal(scale=3.0, size=(depth, 64))
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    logp = (-np.sort(-logp, axis=1)[:, :k]).astype(np.float32)
    for budget in [*range(1, 300), 511, 512, 1000, 2048, 4095, 4096]:
        tree = _core.build_tree(ids, logp, budget, chain_seed=chain_seed)
        n = len(tree["tokens"])
        assert n == budget
        assert all(tree["parents"][i] < i for i in range(n))
        if chain_seed:
            assert tree["n_chain"] == min(depth, budget)
    check_structure(tree, ids, logp, 4096)


def test_budget_larger_than_the_tree() -> None:
    ids = np.array([[3], [4], [5]], dtype=np.int32)
    logp = np.zeros((3, 1), dtype=np.float32)
    for chain_seed in (True, False):
        tree = _core.build_tree(ids, logp, 22, chain_seed=chain_seed)
        assert list(tree["tokens"]) == [3, 4, 5] and list(tree["parents"]) == [-1, 0, 1]
        assert _core.walk_tree(tree, [3, 4, 5, 9]) == ([0, 1, 2], 9)
        assert _core.walk_tree(tree, [7, 4, 5, 9]) == ([], 7)


def good_table() -> Table:
    return np.array([[1, 2], [3, 4]], dtype=np.int32), np.log(
        np.array([[0.6, 0.4], [0.7, 0.2]], dtype=np.float32)
    )


@pytest.mark.parametrize(
    ("ids", "logp", "budget", "match"),
    [
        (np.zeros((0, 2), np.int32), np.zeros((0, 2), np.float32), 4, "number of depths"),
        (np.zeros((2, 0), np.int32), np.zeros((2, 0), np.float32), 4, "top_k"),
        (np.zeros(4, np.int32), np.zeros(4, np.float32), 4, "2-D"),
        (good_table()[0], good_table()[1][:1], 4, "differ in shape"),
        (good_table()[0], good_table()[1][:, ::-1].copy(), 4, "not sorted"),
        (good_table()[0], np.array([[-0.1, np.nan], [-0.1, -0.2]], np.float32), 4, "NaN"),
        (good_table()[0], np.array([[np.inf, -0.1], [-0.1, -0.2]], np.float32), 4, r"\+inf"),
        (np.array([[1, -2], [3, 4]], np.int32), good_table()[1], 4, "negative token"),
        (np.array([[1, 1], [3, 4]], np.int32), good_table()[1], 4, "twice"),
        (good_table()[0], good_table()[1], 0, "budget"),
        (good_table()[0], good_table()[1], -3, "budget"),
        (good_table()[0], good_table()[1], 10**6, "budget"),
    ],
)
def test_bad_build_arguments(ids: np.ndarray, logp: np.ndarray, budget: int, match: str) -> None:
    with pytest.raises(_core.InvalidParameterError, match=match):
        _core.build_tree(ids, logp, budget)


def test_bad_walk_arguments() -> None:
    ids, logp = good_table()
    tree = _core.build_tree(ids, logp, 3)
    n = len(tree["tokens"])
    with pytest.raises(_core.InvalidParameterError, match="one choice per position"):
        _core.walk_tree(tree, [1] * n)
    with pytest.raises(_core.InvalidParameterError, match="one choice per position"):
        _core.walk_tree(tree, [1] * (n + 2))
    with pytest.raises(_core.InvalidParameterError, match="parent"):
        _core.walk_tree([1, 2], [-1, 1], [0, 0, 0])  # a node its own parent
    with pytest.raises(_core.InvalidParameterError, match="parent"):
        _core.walk_tree([1, 2], [-1, -2], [0, 0, 0])
    with pytest.raises(_core.InvalidParameterError, match="differ in length"):
        _core.walk_tree([1, 2], [-1], [0, 0, 0])
    assert _core.walk_tree([], [], [7]) == ([], 7)  # an empty tree: the root's choice is the anchor
