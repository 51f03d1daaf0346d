"""Loss-curve PNGs and the model card (markdown) from a run's ``summary.json`` and logs.

Re-render a card (e.g. with the results of ``dflash bench --pair``, run on the installed pair):

    PYTHONPATH=.:tools python -m train_pair.report dflash/data/pair --bench bench/results/pair-T.json
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PLOTS = {"target_loss.png": "target loss", "drafter_loss.png": "drafter loss"}


def _smooth(xs: list[float]) -> list[float]:
    """Centred moving average over about 2% of the points (a trailing one lags a falling curve)."""
    h = max(1, len(xs) // 100)
    return [sum(xs[max(0, i - h) : i + h + 1]) / len(xs[max(0, i - h) : i + h + 1]) for i in range(len(xs))]


def plot_curves(target_log: dict[str, Any], drafter_log: dict[str, Any], out_dir: Path) -> list[Path]:
    """target_loss.png and drafter_loss.png; none when matplotlib is missing (CPU smoke runs)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[report] matplotlib not installed: no PNG plots", flush=True)
        return []
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    tok = [t / 1e6 for t in target_log["tokens"]]
    ax.plot(tok, target_log["loss"], alpha=0.3, color="C0")
    ax.plot(tok, _smooth(target_log["loss"]), color="C0", label="train (smoothed)")
    per_step = target_log["tokens"][0] / max(target_log["steps"][0], 1) if target_log["steps"] else 0
    ax.plot(
        [s * per_step / 1e6 for s in target_log["eval_steps"]],
        target_log["eval_loss"],
        "o-",
        color="C1",
        label="held-out",
    )
    ax.set(xlabel="training tokens (M)", ylabel="cross-entropy (nats/token)", title="qwen35 target")
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(out_dir / "target_loss.png")
    fig.tight_layout()
    fig.savefig(paths[-1])
    plt.close(fig)

    fig, ax1 = plt.subplots(figsize=(7, 4), dpi=110)
    ax1.plot(drafter_log["steps"], drafter_log["loss"], alpha=0.3, color="C0")
    ax1.plot(drafter_log["steps"], _smooth(drafter_log["loss"]), color="C0", label="weighted CE (smoothed)")
    ax1.set(xlabel="step", ylabel="position-weighted cross-entropy", title="DFlash drafter")
    ax2 = ax1.twinx()
    ax2.plot(
        drafter_log["steps"], _smooth(drafter_log["accept"]), color="C2", label="train acceptance length"
    )
    ax2.plot(
        drafter_log["val_steps"], drafter_log["val_accept"], "o-", color="C3", label="validation chain AL"
    )
    ax2.set_ylabel("acceptance length (greedy, block 16)")
    ax1.grid(alpha=0.3)
    lines = ax1.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax1.legend(lines, [ln.get_label() for ln in lines], loc="center right")
    paths.append(out_dir / "drafter_loss.png")
    fig.tight_layout()
    fig.savefig(paths[-1])
    plt.close(fig)
    return paths


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _tokens(n: float) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n / 1e3:.1f}k" if n >= 1e3 else f"{n:.0f}"


def _plot(name: str, plots: Sequence[str] | None) -> list[str]:
    if plots is not None and name not in plots:
        return [f"(No {PLOTS[name]} plot: matplotlib was not installed for this run.)", ""]
    return [f"![{PLOTS[name]}]({name})", ""]


def _corpus(c: dict[str, Any]) -> list[str]:
    tr, ho, tok = c["totals"]["train"], c["totals"]["heldout"], c["tokenizer"]
    check = (
        f"; checked against `{tok['checked_against']}` on every file: "
        f"{len(tok['mismatched_files'])} mismatches"
        if tok["checked_against"]
        else ""
    )
    src = (
        f"the Python {c['python']} standard library"
        if c.get("source", "interpreter") == "interpreter"
        else "a given standard-library tree"
    )
    return [
        "## Corpus",
        "",
        f"All `*.py` files of {src} ({c['stdlib_root']}, recursive, no site-packages), one document per "
        f"file, `<|endoftext|>` after each; {len(c['skipped'])} non-UTF-8 files skipped. Split by file: "
        f"sha256(path) % 1000 < {c['heldout_permille']} is held out. Every file with its bytes, tokens and "
        "split: `corpus/manifest.json` of the run.",
        "",
        "| split | files | bytes | tokens |",
        "| --- | ---: | ---: | ---: |",
        f"| train | {tr['files']} | {tr['bytes']:,} | {tr['tokens']:,} |",
        f"| held-out | {ho['files']} | {ho['bytes']:,} | {ho['tokens']:,} |",
        "",
        f"Tokenizer: the committed byte-level BPE `dflash/data/{tok['vocab']}` (4096 tokens, Qwen3.5 "
        "pre-tokenizer regex; trained on the top-level stdlib files of CPython 3.11.7, so it has seen some "
        f"held-out files), encoded with `{tok['backend']}`{check}.",
        "",
    ]


def _target(t: dict[str, Any], c: dict[str, Any], precision: str, plots: Sequence[str] | None) -> list[str]:
    tc, st = t["config"], t["settings"]
    epochs = t["tokens_seen"] / max(c["totals"]["train"]["tokens"], 1)
    return [
        "## Target (`qwen35`)",
        "",
        f"{tc['n_layer']} layers (layer i is full attention when (i+1) % "
        f"{tc['full_attention_interval']} == 0, "
        f"the others Gated DeltaNet), hidden {tc['hidden']}, FFN {tc['n_ff']}, attention "
        f"{tc['n_head']}/{tc['n_head_kv']} heads x {tc['head_dim']} (IMROPE on {tc['rope_dim']} dims, theta "
        f"{tc['rope_theta']:g}), GDN {tc['n_v_heads']} V / {tc['n_k_heads']} K heads x {tc['ssm_state']}, "
        "conv "
        f"{tc['ssm_conv']}, vocab {tc['n_vocab']}, untied head: {t['params']:,} parameters.",
        "",
        f"Training: {t['steps']:,} steps of {st['batch']} x {st['seq_len']} tokens "
        f"({_tokens(t['tokens_seen'])} tokens, {epochs:.1f} epochs) in {t['seconds'] / 60:.1f} min "
        f"({t['tokens_per_second'] / 1e3:.0f}k tokens/s), AdamW peak lr {st['lr']:g}, cosine, {precision}. "
        f"Final train loss {t['final_train_loss']:.3f}; held-out loss {t['heldout_loss']:.3f} nats/token "
        f"(perplexity {t['heldout_ppl']:.2f}).",
        "",
        *_plot("target_loss.png", plots),
    ]


def _drafter(d: dict[str, Any], r: dict[str, Any], plots: Sequence[str] | None) -> list[str]:
    dc, st = d["config"], d["settings"]
    return [
        "## Drafter (DFlash)",
        "",
        f"{dc['num_hidden_layers']} Qwen3 layers ({', '.join(dc['layer_types'])}; sliding window "
        f"{dc['sliding_window']}; sliding layers causal inside the block, the full layer bidirectional), "
        f"hidden {dc['hidden_size']}, {dc['num_attention_heads']}/{dc['num_key_value_heads']} heads x "
        f"{dc['head_dim']}, FFN {dc['intermediate_size']}, block {dc['block_size']}, mask token "
        f"{dc['dflash_config']['mask_token_id']}, features of target layers "
        f"{dc['dflash_config']['target_layer_ids']}; embedding and LM head shared with the target (frozen): "
        f"{d['params']:,} own parameters.",
        "",
        f"Data: {r['sequences']:,} target-regenerated sequences of {r['length']} tokens (prompts of "
        f"{r['prompt_min']}-{r['prompt_max']} corpus tokens starting at a line, continued greedily by the "
        f"trained target: {_tokens(r['generated_tokens'])} generated tokens in "
        f"{r['seconds'] / 60:.1f} min).",
        f"Training: {d['steps']:,} steps of {st['d_batch']} sequences x {d['blocks']} random anchors in "
        f"{d['seconds'] / 60:.1f} min, position-weighted cross-entropy (gamma {st['gamma']:g}), AdamW peak "
        "lr "
        f"{st['d_lr']:g}. Final loss {d['final_loss']:.3f}, train-batch acceptance {d['final_accept']:.2f}. "
        f"Kept: the state of step {d['best_step']:,}, best chain acceptance on {d['val_prompts']} fresh "
        f"training-file prompts ({d['best_val_accept']:.2f}).",
        "",
        *_plot("drafter_loss.png", plots),
    ]


def _acceptance(a: dict[str, Any], bs: int, length: int, precision: str) -> list[str]:
    h, t = a["heldout"], a["train"]
    return [
        "## Held-out acceptance",
        "",
        f"Greedy chain decoding simulated in PyTorch ({precision}) with block {bs}: {h['prompts']} held-out "
        f"prompts continued to {length} tokens by the target; the next anchor is always the target's token.",
        "",
        "| prompts | verify steps | acceptance length (tau) |",
        "| --- | ---: | ---: |",
        f"| held-out files | {h['steps']:,} | **{h['mean']:.2f}** |",
        f"| training files (regenerated data) | {t['steps']:,} | {t['mean']:.2f} |",
        "",
        f"Acceptance-length histogram (held-out, AL 1..{bs}): " + ", ".join(str(x) for x in h["histogram"]),
        "",
    ]


def _time(s: dict[str, Any]) -> list[str]:
    parts = {"target": s["target"]["seconds"], "regeneration": s["regen"]["seconds"]}
    parts["drafter"] = s["drafter"]["seconds"]
    each = ", ".join(f"{k} {v / 60:.1f} min" for k, v in parts.items())
    return [f"Training time: {sum(parts.values()) / 60:.1f} min on {s['device']} ({each}).", ""]


def _bench(doc: dict[str, Any]) -> list[str]:
    from dflash.bench_pair_summary import markdown

    return ["## Speed (`dflash bench --pair`)", "", markdown(doc).rstrip("\n"), ""]


def _use() -> list[str]:
    return [
        "## Use",
        "",
        "Installed by `tools/train_pair/install.py` as dflash's embedded default (`dflash/data/pair/`): "
        "`dflash.Engine()`, `dflash generate` and `dflash-serve` without a model load this target with this "
        "drafter (chain DFlash; `budget=N` for DDTree).",
        "",
    ]


def model_card(
    s: dict[str, Any], plots: Sequence[str] | None = None, bench: dict[str, Any] | None = None
) -> str:
    """The card; `plots`: the PNG names written (None: link both), `bench`: a `dflash bench --pair` JSON."""
    precision = "bf16 autocast" if s["device"] != "CPU" else "float32"
    bs = s["drafter"]["config"]["block_size"]
    lines = [
        "# dflash pair: a small qwen35 target and its DFlash drafter",
        "",
        "Trained from scratch by `tools/train_pair` (issue 5) so that speculative decoding can be measured",
        "with a drafter that actually predicts its target. Not a useful language model: it writes",
        "Python-standard-library-like code.",
        "",
        f"Command: `{s['command']}`  ",
        f"Seed {s['seed']}, preset `{s['preset']}`, {s['device']}, torch {s['torch']}, {s['started']}.",
        "",
        *_time(s),
        *_corpus(s["corpus"]),
        *_target(s["target"], s["corpus"], precision, plots),
        *_drafter(s["drafter"], s["regen"], plots),
        *_acceptance(s["acceptance"], bs, s["regen"]["length"], precision),
        *(_bench(bench) if bench else []),
        "## Files",
        "",
        "| file | size |",
        "| --- | ---: |",
        *[f"| `{k}` | {_mib(v)} |" for k, v in s["files"].items()],
        "",
        "The target GGUF carries the BPE and the chat template; `drafter-q8_0.gguf` was made by "
        "`convert-draft drafter/ --target target-q8_0.gguf --outtype q8_0` from the z-lab-layout `drafter/`.",
        "",
        *_use(),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m train_pair.report", description="Re-render MODEL_CARD.md.")
    p.add_argument("dir", type=Path, help="a run's export/ or an installed pair folder (with summary.json)")
    p.add_argument("--bench", type=Path, help="a `dflash bench --pair` JSON to add as the speed section")
    p.add_argument("-o", "--out", type=Path, help="default: DIR/MODEL_CARD.md")
    a = p.parse_args(argv)
    summary = json.loads((a.dir / "summary.json").read_text(encoding="utf-8"))
    bench = json.loads(a.bench.read_text(encoding="utf-8")) if a.bench else None
    plots = [name for name in PLOTS if (a.dir / name).is_file()]
    out = a.out or a.dir / "MODEL_CARD.md"
    out.write_text(model_card(summary, plots, bench), encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
