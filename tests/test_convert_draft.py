"""convert-draft: synthetic z-lab drafter -> GGUF -> GGUFReader round trips, metadata, every error path."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

try:
    import dflash_convert  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "convert"))

from dflash_convert import ConvertError, convert_draft, load_config, parse_config  # noqa: E402
from dflash_convert.cli import main as cli_main  # noqa: E402
from dflash_convert.synthetic import (  # noqa: E402
    FULL,
    PRESETS,
    SLIDING,
    SyntheticDrafter,
    _write_safetensors,
    config_dict,
    tensor_shapes,
    write_synthetic_drafter,
)
from dflash_convert.tensors import SafetensorsSource, expected_tensors, to_f32  # noqa: E402

QT = GGMLQuantizationType
pytestmark = pytest.mark.filterwarnings("ignore:no --target given")

# Small but structurally complete: GQA, a sliding and a full layer, ffn/hidden multiples of 32 (q8_0 blocks).
SPEC = SyntheticDrafter(
    hidden=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=32,
    ffn=96,
    block_size=16,
    target_layer_ids=(1, 3, 5),
    layer_types=(SLIDING, FULL),
    sliding_window=8,
    mask_token_id=250,
    vocab=256,
    num_target_layers=6,
)


def _fields(r: GGUFReader) -> dict[str, Any]:
    out = {}
    for k, f in r.fields.items():
        v = f.contents()
        out[k] = v
    return out


def write_fake_target(
    path: Path,
    *,
    hidden: int = 64,
    n_layer: int = 6,
    vocab: int = 256,
    arch: str = "qwen35",
    tokenizer: bool = True,
    ctx: int = 4096,
) -> Path:
    """The keys convert-draft reads from a qwen35 target, plus a small tokenizer (stand-in until
    dflash.synth.qwen35 exists)."""
    w = GGUFWriter(path, arch)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_block_count(n_layer)
    w.add_array(f"{arch}.rope.dimension_sections", [11, 11, 10, 0])
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen35")
        w.add_token_list([f"tok{i}" for i in range(vocab)])
        w.add_token_types([1] * vocab)
        w.add_token_merges(["t o", "to k"])
        w.add_eos_token_id(3)
        w.add_mask_token_id(7)  # must be replaced by the drafter's own mask id
        w.add_chat_template("{{ messages }}")
    w.add_tensor("token_embd.weight", np.zeros((vocab, hidden), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_drafter(tmp_path_factory.mktemp("draft") / "d", SPEC, seed=1)


def _source_f32(d: Path) -> dict[str, np.ndarray]:
    src = SafetensorsSource(d)
    out = {n: to_f32(src.read_raw(t), t.dtype).copy() for n, t in src.tensors.items()}
    src.close()
    return out


def _source_bits(d: Path) -> dict[str, np.ndarray]:
    src = SafetensorsSource(d)
    out = {n: np.array(src.read_raw(t)) for n, t in src.tensors.items()}
    src.close()
    return out


def _no_leftovers(folder: Path, out: Path) -> None:
    assert not out.exists()
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")], list(folder.iterdir())


@pytest.mark.parametrize("outtype", ["bf16", "f16", "f32", "q8_0"])
def test_round_trip(draft_dir: Path, tmp_path: Path, outtype: str) -> None:
    out = convert_draft(draft_dir, tmp_path / f"d-{outtype}.gguf", outtype)
    r = GGUFReader(out)
    cfg = load_config(draft_dir)
    hf = {gg: (name, shape) for name, gg, shape in expected_tensors(cfg)}
    assert {t.name for t in r.tensors} == set(hf)
    assert len(r.tensors) == 3 + 11 * SPEC.n_layers
    f32 = _source_f32(draft_dir)
    bits = _source_bits(draft_dir)
    want = {"bf16": QT.BF16, "f16": QT.F16, "f32": QT.F32, "q8_0": QT.Q8_0}[outtype]
    for t in r.tensors:
        name, shape = hf[t.name]
        assert [int(x) for x in t.shape] == list(reversed(shape)), t.name  # GGUF ne = HF shape reversed
        if len(shape) == 1:
            assert t.tensor_type == QT.F32
            np.testing.assert_array_equal(np.asarray(t.data).reshape(shape), f32[name])
            continue
        assert t.tensor_type == want, t.name
        data = np.asarray(t.data)
        if want == QT.BF16:
            np.testing.assert_array_equal(data.view(np.uint16).reshape(shape), bits[name])
        elif want == QT.F32:
            np.testing.assert_array_equal(data.reshape(shape), f32[name])
        elif want == QT.F16:
            np.testing.assert_array_equal(data.reshape(shape), f32[name].astype(np.float16))
        else:
            got = dequantize(data, QT.Q8_0).reshape(shape)
            blocks = np.abs(f32[name]).reshape(shape[0], -1, 32).max(axis=2, keepdims=True)
            step = np.broadcast_to(blocks / 127.0, (shape[0], shape[1] // 32, 32)).reshape(shape)
            # half a quantisation step, plus the f16 rounding of the block scale
            tol = step * 0.5 + np.abs(f32[name]) * 2.0**-10 + 1e-7
            assert np.all(np.abs(got - f32[name]) <= tol), t.name
            assert not np.array_equal(got, f32[name])  # it really was quantised


def test_metadata(draft_dir: Path, tmp_path: Path) -> None:
    kv = _fields(GGUFReader(convert_draft(draft_dir, tmp_path / "m.gguf")))
    assert kv["general.architecture"] == "dflash"
    assert kv["dflash.target_layers"] == [i + 1 for i in SPEC.target_layer_ids]  # upstream reads layer id+1
    assert kv["dflash.block_size"] == 16
    assert kv["dflash.embedding_length"] == 64
    assert kv["dflash.block_count"] == 2
    assert kv["dflash.feed_forward_length"] == 96
    assert kv["dflash.attention.head_count"] == 4
    assert kv["dflash.attention.head_count_kv"] == 2
    assert kv["dflash.attention.key_length"] == 32
    assert kv["dflash.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert kv["dflash.rope.freq_base"] == pytest.approx(1e7)
    assert kv["dflash.context_length"] == 262144
    assert kv["dflash.attention.sliding_window"] == 8
    assert kv["dflash.attention.sliding_window_pattern"] == [True, False]
    # no is_causal in the config: upstream writes no global flag; ours is per layer (sliding causal)
    assert "dflash.attention.causal" not in kv
    assert kv["dflash.attention.causal_layers"] == [True, False]
    assert kv["dflash.num_target_layers"] == 6
    assert kv["tokenizer.ggml.mask_token_id"] == 250
    assert "tokenizer.ggml.model" not in kv  # only with --target
    assert "dflash.rope.dimension_sections" not in kv
    assert kv["general.file_type"] == 32  # MOSTLY_BF16


def test_key_types_match_upstream_loader(draft_dir: Path, tmp_path: Path) -> None:
    # llama.cpp checks scalar key types strictly; arrays must be int32/uint32 or bool.
    r = GGUFReader(convert_draft(draft_dir, tmp_path / "t.gguf"))
    types = {k: [GGUFValueType(x) for x in f.types] for k, f in r.fields.items()}
    u32 = [GGUFValueType.UINT32]
    for k in ("context_length", "embedding_length", "block_count", "feed_forward_length", "block_size"):
        assert types[f"dflash.{k}"] == u32, k
    assert types["dflash.attention.sliding_window"] == u32
    assert types["dflash.attention.layer_norm_rms_epsilon"] == [GGUFValueType.FLOAT32]
    assert types["dflash.target_layers"] == [GGUFValueType.ARRAY, GGUFValueType.INT32]
    assert types["dflash.attention.sliding_window_pattern"] == [GGUFValueType.ARRAY, GGUFValueType.BOOL]
    assert types["tokenizer.ggml.mask_token_id"] == u32


def test_is_causal_and_no_window(tmp_path: Path) -> None:
    d = write_synthetic_drafter(tmp_path / "d", SPEC, is_causal=False, sliding_window=None)
    kv = _fields(GGUFReader(convert_draft(d, tmp_path / "c.gguf")))
    assert kv["dflash.attention.causal"] is False
    assert kv["dflash.attention.causal_layers"] == [False, False]
    assert "dflash.attention.sliding_window" not in kv


def test_with_target_copies_tokenizer(draft_dir: Path, tmp_path: Path) -> None:
    tgt = write_fake_target(tmp_path / "target.gguf")
    kv = _fields(GGUFReader(convert_draft(draft_dir, tmp_path / "t.gguf", target=tgt)))
    assert kv["tokenizer.ggml.model"] == "gpt2"
    assert kv["tokenizer.ggml.pre"] == "qwen35"
    assert kv["tokenizer.ggml.tokens"] == [f"tok{i}" for i in range(256)]
    assert kv["tokenizer.ggml.token_type"] == [1] * 256
    assert kv["tokenizer.ggml.merges"] == ["t o", "to k"]
    assert kv["tokenizer.ggml.eos_token_id"] == 3
    assert kv["tokenizer.chat_template"] == "{{ messages }}"
    assert kv["tokenizer.ggml.mask_token_id"] == 250  # the drafter's, not the target's
    # M-RoPE target: upstream's degenerate sections (temporal axis only)
    assert kv["dflash.rope.dimension_sections"] == [16, 0, 0, 0]


def test_context_length_from_target(tmp_path: Path) -> None:
    d = write_synthetic_drafter(tmp_path / "d", SPEC, max_position_embeddings=None)
    with pytest.raises(ConvertError, match="max_position_embeddings"):
        convert_draft(d, tmp_path / "x.gguf")
    tgt = write_fake_target(tmp_path / "target.gguf", ctx=1234)
    kv = _fields(GGUFReader(convert_draft(d, tmp_path / "x.gguf", target=tgt)))
    assert kv["dflash.context_length"] == 1234


def test_sharded_equals_single(draft_dir: Path, tmp_path: Path) -> None:
    d = write_synthetic_drafter(tmp_path / "sharded", SPEC, seed=1, shards=3)
    assert (d / "model.safetensors.index.json").is_file()
    assert len(list(d.glob("model-*-of-00003.safetensors"))) == 3
    a = GGUFReader(convert_draft(draft_dir, tmp_path / "a.gguf"))
    b = GGUFReader(convert_draft(d, tmp_path / "b.gguf"))
    ta = {t.name: np.asarray(t.data) for t in a.tensors}
    tb = {t.name: np.asarray(t.data) for t in b.tensors}
    # the shards are filled in a different order, so compare layouts and that both converted fully
    assert ta.keys() == tb.keys()
    assert all(ta[k].shape == tb[k].shape for k in ta)
    src = _source_bits(d)
    for t in b.tensors:
        if t.name == "fc.weight":
            np.testing.assert_array_equal(
                np.asarray(t.data).view(np.uint16).reshape(src["fc.weight"].shape), src["fc.weight"]
            )


def test_model_prefix_names(tmp_path: Path) -> None:
    d = tmp_path / "p"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config_dict(SPEC)))
    items = [("model." + n, s) for n, s in tensor_shapes(SPEC)]
    _write_safetensors(d / "model.safetensors", items, np.random.default_rng(0), 1 << 20)
    r = GGUFReader(convert_draft(d, tmp_path / "p.gguf"))
    assert len(r.tensors) == len(items)


def test_cli_ok(draft_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.gguf"
    assert cli_main([str(draft_dir), "-o", str(out), "--outtype", "q8_0"]) == 0
    assert out.is_file()
    assert "wrote" in capsys.readouterr().err
    # exists -> refused without --force, replaced with it
    before = out.stat().st_mtime_ns
    assert cli_main([str(draft_dir), "-o", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert out.stat().st_mtime_ns == before
    assert cli_main([str(draft_dir), "-o", str(out), "--force", "-q"]) == 0
    assert GGUFReader(out).fields["general.file_type"].contents() == 32


# ---- error cases: clear one-line message, exit code 2, nothing left behind ----


def _edit_config(d: Path, **changes: Any) -> None:
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        node = cfg
        *path, leaf = k.split("__")
        for p in path:
            node = node[p]
        if v is ...:
            node.pop(leaf)
        else:
            node[leaf] = v
    (d / "config.json").write_text(json.dumps(cfg))


def _expect_error(
    tmp_path: Path, d: Path, match: str, capsys: pytest.CaptureFixture[str], *extra: str
) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / "bad.gguf"
    with pytest.raises(ConvertError, match=match):
        target = extra[1] if extra[:1] == ("--target",) else None
        convert_draft(d, out, target=target)
    _no_leftovers(out_dir, out)
    assert cli_main([str(d), "-o", str(out), "-q", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("convert-draft: error: "), err
    _no_leftovers(out_dir, out)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"hidden_size": ...}, "missing required field 'hidden_size'"),
        ({"rms_norm_eps": ...}, "rms_norm_eps"),
        ({"rope_theta": ...}, "rope_theta"),
        ({"dflash_config__mask_token_id": ...}, "dflash_config.mask_token_id"),
        ({"dflash_config__target_layer_ids": ...}, "dflash_config.target_layer_ids"),
        ({"dflash_config__target_layer_ids": [1, 3, 9]}, r"out of range for num_target_layers 6"),
        ({"dflash_config__mask_token_id": 256}, "outside the vocabulary"),
        ({"intermediate_size": 128}, r"mlp\.\w+_proj\.weight' has shape"),
        ({"num_key_value_heads": 4}, r"k_proj\.weight' has shape"),
        ({"layer_types": ["sliding_attention"]}, "layer_types"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"architectures": ["DFlash2DraftModel"]}, "DFlash2"),
    ],
)
def test_bad_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], match: str
) -> None:
    d = write_synthetic_drafter(tmp_path / "d", SPEC)
    _edit_config(d, **change)
    _expect_error(tmp_path, d, match, capsys)


def test_bad_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = write_synthetic_drafter(tmp_path / "d", SPEC)
    (d / "config.json").write_text("{not json")
    _expect_error(tmp_path, d, "cannot read", capsys)


def test_missing_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _expect_error(tmp_path, tmp_path / "nope", "not found", capsys)
    d = write_synthetic_drafter(tmp_path / "d", SPEC)
    (d / "model.safetensors").unlink()
    _expect_error(tmp_path, d, "missing file", capsys)
    (d / "config.json").unlink()
    _expect_error(tmp_path, d, "missing file.*config.json", capsys)
    s = write_synthetic_drafter(tmp_path / "s", SPEC, shards=2)
    next(s.glob("model-00002-*.safetensors")).unlink()
    _expect_error(tmp_path, s, "missing file", capsys)


def test_missing_tensor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config_dict(SPEC)))
    items = [(n, s) for n, s in tensor_shapes(SPEC) if n != "layers.1.mlp.up_proj.weight"]
    _write_safetensors(d / "model.safetensors", items, np.random.default_rng(0), 1 << 20)
    _expect_error(tmp_path, d, "missing tensor.*layers.1.mlp.up_proj", capsys)
    items = tensor_shapes(SPEC) + [("layers.0.self_attn.q_proj.bias", (128,))]
    _write_safetensors(d / "model.safetensors", items, np.random.default_rng(0), 1 << 20)
    _expect_error(tmp_path, d, "unexpected tensor.*q_proj.bias", capsys)


@pytest.mark.parametrize("damage", ["truncate", "header_len", "header_json", "empty"])
def test_corrupt_safetensors(tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str) -> None:
    d = write_synthetic_drafter(tmp_path / "d", SPEC)
    p = d / "model.safetensors"
    size = p.stat().st_size
    if damage == "truncate":
        os.truncate(p, size - 100)
    elif damage == "header_len":
        with open(p, "r+b") as f:
            f.write(b"\xff" * 8)
    elif damage == "header_json":
        with open(p, "r+b") as f:
            f.seek(9)
            f.write(b"\x00garbage")
    else:
        os.truncate(p, 0)
    _expect_error(tmp_path, d, "corrupt or unreadable safetensors", capsys)


def test_target_mismatches(draft_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (dict(hidden=128), "hidden_size 64 != target qwen35.embedding_length 128"),
        (dict(vocab=300), "vocab_size 256 != target"),
        (dict(n_layer=4), r"target_layer_ids \[5\] out of range"),
        (dict(n_layer=8), "trained for a 6-layer target"),
        (dict(arch="dflash"), "is a dflash drafter"),
    ]
    for i, (kw, match) in enumerate(cases):
        t = write_fake_target(tmp_path / f"t{i}.gguf", **kw)  # type: ignore[arg-type]
        _expect_error(tmp_path, draft_dir, match, capsys, "--target", str(t))
    _expect_error(tmp_path, draft_dir, "target GGUF not found", capsys, "--target", str(tmp_path / "no.gguf"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 7)
    _expect_error(tmp_path, draft_dir, "cannot read target GGUF", capsys, "--target", str(junk))


def test_failure_mid_write_leaves_nothing(
    draft_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dflash_convert.writer as writer

    calls = {"n": 0}
    real = writer.convert_tensor

    def flaky(*a: Any) -> np.ndarray:
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device")
        return real(*a)

    monkeypatch.setattr(writer, "convert_tensor", flaky)
    out = tmp_path / "o" / "x.gguf"
    out.parent.mkdir()
    with pytest.raises(ConvertError, match="No space left"):
        convert_draft(draft_dir, out)
    _no_leftovers(out.parent, out)


# ---- config parsing variants seen in published drafters ----


def test_config_variants() -> None:
    base = config_dict(SPEC)
    # transformers v5: rope_theta inside rope_parameters; block_size inside dflash_config
    v5 = {k: v for k, v in base.items() if k not in ("rope_theta", "block_size", "rope_scaling")}
    v5["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e6}
    v5["dflash_config"] = {**base["dflash_config"], "block_size": 8}
    c = parse_config(v5)
    assert c.rope_theta == 5e6 and c.block_size == 8 and c.rope_scaling is None
    # explicit is_causal applies to every layer
    assert parse_config({**base, "is_causal": True}).causal_layers == (True, True)
    # yarn scaling is parsed and needs its fields
    y = {
        **base,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192},
    }
    assert parse_config(y).rope_scaling is not None
    with pytest.raises(ConvertError, match="yarn"):
        parse_config({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    # default head_dim and kv heads
    nohd = {k: v for k, v in base.items() if k not in ("head_dim", "num_key_value_heads")}
    c = parse_config({**nohd, "num_attention_heads": 2})
    assert c.head_dim == 32 and c.num_key_value_heads == 2


def test_yarn_keys(tmp_path: Path) -> None:
    rs = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192, "beta_fast": 32.0}
    d = write_synthetic_drafter(tmp_path / "d", SPEC, extra_config={"rope_scaling": rs})
    kv = _fields(GGUFReader(convert_draft(d, tmp_path / "y.gguf")))
    assert kv["dflash.rope.scaling.type"] == "yarn"
    assert kv["dflash.rope.scaling.factor"] == 4.0
    assert kv["dflash.rope.scaling.original_context_length"] == 8192
    assert kv["dflash.rope.scaling.yarn_beta_fast"] == 32.0


def test_q8_0_falls_back_to_f16_for_odd_rows(tmp_path: Path) -> None:
    # ffn_down rows hold 80 values: not a whole number of 32-value q8_0 blocks (upstream does the same)
    d = write_synthetic_drafter(tmp_path / "d", SPEC, ffn=80)
    types = {t.name: t.tensor_type for t in GGUFReader(convert_draft(d, tmp_path / "q.gguf", "q8_0")).tensors}
    assert types["blk.0.ffn_down.weight"] == QT.F16
    assert types["blk.0.ffn_up.weight"] == QT.Q8_0


def test_27b_preset_shape() -> None:
    s = PRESETS["27b"]
    n = sum(math.prod(shape) for _, shape in tensor_shapes(s))
    assert 1.7e9 < n < 1.75e9  # "about 1.7B params" for the 27B drafter
    c = parse_config(config_dict(s))
    assert c.causal_layers == (True, True, True, True, False)
    assert c.swa_enabled and c.n_target_features == 5


def test_with_synth_qwen35_target(tmp_path: Path) -> None:
    # The project's synthetic qwen35 GGUF (real BPE tokenizer); skipped while dflash is not importable.
    synth = pytest.importorskip("dflash.synth")
    tgt = synth.write_qwen35_gguf(tmp_path / "target.gguf", synth.get_preset("tiny-b").config, seed=0)
    r = GGUFReader(tgt)
    n_vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    d = write_synthetic_drafter(
        tmp_path / "d",
        SPEC,
        hidden=128,
        target_layer_ids=(1, 4, 6),
        num_target_layers=8,
        vocab=n_vocab,
        mask_token_id=n_vocab - 1,
    )
    out = GGUFReader(convert_draft(d, tmp_path / "d.gguf", "q8_0", target=tgt))
    want = {k: f.contents() for k, f in r.fields.items() if k.startswith("tokenizer.")}
    got = {k: f.contents() for k, f in out.fields.items() if k.startswith("tokenizer.")}
    assert got.pop("tokenizer.ggml.mask_token_id") == n_vocab - 1
    want.pop("tokenizer.ggml.mask_token_id", None)
    assert got == want
    assert out.fields["dflash.target_layers"].contents() == [2, 5, 7]
