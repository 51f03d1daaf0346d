"""Random-weight GGUF writer for the `qwen35` architecture (Qwen3.5 / Qwen3.6 dense hybrids).

Keys, tensor names and shapes are those upstream llama.cpp loads (src/models/qwen35.cpp,
load_block_trunk / load_block_mtp); value conventions are those of its converter: norm weights
carry the +1 (except the GDN output norm), ``ssm_a = -exp(A_log)``, 1-D tensors and
``ssm_conv1d`` stay f32. Tensors are generated chunk by chunk in worker processes and streamed
to disk, so a 27B file never sits in memory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from . import quant
from .quant import Q
from .tokenizer import BpeVocab, add_vocab_to_gguf, load_vocab

ARCH = "qwen35"
WEIGHT_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_K", "q5_K", "q6_K", "q4_K_M")
_FILE_TYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "bf16": gguf.LlamaFileType.MOSTLY_BF16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_S,
    "q5_K": gguf.LlamaFileType.MOSTLY_Q5_K_S,
    "q6_K": gguf.LlamaFileType.MOSTLY_Q6_K,
    "q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M,
}
# Values per generated chunk: bounds worker memory and keeps output independent of worker count.
_CHUNK_VALUES = 1 << 24


def imrope_sections(rope_dim: int) -> list[int]:
    """Split rope_dim/2 rotary pairs over the t/h/w axes like Qwen3.5's [11, 11, 10, 0] of 32.

    ggml's IMROPE assigns pair i to axis i % 3 while i < 3*section[axis]; sum(sections) must
    cover the rotated pairs (2 * sum == rope_dim). Text uses one position on all axes.
    """
    pairs = rope_dim // 2
    return [(pairs + 2) // 3, (pairs + 1) // 3, pairs // 3, 0]


@dataclass(frozen=True)
class Qwen35Config:
    """Every shape of a qwen35 model. ``n_vocab`` 0 means "the tokenizer's size"."""

    hidden: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dim: int
    full_attention_interval: int = 4
    n_v_heads: int = 4  # GDN value heads (ssm.time_step_rank)
    n_k_heads: int = 2  # GDN key heads (ssm.group_count)
    ssm_state: int = 32  # GDN head dim (ssm.state_size); CUDA kernels take 16/32/64/128
    ssm_conv: int = 4
    rope_theta: float = 1.0e7
    rope_sections: tuple[int, ...] = ()  # empty: derived from rope_dim
    rms_eps: float = 1.0e-6
    context_length: int = 4096
    n_vocab: int = 0
    tied_embeddings: bool = False
    nextn_layers: int = 0  # MTP blocks appended after the trunk
    name: str = "dflash-synth"
    # Init scales (see tensor_specs): logits std is about logit_std with unit-RMS hidden states.
    logit_std: float = 4.0
    a_log_range: tuple[float, float] = (-4.0, 1.0)

    def __post_init__(self) -> None:
        if self.n_head % self.n_head_kv or self.n_v_heads % self.n_k_heads:
            raise ValueError("n_head must be a multiple of n_head_kv and n_v_heads of n_k_heads")
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise ValueError("rope_dim must be even and at most head_dim")
        if self.sections and 2 * sum(self.sections) != self.rope_dim:
            raise ValueError("2 * sum(rope_sections) must equal rope_dim")

    @property
    def sections(self) -> list[int]:
        return list(self.rope_sections) or imrope_sections(self.rope_dim)

    def is_recurrent(self, il: int) -> bool:
        return il < self.n_layer and (il + 1) % self.full_attention_interval != 0

    @property
    def key_dim(self) -> int:
        return self.ssm_state * self.n_k_heads

    @property
    def value_dim(self) -> int:
        return self.ssm_state * self.n_v_heads

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class Init:
    """How values are drawn: "normal" (a = mean, b = std) or "neg_exp_uniform" (-exp(U(a, b)))."""

    kind: str
    a: float
    b: float


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # numpy order: (rows, row_length); ggml ne is reversed
    init: Init
    layer: int = -1

    @property
    def n_cols(self) -> int:
        return self.shape[-1]

    @property
    def n_values(self) -> int:
        return math.prod(self.shape)


def _matrix(name: str, n_in: int, n_out: int, il: int = -1) -> TensorSpec:
    return TensorSpec(name, (n_out, n_in), Init("normal", 0.0, 1.0 / math.sqrt(n_in)), il)


def _norm(name: str, n: int, il: int = -1) -> TensorSpec:
    # stored with the +1 already added, as the converter does
    return TensorSpec(name, (n,), Init("normal", 1.0, 0.05), il)


def _attention(cfg: Qwen35Config, p: str, il: int) -> list[TensorSpec]:
    n_q = cfg.n_head * cfg.head_dim
    n_kv = cfg.n_head_kv * cfg.head_dim
    return [
        _matrix(f"{p}.attn_q.weight", cfg.hidden, 2 * n_q, il),  # Q and its gate, interleaved per head
        _matrix(f"{p}.attn_k.weight", cfg.hidden, n_kv, il),
        _matrix(f"{p}.attn_v.weight", cfg.hidden, n_kv, il),
        _matrix(f"{p}.attn_output.weight", n_q, cfg.hidden, il),
        _norm(f"{p}.attn_q_norm.weight", cfg.head_dim, il),
        _norm(f"{p}.attn_k_norm.weight", cfg.head_dim, il),
    ]


def _gated_delta_net(cfg: Qwen35Config, p: str, il: int) -> list[TensorSpec]:
    return [
        _matrix(f"{p}.attn_qkv.weight", cfg.hidden, cfg.conv_dim, il),
        _matrix(f"{p}.attn_gate.weight", cfg.hidden, cfg.value_dim, il),
        TensorSpec(
            f"{p}.ssm_conv1d.weight",
            (cfg.conv_dim, cfg.ssm_conv),
            Init("normal", 0.0, 1.0 / math.sqrt(cfg.ssm_conv)),
            il,
        ),
        # small dt bias and a broad A range: some heads forget fast, some keep state for long
        TensorSpec(f"{p}.ssm_dt.bias", (cfg.n_v_heads,), Init("normal", 0.0, 0.5), il),
        TensorSpec(f"{p}.ssm_a", (cfg.n_v_heads,), Init("neg_exp_uniform", *cfg.a_log_range), il),
        _matrix(f"{p}.ssm_beta.weight", cfg.hidden, cfg.n_v_heads, il),
        _matrix(f"{p}.ssm_alpha.weight", cfg.hidden, cfg.n_v_heads, il),
        # the GDN output norm is the one norm stored without the +1
        TensorSpec(f"{p}.ssm_norm.weight", (cfg.ssm_state,), Init("normal", 1.0, 0.05), il),
        _matrix(f"{p}.ssm_out.weight", cfg.value_dim, cfg.hidden, il),
    ]


def _ffn(cfg: Qwen35Config, p: str, il: int) -> list[TensorSpec]:
    return [
        _matrix(f"{p}.ffn_gate.weight", cfg.hidden, cfg.n_ff, il),
        _matrix(f"{p}.ffn_up.weight", cfg.hidden, cfg.n_ff, il),
        _matrix(f"{p}.ffn_down.weight", cfg.n_ff, cfg.hidden, il),
    ]


def tensor_specs(cfg: Qwen35Config, n_vocab: int) -> list[TensorSpec]:
    """All tensors in file order: embeddings, trunk blocks, MTP blocks, output."""
    emb_std = cfg.logit_std / math.sqrt(cfg.hidden)
    specs = [TensorSpec("token_embd.weight", (n_vocab, cfg.hidden), Init("normal", 0.0, emb_std))]
    for il in range(cfg.n_layer):
        p = f"blk.{il}"
        specs += [
            _norm(f"{p}.attn_norm.weight", cfg.hidden, il),
            _norm(f"{p}.post_attention_norm.weight", cfg.hidden, il),
        ]
        specs += _gated_delta_net(cfg, p, il) if cfg.is_recurrent(il) else _attention(cfg, p, il)
        specs += _ffn(cfg, p, il)
    for il in range(cfg.n_layer, cfg.n_layer + cfg.nextn_layers):
        p = f"blk.{il}"
        specs += [
            _norm(f"{p}.attn_norm.weight", cfg.hidden, il),
            _norm(f"{p}.post_attention_norm.weight", cfg.hidden, il),
        ]
        specs += _attention(cfg, p, il) + _ffn(cfg, p, il)
        specs += [
            _matrix(f"{p}.nextn.eh_proj.weight", 2 * cfg.hidden, cfg.hidden, il),
            _norm(f"{p}.nextn.enorm.weight", cfg.hidden, il),
            _norm(f"{p}.nextn.hnorm.weight", cfg.hidden, il),
            _norm(f"{p}.nextn.shared_head_norm.weight", cfg.hidden, il),
        ]
    specs.append(_norm("output_norm.weight", cfg.hidden))
    if not cfg.tied_embeddings:
        specs.append(TensorSpec("output.weight", (n_vocab, cfg.hidden), Init("normal", 0.0, emb_std)))
    return specs


# --- per-tensor storage type --------------------------------------------------------------


def _keeps_f32(spec: TensorSpec) -> bool:
    # as the converter and llama-quantize do: 1-D tensors, norms, non-".weight" and the conv kernel
    return len(spec.shape) < 2 or spec.name.endswith("_norm.weight") or "ssm_conv1d" in spec.name


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def storage_types(cfg: Qwen35Config, specs: Sequence[TensorSpec], weight_type: str) -> dict[str, Q]:
    """Per-tensor ggml type; "q4_K_M" mimics llama-quantize's Q4_K_M choices for this arch."""
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"unknown weight type {weight_type!r}; known: {', '.join(WEIGHT_TYPES)}")
    n_layer_all = cfg.n_layer + cfg.nextn_layers
    # llama-quantize counts attn_v and the fused GDN attn_qkv together as "attention-v-like"
    v_like = [s.name for s in specs if s.name.endswith(("attn_v.weight", "attn_qkv.weight"))]
    types: dict[str, Q] = {}
    for s in specs:
        if _keeps_f32(s):
            types[s.name] = Q.F32
            continue
        if weight_type != "q4_K_M":
            want = quant.TYPE_NAMES[weight_type]
        elif s.name == "output.weight" or (cfg.tied_embeddings and s.name == "token_embd.weight"):
            want = Q.Q6_K
        elif s.name in v_like:
            want = Q.Q6_K if _use_more_bits(v_like.index(s.name), len(v_like)) else Q.Q4_K
        elif s.name.endswith("ffn_down.weight"):
            want = Q.Q6_K if _use_more_bits(s.layer, n_layer_all) else Q.Q4_K
        else:
            want = Q.Q4_K
        types[s.name] = quant.fit_type(want, s.n_cols)
    return types


# --- generation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Chunk:
    spec: TensorSpec
    qtype: Q
    rows: tuple[int, int]
    seed: tuple[int, ...]
    random_blocks: bool
    last: bool  # the tensor's final chunk: padding follows


def _draw(rng: np.random.Generator, init: Init, shape: tuple[int, ...]) -> np.ndarray:
    if init.kind == "normal":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(init.b) + np.float32(init.a)
    if init.kind == "neg_exp_uniform":
        return -np.exp(rng.uniform(init.a, init.b, shape)).astype(np.float32)
    raise ValueError(f"unknown init {init.kind!r}")


def _make_chunk(c: _Chunk) -> np.ndarray:
    rng = np.random.default_rng(c.seed)
    r0, r1 = c.rows
    if len(c.spec.shape) == 1:
        return _draw(rng, c.spec.init, c.spec.shape)
    shape = (r1 - r0, c.spec.n_cols)
    if c.random_blocks and c.spec.init.kind == "normal" and c.spec.init.a == 0.0:
        return quant.random_blocks(rng, *shape, c.qtype, c.spec.init.b)
    return quant.encode(_draw(rng, c.spec.init, shape), c.qtype)


def _chunks(
    specs: Sequence[TensorSpec], types: dict[str, Q], seed: int, random_blocks: bool
) -> Iterator[_Chunk]:
    for ti, s in enumerate(specs):
        n_rows = s.shape[0] if len(s.shape) > 1 else 1
        step = max(1, _CHUNK_VALUES // s.n_cols) if len(s.shape) > 1 else 1
        for ci, r0 in enumerate(range(0, n_rows, step)):
            r1 = min(n_rows, r0 + step)
            yield _Chunk(s, types[s.name], (r0, r1), (seed, ti, ci), random_blocks, r1 == n_rows)


def _generate(
    pool: Executor | None, jobs: Iterator[_Chunk], window: int
) -> Iterator[tuple[_Chunk, np.ndarray]]:
    """Chunks in order, at most ``window`` in flight (Executor.map would submit them all at once)."""
    if pool is None:
        for job in jobs:
            yield job, _make_chunk(job)
        return
    pending: list[tuple[_Chunk, Future[np.ndarray]]] = []
    for job in jobs:
        pending.append((job, pool.submit(_make_chunk, job)))
        if len(pending) >= window:
            done, fut = pending.pop(0)
            yield done, fut.result()
    for done, fut in pending:
        yield done, fut.result()


def _encode_given(
    weights: Mapping[str, np.ndarray], jobs: Iterator[_Chunk]
) -> Iterator[tuple[_Chunk, np.ndarray]]:
    """Chunks of given (trained) f32 weights, encoded like drawn ones."""
    for job in jobs:
        data = np.asarray(weights[job.spec.name], dtype=np.float32)
        if data.ndim == 1:
            yield job, np.ascontiguousarray(data)
        else:
            yield job, quant.encode(data[job.rows[0] : job.rows[1]], job.qtype)


def _check_given(weights: Mapping[str, np.ndarray], specs: Sequence[TensorSpec]) -> None:
    names = {s.name for s in specs}
    if set(weights) != names:
        missing, extra = sorted(names - set(weights)), sorted(set(weights) - names)
        raise ValueError(f"weights do not match the config: missing {missing}, unexpected {extra}")
    for s in specs:
        if tuple(np.shape(weights[s.name])) != s.shape:
            raise ValueError(f"{s.name}: shape {np.shape(weights[s.name])}, expected {s.shape}")


def _nbytes(spec: TensorSpec, qtype: Q) -> int:
    rows = spec.n_values // spec.n_cols
    return rows * quant.row_bytes(qtype, spec.n_cols)


# --- the file -----------------------------------------------------------------------------


def _add_hparams(w: gguf.GGUFWriter, cfg: Qwen35Config, weight_type: str) -> None:
    w.add_name(cfg.name)
    w.add_file_type(int(_FILE_TYPES[weight_type]))
    if weight_type not in ("f32", "f16", "bf16"):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(cfg.n_layer + cfg.nextn_layers)
    w.add_context_length(cfg.context_length)
    w.add_embedding_length(cfg.hidden)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_dimension_count(cfg.rope_dim)
    w.add_rope_dimension_sections(cfg.sections)
    w.add_ssm_conv_kernel(cfg.ssm_conv)
    w.add_ssm_inner_size(cfg.value_dim)
    w.add_ssm_state_size(cfg.ssm_state)
    w.add_ssm_time_step_rank(cfg.n_v_heads)
    w.add_ssm_group_count(cfg.n_k_heads)
    w.add_full_attention_interval(cfg.full_attention_interval)
    if cfg.nextn_layers:
        w.add_nextn_predict_layers(cfg.nextn_layers)


def write_qwen35_gguf(
    path: str | os.PathLike[str],
    cfg: Qwen35Config,
    seed: int = 0,
    weight_type: str = "f32",
    progress: bool = False,
    *,
    vocab: BpeVocab | None = None,
    random_blocks: bool | None = None,
    workers: int | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Write a random-weight qwen35 GGUF and return its path.

    ``random_blocks`` (default: only above 1e9 parameters) fills quantised tensors with random
    valid blocks instead of quantising drawn f32 weights: much faster, but the weights then
    differ between types for the same seed. ``workers`` defaults to the CPU count for large
    models and 0 (in-process) for small ones. Output depends only on (cfg, seed, types); the
    file appears under ``path`` once complete. ``weights`` (f32 arrays by GGUF tensor name, in
    numpy shape and with the file's value conventions: norms +1, ``ssm_a = -exp(A_log)``)
    replaces the drawn values, e.g. to export a trained model; ``seed`` is then unused.
    """
    path = Path(path)
    part = path.with_name(path.name + ".part")
    vocab = vocab or load_vocab()
    n_vocab = cfg.n_vocab or vocab.n_vocab
    specs = tensor_specs(cfg, n_vocab)
    types = storage_types(cfg, specs, weight_type)
    n_params = sum(s.n_values for s in specs)
    if weights is not None:
        _check_given(weights, specs)
        random_blocks, workers = False, 0
    if random_blocks is None:
        random_blocks = n_params > 1_000_000_000
    if workers is None:
        workers = (os.cpu_count() or 1) if n_params > 50_000_000 else 0

    w = gguf.GGUFWriter(part, ARCH)
    _add_hparams(w, cfg, weight_type)
    add_vocab_to_gguf(w, vocab, n_vocab)
    for s in specs:
        dtype = np.dtype(np.float16 if types[s.name] == Q.F16 else np.float32)
        w.add_tensor_info(s.name, s.shape, dtype, _nbytes(s, types[s.name]), raw_dtype=types[s.name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    fout = w.fout[0]

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(
            total=sum(_nbytes(s, types[s.name]) for s in specs), unit="B", unit_scale=True, desc=path.name
        )
    pool = ProcessPoolExecutor(workers) if workers > 0 else None
    try:
        w.write_padding(fout, fout.tell())  # the data section starts aligned
        jobs = _chunks(specs, types, seed, random_blocks)
        chunks = (
            _generate(pool, jobs, 2 * max(workers, 1)) if weights is None else _encode_given(weights, jobs)
        )
        for job, chunk in chunks:
            chunk.tofile(fout)
            if job.last:  # tensor offsets in the header assume aligned sizes
                w.write_padding(fout, _nbytes(job.spec, job.qtype))
            if bar is not None:
                bar.update(chunk.nbytes)
    except BaseException:
        w.close()
        part.unlink(missing_ok=True)
        raise
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if bar is not None:
            bar.close()
    w.close()
    part.replace(path)
    return path
