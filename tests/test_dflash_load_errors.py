"""A drafter that cannot run raises dflash._core.ModelLoadError with a clear message, before any graph
is built (no GGML_ASSERT/abort), and the process carries on: a good drafter still loads and drafts."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from dflash import _core

try:
    import dflash_convert  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "convert"))

from dflash_convert import convert_draft  # noqa: E402
from dflash_convert.synthetic import FULL, SLIDING, write_synthetic_drafter  # noqa: E402

VT = GGUFValueType
SMALL = dict(
    n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn=64, block_size=8, vocab=4096, mask_token_id=4091
)


@pytest.fixture(scope="module")
def target(synth_model: Any) -> tuple[Path, _core.TargetEngine]:
    path = synth_model("tiny-a", "f32")  # hidden 64, 4 layers, vocab 4096
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_gpu_layers, cfg.n_threads = 128, 0, 1
    return path, _core.TargetEngine(str(path), cfg)


def make(tmp: Path, target_path: Path | None, **fields: Any) -> Path:
    d = write_synthetic_drafter(tmp / "src", **{**SMALL, "hidden": 64, "target_layer_ids": (0, 2), **fields})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no --target given"
        return convert_draft(d, tmp / "draft.gguf", outtype="f32", target=target_path)


def rewrite(
    src: Path,
    dst: Path,
    drop: tuple[str, ...] = (),
    set_keys: dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]] | None = None,
    tensors: Callable[[str, np.ndarray], np.ndarray | None] = lambda name, data: data,
    add: dict[str, np.ndarray] | None = None,
) -> Path:
    """Copy a GGUF, dropping/replacing keys, transforming (or dropping, with None) and adding tensors."""
    r = GGUFReader(src)
    w = GGUFWriter(dst, str(r.fields["general.architecture"].contents()))
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop or key in (set_keys or {}):
            continue
        sub = VT(f.types[1]) if len(f.types) > 1 else None
        w.add_key_value(key, f.contents(), VT(f.types[0]), sub)
    for key, (val, vtype, sub) in (set_keys or {}).items():
        w.add_key_value(key, val, vtype, sub)
    for t in r.tensors:
        data = tensors(t.name, np.asarray(t.data))
        if data is not None:
            w.add_tensor(t.name, data)
    for name, data in (add or {}).items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def load(path: Path, target: _core.TargetEngine) -> _core.DraftEngine:
    return _core.DraftEngine(str(path), target, _core.DraftEngineConfig())


def expect(path: Path, target: _core.TargetEngine, *fragments: str) -> None:
    with pytest.raises(_core.ModelLoadError) as e:
        load(path, target)
    for frag in fragments:
        assert frag in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "fields,fragments",
    [
        (dict(hidden=128), ("hidden size 128", "target's 64")),
        (dict(target_layer_ids=(0, 7), num_target_layers=None), ("out of range", "4 layers")),
        (dict(num_target_layers=8), ("trained for a 8-layer target",)),
        (dict(vocab=8192), ("vocabulary size 8192",)),
    ],
    ids=["hidden", "layer-id", "trained-layers", "vocab"],
)
def test_mismatch_with_target(
    tmp_path: Path,
    target: tuple[Path, _core.TargetEngine],
    fields: dict[str, Any],
    fragments: tuple[str, ...],
) -> None:
    expect(make(tmp_path, None, **fields), target[1], *fragments)


def test_corrupt_files(tmp_path: Path, target: tuple[Path, _core.TargetEngine]) -> None:
    good = make(tmp_path, target[0])
    data = good.read_bytes()
    cases = {
        "missing.gguf": None,
        "empty.gguf": b"",
        "garbage.gguf": bytes(range(256)) * 64,
        "truncated-header.gguf": data[:100],
        "truncated-data.gguf": data[: len(data) - 1000],
    }
    for name, content in cases.items():
        p = tmp_path / name
        if content is not None:
            p.write_bytes(content)
        with pytest.raises(_core.ModelLoadError):
            load(p, target[1])
    expect(target[0], target[1], "not a DFlash drafter", "qwen35")  # the target itself


def test_bad_metadata_and_tensors(tmp_path: Path, target: tuple[Path, _core.TargetEngine]) -> None:
    tpath, eng = target
    good = make(tmp_path, tpath, layer_types=(SLIDING, FULL), sliding_window=4)
    n = iter(range(100))

    def bad(**kw: Any) -> Path:
        return rewrite(good, tmp_path / f"bad{next(n)}.gguf", **kw)

    expect(bad(drop=("dflash.target_layers",)), eng, "dflash.target_layers")
    expect(bad(drop=("tokenizer.ggml.mask_token_id",)), eng, "mask_token_id")
    expect(bad(drop=("dflash.attention.layer_norm_rms_epsilon",)), eng, "layer_norm_rms_epsilon")
    expect(bad(set_keys={"dflash.target_layers": ([0, 3], VT.ARRAY, VT.INT32)}), eng, "target layer 0")
    expect(bad(set_keys={"dflash.block_size": (1, VT.UINT32, None)}), eng, "block_size 1")
    expect(bad(set_keys={"dflash.attention.head_count": (3, VT.UINT32, None)}), eng, "heads 3")
    expect(bad(set_keys={"tokenizer.ggml.mask_token_id": (5000, VT.UINT32, None)}), eng, "mask token id 5000")
    expect(bad(set_keys={"dflash.rope.scaling.type": ("yarn", VT.STRING, None)}), eng, "rope scaling 'yarn'")
    expect(
        bad(set_keys={"dflash.rope.dimension_sections": ([4, 4, 0, 0], VT.ARRAY, VT.INT32)}), eng, "sections"
    )
    expect(bad(drop=("dflash.attention.sliding_window_pattern",)), eng, "sliding_window_pattern")
    expect(
        bad(set_keys={"dflash.attention.causal_layers": ([True], VT.ARRAY, VT.BOOL)}), eng, "causal_layers"
    )
    expect(
        bad(tensors=lambda name, d: None if name == "blk.1.ffn_up.weight" else d), eng, "blk.1.ffn_up.weight"
    )
    expect(bad(tensors=lambda name, d: d[:, :-1] if name == "fc.weight" else d), eng, "fc.weight", "shape")
    expect(bad(tensors=lambda name, d: d.astype(np.float16) if "norm" in name else d), eng, "must be f32")
    expect(bad(add={"d2t": np.arange(16, dtype=np.int32)}), eng, "unexpected tensor 'd2t'")

    # The rewritten-but-unchanged file is fine, and the process is still healthy after all of the above.
    d = load(bad(), eng)
    d.inject(np.zeros((5, 128), np.float32), 0)
    out = d.draft(7, 5, False)
    assert len(out["argmax"]) == 7 and out["top_ids"].shape == (7, 8)
