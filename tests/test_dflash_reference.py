"""The DFlash draft forward (dflash._core.DraftEngine) against two references, on the CPU:

1. A numpy float64 implementation of the DFlash equations (docs: REFERENCE.md section 2), written
   from the equations, reading the same GGUF weights with gguf.GGUFReader and the target features
   captured by _core.TargetEngine.forward. Both block-attention modes: per-layer (sliding layers
   causal inside the block, full layers bidirectional) and all-bidirectional, with a sliding window
   smaller than the context (and than the block), so the window changes the result.
   Tolerance: f32 weights and an f32 draft KV cache, so the engine differs from float64 numpy only
   by f32 rounding in another summation order (blocked matmuls, online softmax in flash attention,
   ggml's vectorised exp/silu). Measured: max |diff| <= 8e-6 with |logits| <= 17 (5e-7 relative);
   we allow 2e-5 * (1 + max |ref|) (~45x margin). With the default f16 draft KV cache, K and V are
   rounded to f16 (2^-11 relative per element): measured 1.5e-2 (9e-4 relative); we allow
   3e-3 * (1 + max |ref|).
2. Upstream llama.cpp's own dflash graph driven through libllama (_core.UpstreamDraft: a draft
   context paired with the target context through ctx_other, features from the target's layer-input
   extraction, injected by an embedding batch), in the all-bidirectional mode upstream implements,
   with a sliding window smaller than the context. Same ggml kernels and the same f16 KV cache
   (upstream casts an f32 cache to f16 for flash attention anyway): measured bit-identical logits
   and features; we allow 1e-5 * (1 + max |ref|).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader

from dflash import _core

try:
    import dflash_convert  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "convert"))

from dflash_convert import convert_draft  # noqa: E402
from dflash_convert.synthetic import FULL, SLIDING, write_synthetic_drafter  # noqa: E402

F64 = np.float64
MakeDrafter = Callable[..., Path]

# The synthetic targets (conftest.synth_model): hidden size and trunk layers.
TARGETS = {"tiny-a": (64, 4), "tiny-b": (128, 8)}
MASK_TOKEN = 4091  # <|mask|> of the committed 4096-token vocabulary


@pytest.fixture(scope="module")
def make_drafter(tmp_path_factory: pytest.TempPathFactory) -> MakeDrafter:
    """Writes a synthetic z-lab drafter and converts it (f32) against the target; cached per arguments."""
    root = tmp_path_factory.mktemp("drafters")
    cache: dict[str, Path] = {}

    def make(target: Path, n_target_layers: int, seed: int = 0, **fields: Any) -> Path:
        key = f"{target.name}-{seed}-{sorted(fields.items())}"
        if key not in cache:
            d = root / f"d{len(cache)}"
            write_synthetic_drafter(
                d,
                seed=seed,
                vocab=4096,
                mask_token_id=MASK_TOKEN,
                num_target_layers=n_target_layers,
                **fields,
            )
            cache[key] = convert_draft(d, root / f"d{len(cache)}.gguf", outtype="f32", target=target)
        return cache[key]

    return make


# ---------------------------------------------------------------------------------------------
# numpy reference


@dataclass
class RefDrafter:
    t: dict[str, np.ndarray]  # drafter tensors, numpy layout ([out, in] for matrices), float64
    embd: np.ndarray  # target token embedding [vocab, E]
    head: np.ndarray  # target LM head [vocab, E]
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    eps: float
    theta: float
    window: int
    sliding: list[bool]
    causal: list[bool]


def _field(r: GGUFReader, key: str) -> Any:
    return r.fields[key].contents()


def load_reference(draft: Path, target: Path) -> RefDrafter:
    r = GGUFReader(draft)
    tr = GGUFReader(target)
    t = {x.name: np.asarray(x.data, dtype=F64) for x in r.tensors}
    tt = {x.name: np.asarray(x.data, dtype=F64) for x in tr.tensors}
    n_layer = int(_field(r, "dflash.block_count"))
    window = (
        int(_field(r, "dflash.attention.sliding_window"))
        if "dflash.attention.sliding_window" in r.fields
        else 0
    )
    sliding = (
        [bool(v) for v in _field(r, "dflash.attention.sliding_window_pattern")]
        if window
        else [False] * n_layer
    )
    return RefDrafter(
        t=t,
        embd=tt["token_embd.weight"],
        head=tt.get("output.weight", tt["token_embd.weight"]),  # tiny-a ties the LM head to the embedding
        n_layer=n_layer,
        n_head=int(_field(r, "dflash.attention.head_count")),
        n_head_kv=int(_field(r, "dflash.attention.head_count_kv")),
        head_dim=int(_field(r, "dflash.attention.key_length")),
        eps=float(_field(r, "dflash.attention.layer_norm_rms_epsilon")),
        theta=float(_field(r, "dflash.rope.freq_base")),
        window=window,
        sliding=sliding,
        causal=[bool(v) for v in _field(r, "dflash.attention.causal_layers")],
    )


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_neox(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """x [n, heads, d]: rotate pairs (i, i + d/2) by pos * theta^(-2i/d)."""
    half = x.shape[-1] // 2
    ang = pos[:, None].astype(F64) * theta ** (-np.arange(half, dtype=F64) * 2.0 / x.shape[-1])
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def reference_draft(
    m: RefDrafter, feats: np.ndarray, anchor: int, block: int, all_bidirectional: bool
) -> np.ndarray:
    """Logits of slots 1..B-1 for the block [anchor, MASK x (B-1)] right after `feats` (one row per
    context position 0..n-1, the target layers' outputs concatenated)."""
    t, hd, eps = m.t, m.head_dim, m.eps
    n_ctx = feats.shape[0]
    h_ctx = rms_norm(feats.astype(F64) @ t["fc.weight"].T, t["enc.output_norm.weight"], eps)
    ctx_pos = np.arange(n_ctx)
    blk_pos = n_ctx + np.arange(block)
    key_pos = np.concatenate([ctx_pos, blk_pos])
    x = m.embd[[anchor] + [MASK_TOKEN] * (block - 1)]
    group = m.n_head // m.n_head_kv

    def kv(b: str, h: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = (h @ t[b + "attn_k.weight"].T).reshape(len(h), m.n_head_kv, hd)
        k = rope_neox(rms_norm(k, t[b + "attn_k_norm.weight"], eps), pos, m.theta)
        v = (h @ t[b + "attn_v.weight"].T).reshape(len(h), m.n_head_kv, hd)
        return k, v

    for il in range(m.n_layer):
        b = f"blk.{il}."
        causal = m.causal[il] and not all_bidirectional
        # Which keys each block query sees: the context (all of it, or the window for sliding layers)
        # and the block (all of it, or itself and earlier slots when causal).
        q_pos = blk_pos[:, None]
        visible = np.ones((block, len(key_pos)), dtype=bool)
        if causal:
            visible[:, n_ctx:] &= key_pos[None, n_ctx:] <= q_pos
        if m.sliding[il]:
            visible &= q_pos - key_pos[None, :] < m.window

        h = rms_norm(x, t[b + "attn_norm.weight"], eps)
        q = (h @ t[b + "attn_q.weight"].T).reshape(block, m.n_head, hd)
        q = rope_neox(rms_norm(q, t[b + "attn_q_norm.weight"], eps), blk_pos, m.theta)
        kc, vc = kv(b, h_ctx, ctx_pos)  # context rows: only K/V, from the injected features
        kb, vb = kv(b, h, blk_pos)
        k, v = np.concatenate([kc, kb]), np.concatenate([vc, vb])
        out = np.empty((block, m.n_head, hd))
        for head in range(m.n_head):
            s = q[:, head] @ k[:, head // group].T / np.sqrt(hd)
            s = np.where(visible, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, head] = (p / p.sum(axis=1, keepdims=True)) @ v[:, head // group]
        x = x + out.reshape(block, -1) @ t[b + "attn_output.weight"].T
        h = rms_norm(x, t[b + "ffn_norm.weight"], eps)
        gate, up = h @ t[b + "ffn_gate.weight"].T, h @ t[b + "ffn_up.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ t[b + "ffn_down.weight"].T
    x = rms_norm(x, t["output_norm.weight"], eps)
    return x[1:] @ m.head.T


# ---------------------------------------------------------------------------------------------
# helpers


def target_engine(path: Path, n_ctx: int = 256) -> _core.TargetEngine:
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_gpu_layers, cfg.n_threads = n_ctx, 0, 1  # 1 thread: no spin barriers on a busy CI box
    return _core.TargetEngine(str(path), cfg)


def draft_engine(
    path: Path, target: _core.TargetEngine, kv: str = "f32", bidir: bool = False, **cfg_fields: Any
) -> _core.DraftEngine:
    cfg = _core.DraftEngineConfig()
    cfg.kv_type, cfg.all_bidirectional = kv, bidir
    for k, v in cfg_fields.items():
        setattr(cfg, k, v)
    return _core.DraftEngine(str(path), target, cfg)


def features(target: _core.TargetEngine, tokens: list[int], layers: list[int]) -> np.ndarray:
    """Target features for `tokens` (from an empty target), rows = positions."""
    target.reset()
    _, _, caps = target.forward(tokens, True, layers)
    return np.concatenate(caps, axis=1)


def assert_close(ours: np.ndarray, ref: np.ndarray, tol: float) -> float:
    assert ours.shape == ref.shape
    assert np.isfinite(ours).all() and np.isfinite(ref).all()
    err = float(np.abs(ours - ref).max())
    bound = tol * (1.0 + float(np.abs(ref).max()))
    assert err <= bound, f"max abs diff {err:.3g} > {bound:.3g}"
    return err


SWA_DRAFTER = dict(
    n_layers=3,
    n_heads=4,
    n_kv_heads=2,
    head_dim=32,
    ffn=96,
    block_size=16,
    layer_types=(SLIDING, FULL, SLIDING),
    sliding_window=12,  # < the context and < the block: the window cuts both
)


# ---------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("preset", sorted(TARGETS))
@pytest.mark.parametrize("bidir", [False, True], ids=["per-layer-causal", "all-bidirectional"])
def test_draft_logits_match_numpy(
    synth_model: Any, make_drafter: MakeDrafter, preset: str, bidir: bool
) -> None:
    hidden, n_layer = TARGETS[preset]
    tpath = synth_model(preset, "f32")
    dpath = make_drafter(
        tpath, n_layer, hidden=hidden, target_layer_ids=(0, n_layer // 2, n_layer - 1), **SWA_DRAFTER
    )
    target = target_engine(tpath)
    draft = draft_engine(dpath, target, bidir=bidir)
    hp = draft.hparams
    assert hp["causal"] == [True, False, True] and hp["is_sliding"] == [True, False, True]
    tokens = np.random.default_rng(3).integers(0, 4000, size=40).tolist()
    feats = features(target, tokens, hp["target_layers"])
    draft.inject(feats, 0)
    out = draft.draft(1234, len(tokens), True)
    ref = reference_draft(load_reference(dpath, tpath), feats, 1234, hp["block_size"], bidir)
    err = assert_close(out["logits"], ref, 2e-5)
    print(f"{preset} bidir={bidir}: max |diff| {err:.3g}, max |logit| {np.abs(ref).max():.3g}")
    assert out["argmax"] == np.argmax(out["logits"], axis=1).tolist()


def test_window_and_causality_matter(synth_model: Any, make_drafter: MakeDrafter) -> None:
    """The two modes and a wider window give different logits: the reference test above is not vacuous."""
    tpath = synth_model("tiny-a", "f32")
    dpath = make_drafter(tpath, 4, hidden=64, target_layer_ids=(0, 2), **SWA_DRAFTER)
    m = load_reference(dpath, tpath)
    target = target_engine(tpath)
    feats = features(target, list(range(100, 140)), [0, 2])
    base = reference_draft(m, feats, 7, 16, False)
    assert np.abs(base - reference_draft(m, feats, 7, 16, True)).max() > 1e-2
    m.window = 10_000
    assert np.abs(base - reference_draft(m, feats, 7, 16, False)).max() > 1e-2


def test_f16_cache_close_to_numpy(synth_model: Any, make_drafter: MakeDrafter) -> None:
    tpath = synth_model("tiny-b", "f32")
    dpath = make_drafter(tpath, 8, hidden=128, target_layer_ids=(1, 4, 6), **SWA_DRAFTER)
    target = target_engine(tpath)
    draft = draft_engine(dpath, target, kv="f16")
    feats = features(target, list(range(200, 240)), draft.hparams["target_layers"])
    draft.inject(feats, 0)
    out = draft.draft(99, 40, True)
    err = assert_close(
        out["logits"], reference_draft(load_reference(dpath, tpath), feats, 99, 16, False), 3e-3
    )
    print(f"f16 cache: max |diff| {err:.3g}")


def test_incremental_inject_truncate_and_graph_reuse(synth_model: Any, make_drafter: MakeDrafter) -> None:
    """A chain-decoding-like sequence of small injections, drafts, rollbacks and chunked prefills
    gives the same logits as the reference over the final context each time."""
    tpath = synth_model("tiny-a", "f32")
    dpath = make_drafter(tpath, 4, hidden=64, target_layer_ids=(0, 2), **SWA_DRAFTER)
    m = load_reference(dpath, tpath)
    target = target_engine(tpath)
    draft = draft_engine(dpath, target, n_batch=16)  # the 37-row prefill goes in as 16 + 16 + 5
    tokens = np.random.default_rng(5).integers(0, 4000, size=60).tolist()
    feats = features(target, tokens, [0, 2])

    def check(n_ctx: int, anchor: int) -> None:
        out = draft.draft(anchor, n_ctx, True)
        assert draft.n_ctx == n_ctx
        assert_close(out["logits"], reference_draft(m, feats[:n_ctx], anchor, 16, False), 2e-5)

    draft.inject(feats[:37], 0)
    check(37, tokens[37])
    draft.inject(feats[37:41], 37)  # 4 accepted rows
    check(41, tokens[41])
    draft.inject(feats[41:42], 41)  # 1 accepted row: same padded graph shape
    check(42, tokens[42])
    draft.truncate(39)  # roll back, then re-inject different rows than before
    draft.inject(feats[39:50], 39)
    check(50, 5)
    draft.inject(feats[50:55], 48)  # pos0 below n_ctx replaces rows 48.. (feats[50:55] sit at 48..52)
    shifted = np.concatenate([feats[:48], feats[50:55]])
    out = draft.draft(3, 53, True)
    assert_close(out["logits"], reference_draft(m, shifted, 3, 16, False), 2e-5)
    draft.reset()
    draft.inject(feats[:20], 0)
    check(20, 11)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 1.3])
def test_top_k_is_sorted_log_softmax(synth_model: Any, make_drafter: MakeDrafter, temperature: float) -> None:
    """The DDTree candidates: the top-K of each slot, best first, with the log-softmax of the
    logits at the tree temperature (the argmax and the candidates do not depend on it)."""
    tpath = synth_model("tiny-a", "f32")
    dpath = make_drafter(tpath, 4, hidden=64, target_layer_ids=(1, 2), **SWA_DRAFTER)
    target = target_engine(tpath)
    draft = draft_engine(dpath, target, top_k=5, tree_temperature=temperature)
    draft.inject(features(target, list(range(30)), [1, 2]), 0)
    out = draft.draft(42, 30, True)
    logits = out["logits"].astype(F64)
    scaled = logits / temperature
    top = scaled.max(1, keepdims=True)
    logp = scaled - top - np.log(np.exp(scaled - top).sum(1, keepdims=True))
    ids, lp = out["top_ids"], out["top_logp"]
    assert ids.shape == lp.shape == (15, 5)
    assert (np.diff(lp, axis=1) <= 0).all()
    assert (ids[:, 0] == out["argmax"]).all()
    np.testing.assert_allclose(lp, np.take_along_axis(logp, ids.astype(np.int64), 1), atol=1e-5)
    for s in range(15):
        assert set(ids[s].tolist()) == set(np.argsort(-logits[s])[:5].tolist())


def test_draft_without_context(synth_model: Any, make_drafter: MakeDrafter) -> None:
    tpath = synth_model("tiny-a", "f32")
    dpath = make_drafter(tpath, 4, hidden=64, target_layer_ids=(0, 2), **SWA_DRAFTER)
    draft = draft_engine(dpath, target_engine(tpath))
    out = draft.draft(17, 0, True)
    ref = reference_draft(load_reference(dpath, tpath), np.zeros((0, 128), np.float32), 17, 16, False)
    assert_close(out["logits"], ref, 2e-5)


def test_bad_calls_raise(synth_model: Any, make_drafter: MakeDrafter) -> None:
    tpath = synth_model("tiny-a", "f32")
    dpath = make_drafter(tpath, 4, hidden=64, target_layer_ids=(0, 2), **SWA_DRAFTER)
    target = target_engine(tpath, n_ctx=64)
    for bad in (0.0, -1.0, float("nan"), 50.0):
        with pytest.raises(_core.InvalidParameterError, match="tree_temperature"):
            draft_engine(dpath, target, tree_temperature=bad)
    draft = draft_engine(dpath, target)
    feats = np.zeros((10, 128), np.float32)
    with pytest.raises(_core.InvalidParameterError):
        draft.inject(feats, 1)  # a gap: the context holds 0 rows
    with pytest.raises(_core.InvalidParameterError):
        draft.inject(np.zeros((10, 127), np.float32), 0)
    with pytest.raises(_core.ContextOverflowError):
        draft.inject(np.zeros((65, 128), np.float32), 0)
    draft.inject(feats, 0)
    with pytest.raises(_core.InvalidParameterError):
        draft.draft(5, 9, False)  # the block would overwrite context rows
    with pytest.raises(_core.InvalidParameterError):
        draft.draft(4096, 10, False)
    with pytest.raises(_core.ContextOverflowError):
        draft.draft(5, 65, False)
    assert draft.draft(5, 10, False)["logits"] is None
    for bad in [dict(kv_type="q4_0"), dict(top_k=0), dict(top_k=5000)]:
        with pytest.raises(_core.InvalidParameterError):
            draft_engine(dpath, target, **bad)


# ---------------------------------------------------------------------------------------------
# upstream oracle


@pytest.mark.parametrize("preset", sorted(TARGETS))
def test_all_bidirectional_matches_upstream(synth_model: Any, make_drafter: MakeDrafter, preset: str) -> None:
    hidden, n_layer = TARGETS[preset]
    tpath = synth_model(preset, "f32")
    # Upstream taps the *input* of layer id + 1, which does not exist for the last layer: ids < n_layer - 1.
    dpath = make_drafter(
        tpath, n_layer, seed=2, hidden=hidden, target_layer_ids=(0, n_layer - 2), **SWA_DRAFTER
    )
    ucfg = _core.UpstreamConfig()
    ucfg.n_ctx, ucfg.n_batch, ucfg.n_gpu_layers, ucfg.n_threads = 256, 64, 0, 1
    up = _core.UpstreamDraft(str(tpath), str(dpath), ucfg)
    target = target_engine(tpath)
    draft = draft_engine(dpath, target, kv="f16", bidir=True)
    tokens = np.random.default_rng(7).integers(0, 4000, size=40).tolist()
    ref_logits, ref_feats = up.draft_logits(tokens, 321)
    feats = features(target, tokens, draft.hparams["target_layers"])
    assert_close(feats, ref_feats, 1e-5)
    draft.inject(feats, 0)
    out = draft.draft(321, len(tokens), True)
    err = assert_close(out["logits"], ref_logits, 1e-5)
    print(f"{preset}: max |ours - upstream| {err:.3g}")
    assert out["argmax"] == np.argmax(ref_logits, axis=1).tolist()


def test_target_captures_do_not_depend_on_the_previous_graph(synth_model: Any) -> None:
    """Regression: ggml reused the previous graph's allocation plan (same node count, sizes that fit)
    without looking at output flags, so the first forward capturing other layers returned
    overwritten features."""
    target = target_engine(synth_model("tiny-a", "f32"))
    tokens = list(range(300, 340))
    first = features(target, tokens, [0, 2])
    every = features(target, tokens, [0, 1, 2, 3])
    np.testing.assert_array_equal(first, np.concatenate([every[:, :64], every[:, 128:192]], axis=1))


def test_device_feature_rows_match_host_rows(synth_model: Any, make_drafter: MakeDrafter) -> None:
    """The decode loop injects the target's captured rows in place (no host copy); the drafter must
    see exactly what a host injection of the same rows gives, for consecutive rows (prefill, chain)
    and for a tree path's scattered rows, and refuse rows a later target forward overwrote."""
    tpath = synth_model("tiny-a", "f32")
    dpath = make_drafter(tpath, 4, hidden=64, target_layer_ids=(0, 2), **SWA_DRAFTER)
    target = target_engine(tpath)
    host, dev = draft_engine(dpath, target, n_batch=16), draft_engine(dpath, target, n_batch=16)
    tokens = np.random.default_rng(9).integers(0, 4000, size=40).tolist()
    feats = features(target, tokens, [0, 2])  # leaves these rows in the target's device buffer
    host.inject(feats[:37], 0)
    dev.inject_target(list(range(37)), 0)  # 37 > n_batch: chunks through the device path too
    path = [37, 39, 38]  # a path's rows, out of order, for positions 37..39
    host.inject(feats[path], 37)
    dev.inject_target(path, 37)
    a, b = host.draft(11, 40, True), dev.draft(11, 40, True)
    np.testing.assert_array_equal(a["logits"], b["logits"])

    dev.inject_target([0, 1], 40)
    target.forward(tokens[:8], True, [0, 2])  # overwrites the rows before the drafter took them
    with pytest.raises(_core.EngineError, match="overwritten"):
        dev.draft(11, 42, False)
    with pytest.raises(_core.InvalidParameterError, match="out of range"):
        dev.inject_target([10_000], 40)
    target.forward(tokens[:8], True, [1])  # other layers: the drafter's rows are not there
    with pytest.raises(_core.InvalidParameterError, match="did not capture"):
        dev.inject_target([0], 40)


def test_chain_drafts_skip_the_top_k(synth_model: Any, make_drafter: MakeDrafter) -> None:
    """Chain decoding asks only for the argmax: the same logits and argmax, no candidates."""
    tpath = synth_model("tiny-a", "f32")
    dpath = make_drafter(tpath, 4, hidden=64, target_layer_ids=(0, 2), **SWA_DRAFTER)
    target = target_engine(tpath)
    full, lean = draft_engine(dpath, target), draft_engine(dpath, target)
    feats = features(target, list(range(500, 530)), [0, 2])
    full.inject(feats, 0)
    lean.inject(feats, 0)
    a, b = full.draft(9, 30, True), lean.draft(9, 30, True, want_top_k=False)
    np.testing.assert_array_equal(a["logits"], b["logits"])
    assert a["argmax"] == b["argmax"] and b["top_ids"] is None and b["top_logp"] is None
    assert a["top_ids"].shape == (15, 8)
