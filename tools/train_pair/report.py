"""Loss-curve PNGs and the model card (markdown) from a run's ``summary.json`` and logs."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _smooth(xs: list[float], k: int = 20) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x - (xs[i - k] if i >= k else 0.0)
        out.append(acc / min(i + 1, k))
    return out


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
    ax.plot([s * per_step / 1e6 for s in target_log["eval_steps"]], target_log["eval_loss"], "o-", color="C1",
            label="held-out")
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
    ax2.plot(drafter_log["steps"], _smooth(drafter_log["accept"]), color="C2", label="train acceptance length")
    ax2.set_ylabel("acceptance length (batch, greedy)")
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


def model_card(s: dict[str, Any]) -> str:
    c, t, r, d, a = s["corpus"], s["target"], s["regen"], s["drafter"], s["acceptance"]
    tc, dc = t["config"], d["config"]
    tr, ho = c["totals"]["train"], c["totals"]["heldout"]
    hist = a["heldout"]["histogram"]
    lines = [
        "# dflash pair: a small qwen35 target and its DFlash drafter",
        "",
        "Trained from scratch by `tools/train_pair` (issue 5) so that speculative decoding can be measured",
        "with a drafter that actually predicts its target. Not a useful language model: it writes",
        "Python-standard-library-like code.",
        "",
        f"Command: `{s['command']}`  ",
        f"Seed {s['seed']}, preset `{s['preset']}`, device {s['device']}, torch {s['torch']}, {s['started']}.",
        "",
        "## Corpus",
        "",
        f"All `*.py` files of the Python {c['python']} standard library ({c['stdlib_root']}, recursive, "
        "no site-packages), one document per file, `<|endoftext|>` after each; "
        f"{len(c['skipped'])} non-UTF-8 files skipped. Split by file: sha256(path) % 1000 < "
        f"{c['heldout_permille']} is held out. Every file, its bytes, tokens and split: `corpus/manifest.json`.",
        "",
        "| split | files | bytes | tokens |",
        "| --- | ---: | ---: | ---: |",
        f"| train | {tr['files']} | {tr['bytes']:,} | {tr['tokens']:,} |",
        f"| held-out | {ho['files']} | {ho['bytes']:,} | {ho['tokens']:,} |",
        "",
        f"Tokenizer: the committed byte-level BPE `dflash/data/{c['tokenizer']['vocab']}` (4096 tokens, Qwen3.5 "
        "pre-tokenizer regex; trained on the top-level stdlib files of CPython 3.11.7, so it has seen some "
        f"held-out files), encoded with `{c['tokenizer']['backend']}`"
        + (
            f"; checked against `{c['tokenizer']['checked_against']}` on every file: "
            f"{len(c['tokenizer']['mismatched_files'])} mismatches."
            if c["tokenizer"]["checked_against"]
            else "."
        ),
        "",
        "## Target (`qwen35`)",
        "",
        f"{tc['n_layer']} layers (full attention every {tc['full_attention_interval']}th, the rest Gated DeltaNet), "
        f"hidden {tc['hidden']}, FFN {tc['n_ff']}, attention {tc['n_head']}/{tc['n_head_kv']} heads x "
        f"{tc['head_dim']} (IMROPE on {tc['rope_dim']} dims, theta {tc['rope_theta']:g}), GDN "
        f"{tc['n_v_heads']} V / {tc['n_k_heads']} K heads x {tc['ssm_state']}, conv {tc['ssm_conv']}, vocab "
        f"{tc['n_vocab']}, untied head: {t['params']:,} parameters.",
        "",
        f"Training: {t['steps']:,} steps of {t['settings']['batch']} x {t['settings']['seq_len']} tokens "
        f"({t['tokens_seen'] / 1e6:.0f}M tokens, {t['tokens_seen'] / max(tr['tokens'], 1):.1f} epochs) in "
        f"{t['seconds'] / 60:.1f} min ({t['tokens_per_second'] / 1e3:.0f}k tokens/s), AdamW peak lr "
        f"{t['settings']['lr']:g}, cosine, bf16 autocast. Final train loss {t['final_train_loss']:.3f}; held-out "
        f"loss {t['heldout_loss']:.3f} nats/token (perplexity {t['heldout_ppl']:.2f}).",
        "",
        "![target loss](target_loss.png)",
        "",
        "## Drafter (DFlash)",
        "",
        f"{dc['num_hidden_layers']} Qwen3 layers ({', '.join(dc['layer_types'])}; sliding window "
        f"{dc['sliding_window']}; sliding layers causal inside the block, the full layer bidirectional), hidden "
        f"{dc['hidden_size']}, {dc['num_attention_heads']}/{dc['num_key_value_heads']} heads x {dc['head_dim']}, "
        f"FFN {dc['intermediate_size']}, block {dc['block_size']}, mask token {dc['dflash_config']['mask_token_id']}, "
        f"features of target layers {dc['dflash_config']['target_layer_ids']}; embedding and LM head shared with "
        f"the target (frozen): {d['params']:,} own parameters.",
        "",
        f"Data: {r['sequences']:,} target-regenerated sequences of {r['length']} tokens (prompts of "
        f"{r['prompt_min']}-{r['prompt_max']} corpus tokens starting at a line, continued greedily by the trained "
        f"target: {r['generated_tokens'] / 1e6:.1f}M generated tokens in {r['seconds'] / 60:.1f} min).",
        f"Training: {d['steps']:,} steps of {d['settings']['d_batch']} sequences x {d['blocks']} random anchors "
        f"in {d['seconds'] / 60:.1f} min, position-weighted cross-entropy (gamma {d['settings']['gamma']:g}), "
        f"AdamW peak lr {d['settings']['d_lr']:g}. Final loss {d['final_loss']:.3f}, train-batch acceptance "
        f"{d['final_accept']:.2f}.",
        "",
        "![drafter loss](drafter_loss.png)",
        "",
        "## Held-out acceptance",
        "",
        f"Greedy chain decoding simulated in PyTorch (bf16) with block {dc['block_size']}: "
        f"{a['heldout']['prompts']} held-out prompts continued to {r['length']} tokens by the target.",
        "",
        "| prompts | verify steps | acceptance length (tau) |",
        "| --- | ---: | ---: |",
        f"| held-out files | {a['heldout']['steps']:,} | **{a['heldout']['mean']:.2f}** |",
        f"| training files (regenerated data) | {a['train']['steps']:,} | {a['train']['mean']:.2f} |",
        "",
        "Acceptance-length histogram (held-out, AL 1..16): " + ", ".join(str(x) for x in hist),
        "",
        "## Files",
        "",
        "| file | size |",
        "| --- | ---: |",
        *[f"| `{k}` | {_mib(v)} |" for k, v in s["files"].items()],
        "",
        "The target GGUFs carry the BPE and chat template; the drafter GGUF was made by `convert-draft "
        "drafter/ --target target-q8_0.gguf` from the z-lab-layout `drafter/` directory.",
        "",
    ]
    return "\n".join(lines)
