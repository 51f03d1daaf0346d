"""safetensors input (single file or sharded), z-lab -> GGUF name mapping, shape checks, dtype conversion.

numpy cannot represent bfloat16, and ``safe_open(..., framework="numpy").get_tensor`` refuses BF16, so the
tensor data is read through a read-only ``np.memmap`` at the offsets from the (validated) safetensors
header: BF16 arrives as raw ``uint16`` bit patterns. The ``safetensors`` library itself is still used to
validate each file, so a corrupt file is reported the same way other tools would see it.
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize

from .config import ConvertError, DraftConfig

QT = GGMLQuantizationType

# safetensors dtype tag -> (numpy dtype used to hold the raw data, bytes per element)
_ST_DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
}
_HEADER_MAX = 100 * 1024 * 1024  # the format's own limit on the JSON header

OUTTYPES: dict[str, QT] = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0}

# Tensors a drafter may carry that the GGUF does not: the frozen embedding/head are bound from the target.
_SKIPPED = ("embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True)
class SourceTensor:
    name: str  # as stored in the safetensors file
    file: Path
    dtype: str  # safetensors tag: BF16 | F16 | F32
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in ``file``
    nbytes: int


@dataclass(frozen=True)
class TensorPlan:
    gguf_name: str
    src: SourceTensor
    out_type: QT

    @property
    def out_nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.out_type]
        return math.prod(self.src.shape) // block * size


def _corrupt(path: Path, why: str) -> ConvertError:
    return ConvertError(f"corrupt or unreadable safetensors file {path}: {why}")


def read_safetensors_header(path: Path) -> dict[str, SourceTensor]:
    """Parse and check one file's header: dtypes, shapes and offsets must agree with the file size."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _corrupt(path, "file is shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n == 0 or n > _HEADER_MAX or 8 + n > size:
                raise _corrupt(path, f"invalid header length {n}")
            raw = f.read(n)
    except OSError as e:
        raise ConvertError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _corrupt(path, f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "header is not a JSON object")
    base = 8 + n
    data_len = size - base
    out: dict[str, SourceTensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = info["dtype"]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise _corrupt(path, f"bad header entry for {name!r}") from None
        if dtype not in _ST_DTYPES:
            raise ConvertError(
                f"tensor {name!r} in {path.name} has dtype {dtype}; only BF16, F16, F32 are supported"
            )
        if any(d < 0 for d in shape) or not 0 <= begin <= end:
            raise _corrupt(path, f"bad shape/offsets for {name!r}")
        if end - begin != math.prod(shape) * _ST_DTYPES[dtype].itemsize:
            raise _corrupt(path, f"size of {name!r} does not match its shape {list(shape)} and dtype {dtype}")
        if end > data_len:
            raise _corrupt(path, f"data of {name!r} runs past the end of the file (truncated?)")
        out[name] = SourceTensor(name, path, dtype, shape, base + begin, end - begin)
    return out


def _library_check(path: Path) -> None:
    # The safetensors library does its own validation (overlapping/non-contiguous offsets and so on).
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            f.keys()
    except Exception as e:  # SafetensorError has no stable import path across versions
        raise _corrupt(path, str(e).splitlines()[0] if str(e) else type(e).__name__) from None


class SafetensorsSource:
    """All tensors of a drafter directory, keyed by their stored names."""

    def __init__(self, src_dir: str | Path) -> None:
        self.dir = Path(src_dir)
        self.files = self._find_files()
        self.tensors: dict[str, SourceTensor] = {}
        weight_map = self._weight_map()
        for path in self.files:
            _library_check(path)
            for name, t in read_safetensors_header(path).items():
                if name in self.tensors:
                    raise ConvertError(
                        f"tensor {name!r} appears in both {self.tensors[name].file.name} and {path.name}"
                    )
                self.tensors[name] = t
        if weight_map is not None:
            for name, fname in weight_map.items():
                t = self.tensors.get(name)
                if t is None or t.file.name != fname:
                    raise ConvertError(
                        f"model.safetensors.index.json maps {name!r} to {fname}, which does not hold it"
                    )
        self._maps: dict[Path, np.memmap] = {}

    def _index_path(self) -> Path:
        return self.dir / "model.safetensors.index.json"

    def _weight_map(self) -> dict[str, str] | None:
        p = self._index_path()
        if not p.is_file():
            return None
        try:
            wm = json.loads(p.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(wm, dict):
                raise TypeError
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
            raise ConvertError(f"cannot read {p}: expected JSON with a 'weight_map' object") from None
        return {str(k): str(v) for k, v in wm.items()}

    def _find_files(self) -> list[Path]:
        wm = self._weight_map()
        if wm is not None:
            names = sorted(set(wm.values()))
            for n in names:
                if not (self.dir / n).is_file():
                    raise ConvertError(
                        f"missing file: {self.dir / n} (listed in model.safetensors.index.json)"
                    )
            return [self.dir / n for n in names]
        single = self.dir / "model.safetensors"
        if single.is_file():
            return [single]
        found = sorted(self.dir.glob("*.safetensors"))
        if not found:
            raise ConvertError(f"missing file: {single} (and no model.safetensors.index.json)")
        return found

    def read_raw(self, t: SourceTensor) -> np.ndarray:
        """A read-only view of the stored data; BF16 comes back as uint16 bit patterns."""
        mm = self._maps.get(t.file)
        if mm is None:
            mm = np.memmap(t.file, dtype=np.uint8, mode="r")
            self._maps[t.file] = mm
        return mm[t.offset : t.offset + t.nbytes].view(_ST_DTYPES[t.dtype]).reshape(t.shape)

    def close(self) -> None:
        # Dropping the maps is enough: views handed out keep their own reference until they die.
        self._maps.clear()


def expected_tensors(cfg: DraftConfig) -> list[tuple[str, str, tuple[int, ...]]]:
    """(z-lab name, GGUF name, HF shape [out, in]) for every tensor the GGUF must hold."""
    h, hd, ff = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    out: list[tuple[str, str, tuple[int, ...]]] = [
        ("fc.weight", "fc.weight", (h, cfg.n_target_features * h)),
        ("hidden_norm.weight", "enc.output_norm.weight", (h,)),
    ]
    for i in range(cfg.num_hidden_layers):
        s, b = f"layers.{i}.", f"blk.{i}."
        out += [
            (s + "input_layernorm.weight", b + "attn_norm.weight", (h,)),
            (s + "self_attn.q_proj.weight", b + "attn_q.weight", (q, h)),
            (s + "self_attn.k_proj.weight", b + "attn_k.weight", (kv, h)),
            (s + "self_attn.v_proj.weight", b + "attn_v.weight", (kv, h)),
            (s + "self_attn.o_proj.weight", b + "attn_output.weight", (h, q)),
            (s + "self_attn.q_norm.weight", b + "attn_q_norm.weight", (hd,)),
            (s + "self_attn.k_norm.weight", b + "attn_k_norm.weight", (hd,)),
            (s + "post_attention_layernorm.weight", b + "ffn_norm.weight", (h,)),
            (s + "mlp.gate_proj.weight", b + "ffn_gate.weight", (ff, h)),
            (s + "mlp.up_proj.weight", b + "ffn_up.weight", (ff, h)),
            (s + "mlp.down_proj.weight", b + "ffn_down.weight", (h, ff)),
        ]
    out.append(("norm.weight", "output_norm.weight", (h,)))
    return out


def _canonical(name: str) -> str:
    # Some exports prefix every name with "model."; upstream's converter accepts both spellings.
    return name[len("model.") :] if name.startswith("model.") else name


def out_type_for(shape: tuple[int, ...], outtype: QT) -> QT:
    # Like upstream: 1-D tensors (norms) stay F32; Q8_0 needs rows that are a multiple of its block.
    if len(shape) <= 1:
        return QT.F32
    if outtype == QT.Q8_0 and shape[-1] % GGML_QUANT_SIZES[QT.Q8_0][0]:
        return QT.F16
    return outtype


def build_plan(cfg: DraftConfig, source: SafetensorsSource, outtype: QT) -> list[TensorPlan]:
    """Match the stored tensors against the config; every name, shape and dtype problem fails here,
    before any output is written."""
    by_canon: dict[str, SourceTensor] = {}
    for name, t in source.tensors.items():
        c = _canonical(name)
        if c in by_canon:
            raise ConvertError(f"tensor {c!r} is stored twice (with and without the 'model.' prefix)")
        by_canon[c] = t
    plan: list[TensorPlan] = []
    missing: list[str] = []
    for hf, gg, shape in expected_tensors(cfg):
        t = by_canon.pop(hf, None)
        if t is None:
            missing.append(hf)
            continue
        if t.shape != shape:
            raise ConvertError(
                f"tensor {t.name!r} has shape {list(t.shape)}, expected {list(shape)} from config.json"
            )
        plan.append(TensorPlan(gg, t, out_type_for(shape, outtype)))
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ConvertError(f"safetensors is missing tensor(s): {', '.join(missing[:5])}{more}")
    for skip in _SKIPPED:
        if by_canon.pop(skip, None) is not None:
            warnings.warn(f"skipping {skip}: the draft shares the target's embedding and head", stacklevel=2)
    if by_canon:
        extra = sorted(by_canon)
        more = f" (+{len(extra) - 5} more)" if len(extra) > 5 else ""
        raise ConvertError(f"unexpected tensor(s) in safetensors: {', '.join(extra[:5])}{more}")
    return plan


def to_f32(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32, copy=False)


def _row_chunks(rows: int, cols: int, max_elems: int = 1 << 24) -> Iterator[slice]:
    step = max(1, max_elems // max(cols, 1))
    for r in range(0, rows, step):
        yield slice(r, min(rows, r + step))


def convert_tensor(raw: np.ndarray, src_dtype: str, out: QT) -> np.ndarray:
    """Stored data -> the bytes the GGUF holds (numpy array whose nbytes match the GGUF tensor).

    Large tensors are converted in row chunks so peak memory stays near the output size."""
    if out == QT.BF16 and src_dtype == "BF16":
        return raw  # bit-exact pass-through, still memory-mapped
    if out == QT.F16 and src_dtype == "F16":
        return raw
    if out == QT.F32 and src_dtype == "F32":
        return raw
    rows = raw.shape[0] if raw.ndim > 1 else 1
    flat = raw.reshape(rows, -1)
    cols = flat.shape[1]
    if out == QT.F32:
        dst = np.empty((rows, cols), np.float32)
    elif out in (QT.F16, QT.BF16):
        dst = np.empty((rows, cols), np.float16 if out == QT.F16 else np.uint16)
    elif out == QT.Q8_0:
        block, size = GGML_QUANT_SIZES[QT.Q8_0]
        dst = np.empty((rows, cols // block * size), np.uint8)
    else:
        raise ConvertError(f"unsupported output type {out.name}")
    for sl in _row_chunks(rows, cols):
        x = to_f32(flat[sl], src_dtype)
        if out == QT.F32:
            dst[sl] = x
        elif out == QT.F16:
            with np.errstate(over="ignore"):
                dst[sl] = x.astype(np.float16)
        else:
            dst[sl] = quantize(x, out).view(dst.dtype).reshape(dst[sl].shape)
    if out == QT.F16 and src_dtype != "F16" and not np.isfinite(dst).all():
        warnings.warn("some values overflow float16 and became inf; prefer --outtype bf16", stacklevel=2)
    return dst.reshape(raw.shape[:-1] + (dst.shape[1],)) if raw.ndim > 1 else dst.reshape(-1)
