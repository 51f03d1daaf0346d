"""Synthetic qwen35 GGUF writer: keys, shapes, types, block layouts, vocab consistency."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from dflash.synth import (
    PRESETS,
    WEIGHT_TYPES,
    BpeVocab,
    get_preset,
    load_vocab,
    tensor_specs,
    write_qwen35_gguf,
)
from dflash.synth.__main__ import main
from dflash.synth.quant import encode, fit_type, random_blocks
from dflash.synth.qwen35 import _nbytes, imrope_sections, storage_types
from dflash.synth.tokenizer import QWEN35_SPLIT_REGEX, SPECIAL_TOKENS, chat_template

TINY = ("tiny-a", "tiny-b", "tiny-c")


def _byte_vocab() -> BpeVocab:
    """Bytes and specials only: GGUFReader parses every token string, which dominates test time."""
    v = load_vocab()
    return BpeVocab(tokens=v.tokens[:256], merges=[], specials=v.specials)


def _field(r: gguf.GGUFReader, key: str) -> object:
    return r.fields[key].contents()


def _write(tmp_path: Path, preset: str, weight_type: str, seed: int = 0, **kw: object) -> gguf.GGUFReader:
    path = write_qwen35_gguf(
        tmp_path / f"{preset}-{weight_type}.gguf",
        get_preset(preset).config,
        seed=seed,
        weight_type=weight_type,
        **kw,
    )
    return gguf.GGUFReader(path)


@pytest.mark.parametrize("preset", TINY)
def test_keys_and_shapes(tmp_path: Path, preset: str) -> None:
    cfg = get_preset(preset).config
    r = _write(tmp_path, preset, "f32")
    a = "qwen35"
    assert _field(r, "general.architecture") == a
    assert _field(r, f"{a}.block_count") == cfg.n_layer + cfg.nextn_layers
    assert _field(r, f"{a}.embedding_length") == cfg.hidden
    assert _field(r, f"{a}.feed_forward_length") == cfg.n_ff
    assert _field(r, f"{a}.attention.head_count") == cfg.n_head
    assert _field(r, f"{a}.attention.head_count_kv") == cfg.n_head_kv
    assert _field(r, f"{a}.attention.key_length") == cfg.head_dim
    assert _field(r, f"{a}.attention.value_length") == cfg.head_dim
    assert _field(r, f"{a}.rope.dimension_count") == cfg.rope_dim
    sections = _field(r, f"{a}.rope.dimension_sections")
    assert len(sections) == 4 and 2 * sum(sections) == cfg.rope_dim
    assert _field(r, f"{a}.ssm.conv_kernel") == 4
    assert _field(r, f"{a}.ssm.state_size") == cfg.ssm_state
    assert _field(r, f"{a}.ssm.inner_size") == cfg.ssm_state * cfg.n_v_heads
    assert _field(r, f"{a}.ssm.time_step_rank") == cfg.n_v_heads
    assert _field(r, f"{a}.ssm.group_count") == cfg.n_k_heads
    assert _field(r, f"{a}.full_attention_interval") == cfg.full_attention_interval
    assert math.isclose(_field(r, f"{a}.rope.freq_base"), cfg.rope_theta)
    assert (f"{a}.nextn_predict_layers" in r.fields) == (cfg.nextn_layers > 0)

    specs = {s.name: s for s in tensor_specs(cfg, 4096)}
    tensors = {t.name: t for t in r.tensors}
    assert set(tensors) == set(specs)
    for name, t in tensors.items():
        assert tuple(int(x) for x in t.shape) == tuple(reversed(specs[name].shape)), name  # ggml ne order
    assert ("output.weight" in tensors) != cfg.tied_embeddings


def test_layer_kinds_follow_interval() -> None:
    cfg = get_preset("tiny-b").config  # interval 4: layers 3 and 7 are attention
    names = {s.name for s in tensor_specs(cfg, 4096)}
    for il in range(cfg.n_layer):
        attn = (il + 1) % 4 == 0
        assert (f"blk.{il}.attn_q.weight" in names) == attn
        assert (f"blk.{il}.ssm_a" in names) != attn


def test_gdn_and_attention_shapes() -> None:
    cfg = get_preset("tiny-b").config  # hidden 128, q 4 x 64, kv 1 x 64, gdn v 6 / k 2 x 32
    s = {t.name: t.shape for t in tensor_specs(cfg, 4096)}
    assert s["blk.0.attn_qkv.weight"] == (2 * 2 * 32 + 6 * 32, 128)
    assert s["blk.0.attn_gate.weight"] == (6 * 32, 128)
    assert s["blk.0.ssm_conv1d.weight"] == (2 * 2 * 32 + 6 * 32, 4)
    assert s["blk.0.ssm_out.weight"] == (128, 6 * 32)
    assert s["blk.0.ssm_a"] == (6,) and s["blk.0.ssm_dt.bias"] == (6,)
    assert s["blk.0.ssm_norm.weight"] == (32,)
    assert s["blk.3.attn_q.weight"] == (2 * 4 * 64, 128)  # query and gate
    assert s["blk.3.attn_k.weight"] == (64, 128)
    assert s["blk.3.attn_output.weight"] == (128, 4 * 64)


def test_mtp_block(tmp_path: Path) -> None:
    cfg = get_preset("tiny-c").config
    r = gguf.GGUFReader(write_qwen35_gguf(tmp_path / "m.gguf", cfg, weight_type="f16", vocab=_byte_vocab()))
    il = cfg.n_layer
    names = {t.name for t in r.tensors}
    for t in ("nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "attn_q", "ffn_down"):
        assert f"blk.{il}.{t}.weight" in names
    assert f"blk.{il}.ssm_a" not in names
    eh = next(t for t in r.tensors if t.name == f"blk.{il}.nextn.eh_proj.weight")
    assert [int(x) for x in eh.shape] == [2 * cfg.hidden, cfg.hidden]


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
def test_weight_types_decode(tmp_path: Path, weight_type: str) -> None:
    # tiny-c rows fit 256-blocks; 3 layers keep one of each block kind (GDN, attention, MTP)
    cfg = dataclasses.replace(get_preset("tiny-c").config, n_layer=3)
    r = gguf.GGUFReader(
        write_qwen35_gguf(tmp_path / "m.gguf", cfg, weight_type=weight_type, vocab=_byte_vocab())
    )
    want = storage_types(cfg, tensor_specs(cfg, 264), weight_type)
    for t in r.tensors:
        assert t.tensor_type == want[t.name], t.name
        x = quants.dequantize(t.data[:256], t.tensor_type)  # first rows: enough for the statistics
        assert np.isfinite(x).all(), t.name
        if t.name.endswith("_norm.weight"):
            assert t.tensor_type == Q.F32 and abs(float(x.mean()) - 1.0) < 0.05
        elif t.name.endswith("ffn_up.weight"):
            assert abs(float(x.std()) * math.sqrt(cfg.hidden) - 1.0) < 0.1, t.name
        elif t.name.endswith("ssm_a"):
            assert (x < 0).all()


def test_fallback_for_short_rows() -> None:
    cfg = get_preset("tiny-a").config  # hidden 64: no 256-blocks fit
    types = storage_types(cfg, tensor_specs(cfg, 4096), "q4_K_M")
    assert types["blk.0.ffn_up.weight"] == Q.Q5_0
    assert types["token_embd.weight"] == Q.Q8_0  # tied: q6_K wanted
    assert types["blk.0.ssm_conv1d.weight"] == Q.F32
    assert fit_type(Q.Q8_0, 48) == Q.F16


def test_q4_k_m_mix_27b() -> None:
    cfg = PRESETS["qwen36-27b"].config
    specs = tensor_specs(cfg, cfg.n_vocab)
    types = storage_types(cfg, specs, "q4_K_M")
    assert types["output.weight"] == Q.Q6_K and types["token_embd.weight"] == Q.Q4_K
    assert types["blk.0.attn_qkv.weight"] == Q.Q6_K and types["blk.12.attn_qkv.weight"] == Q.Q4_K
    assert types["blk.0.ffn_down.weight"] == Q.Q6_K and types["blk.8.ffn_down.weight"] == Q.Q4_K
    assert types["blk.0.ssm_alpha.weight"] == Q.Q4_K and types["blk.0.ssm_a"] == Q.F32
    n_params = sum(s.n_values for s in specs)
    size = sum(_nbytes(s, types[s.name]) for s in specs)
    assert 26.8e9 < n_params < 27.0e9
    assert 15.3 < size / 2**30 < 15.5  # the measured upstream file: 15.4 GiB


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q4_0])
def test_block_layouts(qtype: Q) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 512), dtype=np.float32) * 0.02
    y = quants.dequantize(encode(x, qtype), qtype)
    tol = {Q.Q4_K: 0.12, Q.Q5_K: 0.06, Q.Q6_K: 0.03, Q.Q8_0: 0.01, Q.Q4_0: 0.12}[qtype]
    assert np.sqrt(np.mean((y - x) ** 2)) < tol * 0.02
    z = quants.dequantize(random_blocks(rng, 64, 512, qtype, 0.02), qtype)
    # q4_0 codes -8..7 carry a mean of -d/2
    assert np.isfinite(z).all() and abs(float(z.std()) - 0.02) < 0.002 and abs(float(z.mean())) < 0.003


def test_deterministic_and_seeded(tmp_path: Path) -> None:
    cfg = get_preset("tiny-a").config
    a = write_qwen35_gguf(tmp_path / "a.gguf", cfg, seed=3, weight_type="q8_0").read_bytes()
    b = write_qwen35_gguf(tmp_path / "b.gguf", cfg, seed=3, weight_type="q8_0", workers=2).read_bytes()
    c = write_qwen35_gguf(tmp_path / "c.gguf", cfg, seed=4, weight_type="q8_0").read_bytes()
    assert a == b and a != c


def test_random_blocks_mode(tmp_path: Path) -> None:
    cfg = dataclasses.replace(get_preset("tiny-c").config, n_layer=3)
    r = gguf.GGUFReader(
        write_qwen35_gguf(
            tmp_path / "m.gguf", cfg, weight_type="q4_K_M", random_blocks=True, vocab=_byte_vocab()
        )
    )
    for t in r.tensors:
        assert np.isfinite(quants.dequantize(t.data[:256], t.tensor_type)).all(), t.name


def test_padded_vocab(tmp_path: Path) -> None:
    cfg = dataclasses.replace(get_preset("tiny-a").config, n_vocab=5000)
    r = gguf.GGUFReader(write_qwen35_gguf(tmp_path / "p.gguf", cfg))
    tokens = _field(r, "tokenizer.ggml.tokens")
    assert len(tokens) == 5000 and len(set(tokens)) == 5000 and tokens[-1] == "[PAD4999]"
    assert int(r.fields["tokenizer.ggml.token_type"].contents()[-1]) == int(gguf.TokenType.UNUSED)


def test_vocab_consistency() -> None:
    v = load_vocab()
    assert v.n_vocab == 4096 and len(set(v.all_tokens)) == v.n_vocab
    byte_chars = v.tokens[:256]
    assert all(len(t) == 1 for t in byte_chars) and len(set(byte_chars)) == 256
    assert len(v.merges) == len(v.tokens) - 256
    ids = {t: i for i, t in enumerate(v.tokens)}
    for rank, m in enumerate(v.merges):
        a, b = m.split(" ")
        assert ids[a] < 256 + rank and ids[b] < 256 + rank  # parts exist before the merge
        assert v.tokens[256 + rank] == a + b  # the trainer adds merged tokens in rank order
    assert [s for s, _ in v.specials] == [s for s, _ in SPECIAL_TOKENS]
    assert all(" " not in t for t in v.tokens)  # byte-level: spaces are mapped to "Ġ"


def test_tokenizer_keys(tmp_path: Path) -> None:
    r = _write(tmp_path, "tiny-a", "f32")
    tokens = _field(r, "tokenizer.ggml.tokens")
    assert _field(r, "tokenizer.ggml.model") == "gpt2" and _field(r, "tokenizer.ggml.pre") == "qwen35"
    assert tokens[_field(r, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    assert tokens[_field(r, "tokenizer.ggml.bos_token_id")] == "<|endoftext|>"
    assert tokens[_field(r, "tokenizer.ggml.mask_token_id")] == "<|mask|>"
    types = r.fields["tokenizer.ggml.token_type"].contents()
    assert types[tokens.index("<|im_start|>")] == int(gguf.TokenType.CONTROL)
    assert types[tokens.index("<think>")] == int(gguf.TokenType.USER_DEFINED)
    assert len(_field(r, "tokenizer.ggml.merges")) == 3832
    assert _field(r, "tokenizer.chat_template") == chat_template()


def test_chat_template_renders() -> None:
    jinja2 = pytest.importorskip("jinja2")
    t = jinja2.Environment().from_string(chat_template())
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert t.render(messages=msgs, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    no_think = t.render(messages=msgs[1:], add_generation_prompt=True, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_imrope_sections() -> None:
    assert imrope_sections(64) == [11, 11, 10, 0]
    for d in (8, 16, 32, 64, 128):
        assert 2 * sum(imrope_sections(d)) == d


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "--list"]) == 0
    assert "qwen36-27b" in capsys.readouterr().out
    out = tmp_path / "x.gguf"
    assert main(f"model --preset tiny-b --type q8_0 --seed 1 --nextn 1 --out {out}".split()) == 0
    r = gguf.GGUFReader(out)
    assert _field(r, "qwen35.nextn_predict_layers") == 1 and _field(r, "qwen35.block_count") == 9


def test_upstream_tokenizer_agrees(tmp_path: Path) -> None:
    """Upstream llama.cpp's BPE (libllama's vocabulary code inside dflash._core) on our GGUF gives
    the ids the `tokenizers` library gives on the committed vocab."""
    import tokenizers as tk

    from dflash import _core

    v = load_vocab()
    ref = tk.Tokenizer(
        tk.models.BPE(
            vocab={t: i for i, t in enumerate(v.tokens)}, merges=[tuple(m.split(" ")) for m in v.merges]
        )
    )
    ref.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [
            tk.pre_tokenizers.Split(tk.Regex(QWEN35_SPLIT_REGEX), behavior="isolated"),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    ref.add_special_tokens([tk.AddedToken(s, special=True) for s, _ in v.specials])
    model = write_qwen35_gguf(tmp_path / "t.gguf", get_preset("tiny-a").config)
    texts = [
        "def main():\n    return 42\n",
        "  spaces\tand\n\n\nnewlines",
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "naïve café — 東京 🙂 I'm DON'T x = [1, 2, 3]  # 1234567",
    ]
    vocab = _core.Vocab(str(model))
    for text in texts:
        assert vocab.tokenize(text, False, True) == ref.encode(text).ids, text
