"""Byte-level BPE vocab for synthetic models: train it once, commit it, load it with json only.

The committed vocab (``dflash/data/bpe-4096.json``) was trained by :func:`train_bpe` on the
top-level ``*.py`` files of the CPython 3.11.7 standard library (168 files, 4,698,388 bytes,
sorted by name; see the ``corpus`` field of the file). Training needs the ``tokenizers``
package; loading the result into a GGUF needs neither it nor the corpus.
"""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf

FORMAT = "dflash-bpe-1"
# Upstream llama.cpp knows this pre-tokenizer name and applies the Qwen3.5 split regex for it.
PRE_TOKENIZER = "qwen35"
# The Qwen3.5 split regex from its tokenizer.json, used so that training sees the same pieces.
QWEN35_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK = "<|mask|>"
# Control tokens are only matched when special parsing is on; user-defined ones always are
# (Qwen marks <think> and friends as added, non-special tokens).
SPECIAL_TOKENS: tuple[tuple[str, str], ...] = (
    (ENDOFTEXT, "control"),
    (IM_START, "control"),
    (IM_END, "control"),
    (MASK, "control"),
    ("<think>", "user_defined"),
    ("</think>", "user_defined"),
    ("<tool_call>", "user_defined"),
    ("</tool_call>", "user_defined"),
)
_TOKEN_TYPES = {
    "normal": gguf.TokenType.NORMAL,
    "control": gguf.TokenType.CONTROL,
    "user_defined": gguf.TokenType.USER_DEFINED,
}

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CHAT_TEMPLATE_FILE = DATA_DIR / "chatml.jinja"


@dataclass(frozen=True)
class BpeVocab:
    """A trained byte-level BPE: merged tokens first, special tokens at the end."""

    tokens: list[str]
    merges: list[str]
    specials: list[tuple[str, str]]

    @property
    def all_tokens(self) -> list[str]:
        return self.tokens + [s for s, _ in self.specials]

    @property
    def n_vocab(self) -> int:
        return len(self.tokens) + len(self.specials)

    def token_id(self, text: str) -> int:
        return self.all_tokens.index(text)

    def token_types(self) -> list[int]:
        types = [int(gguf.TokenType.NORMAL)] * len(self.tokens)
        return types + [int(_TOKEN_TYPES[t]) for _, t in self.specials]


def default_vocab_path(size: int = 4096) -> Path:
    return DATA_DIR / f"bpe-{size}.json"


def load_vocab(path: str | Path | None = None) -> BpeVocab:
    data = json.loads(Path(path or default_vocab_path()).read_text(encoding="utf-8"))
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} vocab file")
    return BpeVocab(
        tokens=list(data["tokens"]),
        merges=list(data["merges"]),
        specials=[(s["content"], s["type"]) for s in data["special_tokens"]],
    )


def chat_template() -> str:
    return CHAT_TEMPLATE_FILE.read_text(encoding="utf-8")


def add_vocab_to_gguf(writer: gguf.GGUFWriter, vocab: BpeVocab, n_vocab: int | None = None) -> None:
    """Write the tokenizer keys upstream llama.cpp needs for a "gpt2" BPE vocab.

    ``n_vocab`` larger than the vocab pads with unique unused tokens, the way the HF converter
    pads Qwen vocabularies to the embedding size.
    """
    tokens = vocab.all_tokens
    types = vocab.token_types()
    n_vocab = n_vocab or len(tokens)
    if n_vocab < len(tokens):
        raise ValueError(f"n_vocab {n_vocab} is smaller than the vocab ({len(tokens)} tokens)")
    tokens += [f"[PAD{i}]" for i in range(len(tokens), n_vocab)]
    types += [int(gguf.TokenType.UNUSED)] * (n_vocab - len(types))

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(PRE_TOKENIZER)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.token_id(ENDOFTEXT))
    writer.add_eos_token_id(vocab.token_id(IM_END))
    writer.add_eot_token_id(vocab.token_id(IM_END))
    writer.add_pad_token_id(vocab.token_id(ENDOFTEXT))
    writer.add_mask_token_id(vocab.token_id(MASK))
    writer.add_add_bos_token(False)
    writer.add_chat_template(chat_template())


# --- training (needs the optional `tokenizers` package) -------------------------------------


def stdlib_corpus_files() -> list[Path]:
    """The training corpus: the top-level ``*.py`` files of this interpreter's stdlib."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def _read_texts(files: Sequence[Path]) -> Iterable[str]:
    for f in files:
        yield f.read_text(encoding="utf-8", errors="replace")


def train_bpe(vocab_size: int, out: str | Path, files: Sequence[Path] | None = None) -> BpeVocab:
    """Train a byte-level BPE of ``vocab_size`` tokens in total (specials included) and save it."""
    import platform

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    files = list(files) if files is not None else stdlib_corpus_files()
    n_bpe = vocab_size - len(SPECIAL_TOKENS)
    if n_bpe <= 256:
        raise ValueError("vocab_size must leave room for the 256 byte tokens and the specials")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=n_bpe,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(_read_texts(files), trainer)

    model = json.loads(tok.to_str())["model"]
    by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise RuntimeError("trained vocab ids are not contiguous")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    vocab = BpeVocab(tokens=[t for t, _ in by_id], merges=merges, specials=list(SPECIAL_TOKENS))

    data = {
        "format": FORMAT,
        "pre_tokenizer": PRE_TOKENIZER,
        "corpus": {
            "description": "top-level *.py files of the Python standard library, sorted by name",
            "python": platform.python_version(),
            "bytes": sum(f.stat().st_size for f in files),
            "files": [f.name for f in files],
        },
        "special_tokens": [{"content": s, "type": t} for s, t in vocab.specials],
        "tokens": vocab.tokens,
        "merges": vocab.merges,
    }
    Path(out).write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    return vocab
