"""Write the drafter as a GGUF of arch ``dflash`` in upstream llama.cpp's layout.

Keys mirror upstream's converter (conversion/qwen.py ``DFlashModel`` at the pinned commit): the standard
llm/attention/rope keys, ``dflash.block_size``, ``dflash.target_layers`` (HF ids + 1, because upstream
taps the *input* of layer id+1), sliding-window keys only when the config enables the window,
``dflash.attention.causal`` only when the config states ``is_causal``, degenerate M-RoPE sections when
the target uses M-RoPE, and the target's tokenizer (upstream's loader requires ``tokenizer.ggml.model``
and checks draft/target vocab equality). Private extras that upstream ignores:
``dflash.attention.causal_layers`` (per-layer block causality), ``dflash.num_target_layers``,
``dflash.vocab_size``.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_VERSION, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, RopeScalingType

from .config import SLIDING, ConvertError, DraftConfig, load_config
from .tensors import OUTTYPES, SafetensorsSource, TensorPlan, build_plan, convert_tensor

ARCH = "dflash"
KEY_CAUSAL_LAYERS = f"{ARCH}.attention.causal_layers"
KEY_NUM_TARGET_LAYERS = f"{ARCH}.num_target_layers"

_FILE_TYPES = {
    "f32": LlamaFileType.ALL_F32,
    "f16": LlamaFileType.MOSTLY_F16,
    "bf16": LlamaFileType.MOSTLY_BF16,
    "q8_0": LlamaFileType.MOSTLY_Q8_0,
}


@dataclass
class TargetInfo:
    path: Path
    arch: str
    n_embd: int
    n_layer: int
    n_vocab: int
    context_length: int | None
    uses_mrope: bool
    # (key, value, type, array element type) for every tokenizer.* key, copied verbatim
    tokenizer_kv: list[tuple[str, Any, GGUFValueType, GGUFValueType | None]] = field(default_factory=list)


def _field_value(f: Any) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    vtype = GGUFValueType(f.types[0])
    if vtype != GGUFValueType.ARRAY:
        if vtype == GGUFValueType.STRING:
            return bytes(f.parts[-1]), vtype, None
        return f.parts[-1].tolist()[0], vtype, None
    if len(f.types) != 2:
        raise ConvertError(f"target key {f.name} is a nested array, which is not supported")
    sub = GGUFValueType(f.types[1])
    if sub == GGUFValueType.STRING:
        # Keep raw bytes so tokens round-trip exactly, whatever their encoding.
        return [bytes(f.parts[i]) for i in f.data], vtype, sub
    return [v for i in f.data for v in f.parts[i].tolist()], vtype, sub


def read_target(path: str | Path) -> TargetInfo:
    """The few facts the drafter needs from the target GGUF, plus its tokenizer keys."""
    p = Path(path)
    if not p.is_file():
        raise ConvertError(f"target GGUF not found: {p}")
    try:
        r = GGUFReader(p, "r")
    except Exception as e:  # the reader raises ValueError/struct.error/... on damaged files
        raise ConvertError(f"cannot read target GGUF {p}: {e}") from None

    def get(key: str) -> Any:
        f = r.fields.get(key)
        return None if f is None else _field_value(f)[0]

    arch_b = get("general.architecture")
    if arch_b is None:
        raise ConvertError(f"target GGUF {p} has no general.architecture")
    arch = arch_b.decode("utf-8", "replace")
    if arch == ARCH:
        raise ConvertError(f"--target {p} is a dflash drafter; pass the target model's GGUF")

    def need_int(key: str) -> int:
        v = get(key)
        if not isinstance(v, int):
            raise ConvertError(f"target GGUF {p} lacks integer key {key}")
        return v

    n_embd = need_int(f"{arch}.embedding_length")
    n_layer = need_int(f"{arch}.block_count")
    ctx = get(f"{arch}.context_length")
    secs = get(f"{arch}.rope.dimension_sections")
    tokens = r.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        n_vocab = len(tokens.data)
    elif isinstance(get(f"{arch}.vocab_size"), int):
        n_vocab = get(f"{arch}.vocab_size")
    else:
        emb = next((t for t in r.tensors if t.name == "token_embd.weight"), None)
        if emb is None:
            raise ConvertError(f"target GGUF {p} has no tokenizer.ggml.tokens, vocab_size or token_embd")
        n_vocab = int(emb.shape[1])
    tok = [(k, *_field_value(f)) for k, f in r.fields.items() if k.startswith("tokenizer.")]
    return TargetInfo(
        path=p,
        arch=arch,
        n_embd=n_embd,
        n_layer=n_layer,
        n_vocab=n_vocab,
        context_length=ctx if isinstance(ctx, int) else None,
        uses_mrope=bool(secs) and any(int(s) for s in secs),
        tokenizer_kv=tok,
    )


def check_compatible(cfg: DraftConfig, tgt: TargetInfo) -> None:
    if cfg.hidden_size != tgt.n_embd:
        raise ConvertError(
            f"drafter hidden_size {cfg.hidden_size} != target {tgt.arch}.embedding_length {tgt.n_embd}"
        )
    if cfg.vocab_size != tgt.n_vocab:
        raise ConvertError(f"drafter vocab_size {cfg.vocab_size} != target vocabulary size {tgt.n_vocab}")
    bad = [i for i in cfg.target_layer_ids if i >= tgt.n_layer]
    if bad:
        raise ConvertError(f"target_layer_ids {bad} out of range for the target's {tgt.n_layer} layers")
    if cfg.num_target_layers is not None and cfg.num_target_layers != tgt.n_layer:
        raise ConvertError(
            f"drafter was trained for a {cfg.num_target_layers}-layer target; "
            f"--target has {tgt.n_layer} layers"
        )
    if cfg.mask_token_id >= tgt.n_vocab:
        raise ConvertError(
            f"mask_token_id {cfg.mask_token_id} is outside the target vocabulary ({tgt.n_vocab})"
        )


def add_metadata(w: GGUFWriter, cfg: DraftConfig, outtype: str, tgt: TargetInfo | None) -> None:
    w.add_name(cfg.name or "DFlash draft")
    w.add_type("model")
    ctx = cfg.max_position_embeddings or (tgt.context_length if tgt else None)
    if ctx is None:
        raise ConvertError(
            "config.json is missing required field 'max_position_embeddings' (or pass --target)"
        )
    w.add_context_length(ctx)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    if cfg.partial_rotary_factor is not None:
        w.add_rope_dimension_count(int(cfg.head_dim * cfg.partial_rotary_factor))
    rs = cfg.rope_scaling
    if rs is not None and rs.factor is not None and rs.type in ("linear", "yarn"):
        w.add_rope_scaling_type(RopeScalingType(rs.type))
        w.add_rope_scaling_factor(rs.factor)
        if rs.type == "yarn":
            assert rs.original_max_position_embeddings is not None
            w.add_rope_scaling_orig_ctx_len(rs.original_max_position_embeddings)
            if rs.extrapolation_factor is not None:
                w.add_rope_scaling_yarn_ext_factor(float(rs.extrapolation_factor))
            if rs.attention_factor is not None:
                w.add_rope_scaling_yarn_attn_factor(float(rs.attention_factor))
            if rs.beta_fast is not None:
                w.add_rope_scaling_yarn_beta_fast(float(rs.beta_fast))
            if rs.beta_slow is not None:
                w.add_rope_scaling_yarn_beta_slow(float(rs.beta_slow))
    elif rs is not None and rs.type in ("longrope", "su"):
        w.add_rope_scaling_type(RopeScalingType.LONGROPE)
    elif rs is not None:
        warnings.warn(f"rope_scaling type {rs.type!r} is not written to the GGUF", stacklevel=2)
    if tgt is not None and tgt.uses_mrope:
        # Upstream: a draft for an M-RoPE target ropes on the temporal axis only.
        w.add_array(f"{ARCH}.rope.dimension_sections", [cfg.head_dim // 2, 0, 0, 0])
    w.add_file_type(_FILE_TYPES[outtype])
    w.add_quantization_version(GGML_QUANT_VERSION)

    w.add_uint32(f"{ARCH}.block_size", cfg.block_size)
    w.add_array(f"{ARCH}.target_layers", [i + 1 for i in cfg.target_layer_ids])
    if cfg.swa_enabled and SLIDING in cfg.layer_types:
        assert cfg.sliding_window is not None
        w.add_sliding_window(cfg.sliding_window)
        w.add_sliding_window_pattern(list(cfg.swa_pattern))
    if cfg.is_causal is not None:
        w.add_causal_attention(cfg.is_causal)
    w.add_key_value(KEY_CAUSAL_LAYERS, list(cfg.causal_layers), GGUFValueType.ARRAY, GGUFValueType.BOOL)
    if cfg.num_target_layers is not None or tgt is not None:
        w.add_uint32(KEY_NUM_TARGET_LAYERS, cfg.num_target_layers or tgt.n_layer)  # type: ignore[union-attr]
    w.add_vocab_size(cfg.vocab_size)

    if tgt is not None:
        for key, val, vtype, sub in tgt.tokenizer_kv:
            if key != "tokenizer.ggml.mask_token_id":
                w.add_key_value(key, val, vtype, sub)
        if not tgt.tokenizer_kv:
            warnings.warn(
                f"target {tgt.path} has no tokenizer keys; upstream llama.cpp will refuse the draft",
                stacklevel=2,
            )
    w.add_mask_token_id(cfg.mask_token_id)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _progress(items: list[TensorPlan], enabled: bool) -> Any:
    if not enabled:
        return items
    from tqdm import tqdm

    # disable=None: no bar when stderr is not a terminal (logs, CI)
    return tqdm(items, desc="convert-draft", unit="tensor", leave=False, disable=None)


def convert_draft(
    src_dir: str | Path,
    out_path: str | Path,
    outtype: str = "bf16",
    target: str | Path | None = None,
    *,
    force: bool = False,
    progress: bool = False,
) -> Path:
    """Convert a z-lab DFlash drafter directory to ``out_path`` (GGUF, arch ``dflash``).

    Everything is validated before the output is created; the file is written under a temporary
    name in the same folder and renamed at the end, so no partial output survives an error.
    Raises ConvertError for every user-facing problem."""
    if outtype not in OUTTYPES:
        raise ConvertError(f"unknown outtype {outtype!r} (choose from {', '.join(OUTTYPES)})")
    out = Path(out_path)
    if out.is_dir():
        raise ConvertError(f"output path is a directory: {out}")
    if out.exists() and not force:
        raise ConvertError(f"output file exists: {out} (use --force to overwrite)")
    if not out.parent.is_dir():
        raise ConvertError(f"output folder does not exist: {out.parent}")

    cfg = load_config(src_dir)
    tgt = read_target(target) if target is not None else None
    if tgt is not None:
        check_compatible(cfg, tgt)
    else:
        warnings.warn(
            "no --target given: the GGUF has no tokenizer data, which upstream llama.cpp requires "
            "(this project's engine does not)",
            stacklevel=2,
        )
    source = SafetensorsSource(src_dir)
    try:
        plan = build_plan(cfg, source, OUTTYPES[outtype])
        w = GGUFWriter(path=None, arch=ARCH)
        add_metadata(w, cfg, outtype, tgt)
        for t in plan:
            w.add_tensor_info(
                t.gguf_name, t.src.shape, np.dtype(np.float32), t.out_nbytes, raw_dtype=t.out_type
            )

        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        tmp.chmod(0o666 & ~_umask())  # mkstemp makes 0600; give the result ordinary permissions
        try:
            w.write_header_to_file(tmp)
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            for t in _progress(plan, progress):
                data = convert_tensor(source.read_raw(t.src), t.src.dtype, t.out_type)
                if data.nbytes != t.out_nbytes:  # would corrupt every following offset
                    raise ConvertError(f"internal error: {t.gguf_name} converted to {data.nbytes} bytes")
                w.write_tensor_data(data)
            w.close()
            os.replace(tmp, out)
        except BaseException:
            w.close()
            tmp.unlink(missing_ok=True)
            raise
    except OSError as e:
        raise ConvertError(f"write failed: {e}") from None
    finally:
        source.close()
    return out
