"""tools/train_pair at tiny sizes on the CPU: delta-rule forms, the dflash-vs-PyTorch logits oracle,
drafter masking and export through convert-draft, the corpus tokenisers, and one end-to-end run.

Tests that need PyTorch skip when it is missing, unless DFLASH_REQUIRE_TORCH=1 (then they fail),
so CI with torch installed cannot silently skip the oracle.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT / "convert", ROOT / "tools", ROOT):  # the source tree wins over an installed copy
    sys.path.insert(0, str(p))


def _torch() -> ModuleType:
    try:
        import torch
    except ImportError:
        if os.environ.get("DFLASH_REQUIRE_TORCH") == "1":
            pytest.fail("DFLASH_REQUIRE_TORCH=1 but torch is not installed (pip install torch, CPU build)")
        pytest.skip(
            "torch is not installed (pip install torch); DFLASH_REQUIRE_TORCH=1 turns this into a failure"
        )
    torch.set_num_threads(1)  # small ops on shared cores: threads only contend
    return torch


def _tiny_cfg(**kw: Any) -> Any:
    from dflash.synth.qwen35 import Qwen35Config

    base: dict[str, Any] = dict(
        name="pair-test",
        hidden=64,
        n_layer=4,
        n_ff=128,
        n_head=4,
        n_head_kv=2,
        head_dim=32,
        rope_dim=16,
        full_attention_interval=2,
        n_v_heads=4,
        n_k_heads=2,
        ssm_state=16,
        n_vocab=4096,
    )
    return Qwen35Config(**{**base, **kw})


def _randomise(model: Any, seed: int) -> Any:
    """Weights far from the training init, so that every convention (norm +1, ssm_a, head order) matters."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 3 - 2)
            elif name.endswith("mixer.conv"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith("mixer.norm.weight"):  # plain gain
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:  # norm offsets and dt_bias
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("embed.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return model


# --- delta rule ----------------------------------------------------------------------------


@pytest.mark.parametrize("t,chunk", [(1, 64), (63, 16), (150, 64)])
def test_chunked_equals_recurrent(t: int, chunk: int) -> None:
    torch = _torch()
    from train_pair.delta_rule import chunk_gated_delta_rule, recurrent_gated_delta_rule

    g = torch.Generator().manual_seed(t)
    b, h, dk, dv = 2, 3, 16, 24

    def rnd(*s: int) -> Any:
        return torch.randn(*s, generator=g, dtype=torch.float64)

    q = torch.nn.functional.normalize(rnd(b, h, t, dk), dim=-1).requires_grad_()
    k = torch.nn.functional.normalize(rnd(b, h, t, dk), dim=-1).requires_grad_()
    v = rnd(b, h, t, dv).requires_grad_()
    gate = (-3 * torch.rand(b, h, t, generator=g, dtype=torch.float64)).requires_grad_()
    beta = torch.rand(b, h, t, generator=g, dtype=torch.float64).requires_grad_()
    s0 = rnd(b, h, dk, dv)
    o1, s1 = recurrent_gated_delta_rule(q, k, v, gate, beta, s0)
    o2, s2 = chunk_gated_delta_rule(q, k, v, gate, beta, s0, chunk=chunk)
    assert (o1 - o2).abs().max().item() < 1e-12 and (s1 - s2).abs().max().item() < 1e-12
    w = rnd(*o1.shape)
    inputs = (q, k, v, gate, beta)
    g1 = torch.autograd.grad((o1 * w).sum() + s1.sum(), inputs)
    g2 = torch.autograd.grad((o2 * w).sum() + s2.sum(), inputs)
    for a, c in zip(g1, g2, strict=True):
        assert (a - c).abs().max().item() < 1e-10


def test_decode_cache_matches_full_forward() -> None:
    torch = _torch()
    from train_pair.model import DecodeCache, Qwen35

    cfg = _tiny_cfg()
    m = _randomise(Qwen35(cfg, cfg.n_vocab), 1).double().eval()
    tokens = torch.randint(0, 4000, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full, _ = m(tokens)
        cache = DecodeCache(cfg.n_layer, max_len=40)
        parts = [m(tokens[:, :25], cache)[0]] + [m(tokens[:, i : i + 1], cache)[0] for i in range(25, 40)]
    assert (torch.cat(parts, 1) - full).abs().max().item() < 1e-9


# --- the oracle: dflash logits == PyTorch ------------------------------------------------------


@pytest.mark.parametrize("tied", [False, True])
def test_dflash_logits_match_pytorch(tmp_path: Path, tied: bool) -> None:
    """Tolerance: max |dflash - torch(float64)| <= 1e-4 * (1 + max |logit|) with f32 weights and f32 KV
    (measured about 4e-6 relative: ggml's f32 rounding alone); greedy tokens agree everywhere."""
    torch = _torch()
    from train_pair.export import export_target
    from train_pair.model import Qwen35
    from train_pair.oracle import compare

    from dflash import _core

    cfg = _tiny_cfg(tied_embeddings=tied)
    m = _randomise(Qwen35(cfg, cfg.n_vocab), 2)
    path = export_target(m, tmp_path / "t.gguf", "f32")
    tokens = np.random.default_rng(3).integers(0, 4088, 150).tolist()  # > 2 delta-rule chunks
    r = compare(m, path, tokens)
    print(f"oracle: max abs diff {r.max_abs_diff:.3g}, max |logit| {r.max_abs_logit:.3g}, rel {r.rel:.3g}")
    assert r.max_abs_logit > 5  # the logits are not trivially small
    assert r.rel <= 1e-4 and r.argmax_agree == 1.0

    # captured layer outputs (the drafter's features) agree too
    ec = _core.EngineConfig()
    ec.n_ctx, ec.n_threads, ec.n_batch, ec.n_logits_batch, ec.k_type, ec.v_type = (
        256,
        2,
        256,
        256,
        "f32",
        "f32",
    )
    _, _, caps = _core.TargetEngine(str(path), ec).forward(tokens, True, list(range(cfg.n_layer)))
    with torch.no_grad():
        _, hidden = m.double()(torch.tensor([tokens]), return_hidden=True)
    for il, cap in enumerate(caps):
        ref = hidden[il][0].numpy()
        assert np.abs(np.asarray(cap) - ref).max() <= 1e-4 * (1 + np.abs(ref).max()), il


def test_q8_0_export_loads(tmp_path: Path) -> None:
    _torch()
    from train_pair.export import export_target, target_weights
    from train_pair.model import Qwen35

    cfg = _tiny_cfg()
    m = _randomise(Qwen35(cfg, cfg.n_vocab), 4)
    path = export_target(m, tmp_path / "t.gguf", "q8_0")
    r = GGUFReader(path)
    types = {t.name: t.tensor_type for t in r.tensors}
    assert types["blk.0.attn_qkv.weight"] == GGMLQuantizationType.Q8_0
    assert types["blk.0.ssm_conv1d.weight"] == GGMLQuantizationType.F32
    a = next(t for t in r.tensors if t.name == "blk.0.ssm_a")
    np.testing.assert_allclose(np.asarray(a.data), target_weights(m)["blk.0.ssm_a"])
    assert (np.asarray(a.data) < 0).all()
    norm = next(t for t in r.tensors if t.name == "blk.1.attn_q_norm.weight")
    np.testing.assert_allclose(np.asarray(norm.data), m.layers[1].mixer.q_norm.weight.detach().numpy() + 1)


def test_gguf_import_inverts_export(tmp_path: Path) -> None:
    _torch()
    from train_pair.export import export_target, target_weights
    from train_pair.gguf_import import load_target_gguf
    from train_pair.model import Qwen35

    cfg = _tiny_cfg()
    m = _randomise(Qwen35(cfg, cfg.n_vocab), 6)
    want = target_weights(m)
    for wt, tol in (("f32", 1e-6), ("q8_0", 0.02)):  # f32: only the +-1 and exp/log rounding
        back = load_target_gguf(export_target(m, tmp_path / f"t-{wt}.gguf", wt))
        assert back.cfg == cfg
        got = target_weights(back)
        assert max(float(np.abs(got[k] - want[k]).max()) for k in want) <= tol, wt


# --- drafter -------------------------------------------------------------------------------------


def _drafter(**kw: Any) -> Any:
    _torch()
    from train_pair.drafter import Drafter, DrafterConfig

    base: dict[str, Any] = dict(
        hidden=64,
        num_target_layers=4,
        vocab=4096,
        mask_token_id=4091,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        ffn=96,
        target_layer_ids=(1, 2),
    )
    d = Drafter(DrafterConfig(**{**base, **kw}))
    return _randomise(d, 5).double().eval()


def test_spread_layer_ids() -> None:
    _torch()
    from train_pair.drafter import spread_layer_ids

    assert spread_layer_ids(64) == [1, 16, 31, 46, 61]  # Qwen3.6-27B-DFlash
    assert spread_layer_ids(8) == [1, 2, 3, 4, 5]
    assert spread_layer_ids(4) == [2]


def test_packed_blocks_equal_single_blocks() -> None:
    """Many anchors in one forward give each block what it gets alone: blocks do not see each other
    nor context at or after their anchor."""
    torch = _torch()
    d = _drafter()
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(2, 50, 128, generator=g, dtype=torch.float64)
    anchors = torch.tensor([[3, 20, 33], [30, 5, 12]])
    emb = torch.randn(2, 3 * 16, 64, generator=g, dtype=torch.float64)
    with torch.no_grad():
        packed = d(feats, anchors, emb)
        for i in range(3):
            for row in range(2):
                a = anchors[row : row + 1, i : i + 1]
                blk = slice(16 * i, 16 * (i + 1))
                # alone, with the context cut at the anchor: the packed forward masked exactly that
                alone = d(feats[row : row + 1, : int(a)], a, emb[row : row + 1, blk])
                assert (alone - packed[row : row + 1, blk]).abs().max() < 1e-10


def test_block_causality() -> None:
    torch = _torch()
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(1, 20, 128, generator=g, dtype=torch.float64)
    anchors = torch.tensor([[10]])
    emb = torch.randn(1, 16, 64, generator=g, dtype=torch.float64)
    emb2 = emb.clone()
    emb2[0, 9] += 1.0  # change slot 9
    for is_causal, earlier_changes in (
        (True, False),
        (None, True),
    ):  # None: sliding causal, full bidirectional
        d = _drafter(is_causal=is_causal)
        with torch.no_grad():
            diff = (d(feats, anchors, emb) - d(feats, anchors, emb2)).abs().amax(-1)[0]
        assert (diff[:9].max() > 1e-6) == earlier_changes
        assert diff[9:].min() > 1e-6


def test_drafter_export_through_convert_draft(tmp_path: Path) -> None:
    torch = _torch()
    from train_pair.export import convert_drafter, drafter_state, export_drafter_dir, export_target
    from train_pair.model import Qwen35

    cfg = _tiny_cfg()
    target = export_target(Qwen35(cfg, cfg.n_vocab), tmp_path / "t.gguf", "f32")
    d = _drafter().float()
    ddir = export_drafter_dir(d, tmp_path / "drafter")
    conf = json.loads((ddir / "config.json").read_text())
    assert conf["block_size"] == 16 and conf["dflash_config"] == {
        "mask_token_id": 4091,
        "target_layer_ids": [1, 2],
    }
    assert conf["layer_types"] == ["sliding_attention", "full_attention"] and conf["num_target_layers"] == 4
    out = convert_drafter(ddir, tmp_path / "d.gguf", "f32", target)
    r = GGUFReader(out)
    kv = {k: f.contents() for k, f in r.fields.items()}
    assert kv["general.architecture"] == "dflash"
    assert kv["dflash.block_size"] == 16
    assert kv["dflash.target_layers"] == [2, 3]  # upstream reads the input of layer id + 1
    assert kv["dflash.attention.causal_layers"] == [True, False]
    assert kv["dflash.attention.sliding_window"] == 2048
    assert kv["tokenizer.ggml.mask_token_id"] == 4091
    assert len(kv["tokenizer.ggml.tokens"]) == 4096  # copied from the target
    tensors = {t.name: t for t in r.tensors}
    assert "token_embd.weight" not in tensors and len(tensors) == 3 + 11 * 2
    state = drafter_state(d)
    np.testing.assert_array_equal(
        np.asarray(tensors["fc.weight"].data), state["fc.weight"].float().numpy()
    )  # bf16 values survive exactly
    np.testing.assert_array_equal(
        np.asarray(tensors["blk.1.attn_k_norm.weight"].data),
        state["layers.1.self_attn.k_norm.weight"].float().numpy(),
    )
    assert torch.equal(state["norm.weight"], d.norm.weight.detach().to(torch.bfloat16))


# --- corpus ----------------------------------------------------------------------------------------


def test_corpus_tokenizers_agree_and_split_is_stable(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from train_pair import corpus

    docs, _ = corpus.collect(max_files=8)
    texts = [d.text[:20000] for d in docs] + ["naïve café — 東京 🙂 <|im_end|> x = [1, 2]\r\n\ttab"]
    core = corpus.core_encoder()(texts)
    assert core == corpus.tokenizers_encoder()(texts)
    assert corpus.decode(core[-1]) == texts[-1]
    assert corpus.is_heldout("csv.py", 20) and not corpus.is_heldout("abc.py", 20)
    m = corpus.build(tmp_path, "tokenizers", heldout_permille=300, max_files=8)
    files: list[dict[str, Any]] = m["files"]  # type: ignore[assignment]
    assert [f["path"] for f in files] == sorted(f["path"] for f in files)
    train = np.load(tmp_path / "train.npy")
    assert train.dtype == np.uint16 and train.size == sum(
        f["tokens"] + 1 for f in files if f["split"] == "train"
    )


# --- one command, end to end -------------------------------------------------------------------


def test_pipeline_end_to_end(tmp_path: Path) -> None:
    _torch()
    from train_pair.train import main

    out = tmp_path / "run"
    argv = f"--out {out} --preset tiny --target-steps 6 --drafter-steps 6 --regen-seqs 4 --max-files 12 "
    argv += "--heldout-permille 400 --tokenizer tokenizers --set eval_every=0.5"
    assert main(argv.split()) == 0
    s = json.loads((out / "export" / "summary.json").read_text())
    assert s["target"]["steps"] == 6 and s["drafter"]["steps"] == 6
    assert 1.0 <= s["acceptance"]["heldout"]["mean"] <= 16.0
    for f in ("target-q8_0.gguf", "drafter-q8_0.gguf", "drafter/config.json", "MODEL_CARD.md"):
        assert (out / "export" / f).is_file(), f
    assert GGUFReader(out / "export" / "drafter-q8_0.gguf").fields["dflash.block_size"].contents() == 16
    # resuming a finished run redoes nothing
    assert main([*argv.split(), "--resume"]) == 0
    # the export installs as package data and runs through `dflash bench --pair`, lossless
    from train_pair.install import install

    from dflash import bench_pair

    install(out / "export", tmp_path / "pair", n_code=2, n_prose=1)
    bench = ["--pair", str(tmp_path / "pair"), "-n", "16", "--budgets", "4", "--no-upstream-spec"]
    assert bench_pair.main([*bench, "-ngl", "0", "-t", "1", "-o", str(tmp_path / "b.json")]) == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["prompts"]["kinds"] == {"code": 2, "prose": 1}
    assert all(m["identical_to_ours_ar"] for m in doc["modes"] if m["mode"].startswith("ours"))
