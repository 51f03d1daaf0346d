"""One command: corpus -> target -> regenerated data -> drafter -> acceptance -> export -> plots, card.

    bash tools/train_pair/run.sh runs/pair --target-minutes 8 --drafter-minutes 6
    (= PYTHONPATH=.:tools:convert python -m train_pair.train --out runs/pair ...)

Each stage writes its results under ``--out`` and ``--resume`` skips the stages already done, so a
run can be split over several commands (e.g. the device tool's 10-minute limit per command).
Layout: corpus/ (token arrays, manifest), target/ (checkpoint, log, f32 GGUF), regen/ (regenerated
data), drafter/ (checkpoint, log), export/ (the shippable files: target-q8_0.gguf, drafter/ in
z-lab's layout, drafter-q8_0.gguf from convert-draft, loss PNGs, MODEL_CARD.md, summary.json,
heldout_prompts.jsonl).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import corpus, presets
from .checkpoint import load_drafter, load_target, save_drafter, save_target
from .drafter import DrafterConfig
from .evaluate import chain_acceptance
from .export import convert_drafter, export_drafter_dir, export_target
from .loop import Budget
from .regen import Regenerated, regenerate
from .report import model_card, plot_curves
from .train_drafter import train_drafter
from .train_target import train_target

STAGES = ("corpus", "target", "regen", "drafter", "eval", "export", "report")


def _json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def _load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _settings_overrides(items: list[str]) -> dict[str, object]:
    types = {f.name: f.type for f in fields(presets.TrainSettings)}
    out: dict[str, object] = {}
    for item in items:
        key, _, val = item.partition("=")
        if key not in types:
            raise SystemExit(f"--set: unknown setting {key!r}; known: {', '.join(types)}")
        out[key] = float(val) if types[key] in (float, "float") else int(val)
    return out


def drafter_config(p: presets.Preset) -> DrafterConfig:
    from dflash.synth.tokenizer import MASK, load_vocab

    t = p.target
    return DrafterConfig(
        hidden=t.hidden,
        num_target_layers=t.n_layer,
        vocab=t.n_vocab,
        mask_token_id=load_vocab().token_id(MASK),
        n_layers=p.drafter_layers,
        n_heads=p.drafter_heads,
        n_kv_heads=p.drafter_kv_heads,
        head_dim=p.drafter_head_dim,
        ffn=p.drafter_ffn,
        rope_theta=t.rope_theta,
        rms_eps=t.rms_eps,
        max_position_embeddings=t.context_length,
    )


def _save_regen(path: Path, r: Regenerated) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, tokens=r.tokens, prompt_len=r.prompt_len, seconds=r.seconds)


def _load_regen(path: Path) -> Regenerated:
    z = np.load(path)
    return Regenerated(z["tokens"], z["prompt_len"], float(z["seconds"]))


def run(a: argparse.Namespace) -> dict[str, Any]:
    out: Path = a.out
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    )
    if device.type == "cpu":  # small CPU ops lose badly to thread contention on shared cores
        torch.set_num_threads(a.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    preset = presets.get(a.preset, **_settings_overrides(a.set))
    s = preset.train
    summary_path = out / "export" / "summary.json"
    summary: dict[str, Any] = _load_json(summary_path) if a.resume and summary_path.exists() else {}
    summary.update(
        command=" ".join(shlex.quote(x) for x in sys.argv),
        seed=a.seed,
        preset=a.preset,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        torch=torch.__version__,
    )
    summary.setdefault("started", dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))

    def done(stage: str, *paths: Path) -> bool:
        return a.resume and all(p.exists() for p in paths) and stage in summary

    clock = [time.time()]

    def finish(stage: str) -> bool:
        _json(summary_path, summary)
        print(f"[train] stage {stage} done ({time.time() - clock[0]:.1f}s)", flush=True)
        clock[0] = time.time()
        return stage == a.stop_after

    # corpus
    cdir = out / "corpus"
    if not done("corpus", cdir / "manifest.json"):
        m = corpus.build(cdir, a.tokenizer, a.heldout_permille, a.max_files, a.check_tokenizer, a.corpus_root)
        summary["corpus"] = {k: v for k, v in m.items() if k != "files"}
    if finish("corpus"):
        return summary
    train_ids, held_ids = np.load(cdir / "train.npy"), np.load(cdir / "heldout.npy")
    need = max(s.seq_len, s.prompt_max) + 1
    if min(train_ids.size, held_ids.size) < need:
        raise SystemExit(
            f"corpus too small: train {train_ids.size}, held-out {held_ids.size} tokens, need {need}"
        )

    # target
    tdir = out / "target"
    if done("target", tdir / "model.pt"):
        target = load_target(tdir / "model.pt", device)
    else:
        budget = Budget(a.target_minutes, a.target_steps)
        target, tlog = train_target(preset.target, s, train_ids, held_ids, budget, device, a.seed, a.compile)
        save_target(target, tdir / "model.pt")
        _json(tdir / "log.json", vars(tlog))
        tail = tlog.loss[-10:] or [float("nan")]
        summary["target"] = {
            "config": asdict(preset.target),
            "settings": asdict(s),
            "params": tlog.params,
            "steps": budget.step,
            "seconds": tlog.seconds,
            "tokens_seen": budget.step * s.batch * s.seq_len,
            "tokens_per_second": tlog.tokens_per_second,
            "final_train_loss": float(np.mean(tail)),
            "heldout_loss": tlog.eval_loss[-1],
            "heldout_ppl": float(np.exp(tlog.eval_loss[-1])),
        }
    if finish("target"):
        return summary

    # regenerated data: training-file prompts for the drafter and, with other seeds, for its
    # validation; held-out-file prompts for the reported acceptance
    rdir = out / "regen"
    names = ("train", "val", "heldout")
    if done("regen", *(rdir / f"{n}.npz" for n in names)):
        regen, regen_val, regen_held = (_load_regen(rdir / f"{n}.npz") for n in names)
    else:
        args = (s.regen_len, s.prompt_min, s.prompt_max, s.regen_batch, device)
        regen = regenerate(target, train_ids, a.regen_seqs, a.regen_minutes, *args, seed=a.seed + 1)
        regen_val = regenerate(target, train_ids, s.val_prompts, 0, *args, seed=a.seed + 4)
        regen_held = regenerate(target, held_ids, s.eval_prompts, 0, *args, seed=a.seed + 3)
        for n, r in zip(names, (regen, regen_val, regen_held), strict=True):
            _save_regen(rdir / f"{n}.npz", r)
        summary["regen"] = {
            "sequences": int(regen.tokens.shape[0]),
            "length": s.regen_len,
            "prompt_min": s.prompt_min,
            "prompt_max": s.prompt_max,
            "generated_tokens": regen.generated_tokens,
            "seconds": regen.seconds,
        }
    if finish("regen"):
        return summary

    # drafter
    ddir = out / "drafter"
    if done("drafter", ddir / "model.pt"):
        drafter = load_drafter(ddir / "model.pt", device)
    else:
        budget = Budget(a.drafter_minutes, a.drafter_steps)
        dcfg = drafter_config(preset)
        val = (regen_val.tokens, regen_val.prompt_len)
        drafter, dlog = train_drafter(
            target, dcfg, s, regen.tokens, regen.prompt_len, val, budget, device, a.seed + 2
        )
        save_drafter(drafter, ddir / "model.pt")
        _json(ddir / "log.json", vars(dlog))
        summary["drafter"] = {
            "config": dcfg.hf_config(),
            "settings": asdict(s),
            "params": dlog.params,
            "steps": budget.step,
            "blocks": dlog.blocks,
            "seconds": dlog.seconds,
            "final_loss": float(np.mean(dlog.loss[-10:])),
            "final_accept": float(np.mean(dlog.accept[-10:])),
            "best_step": dlog.best_step,
            "best_val_accept": max(dlog.val_accept),
            "val_prompts": int(regen_val.tokens.shape[0]),
            "slot_accuracy": dlog.slot_acc,
        }
    if finish("drafter"):
        return summary

    # held-out acceptance
    if not done("acceptance"):
        n_eval = s.eval_prompts
        held = chain_acceptance(target, drafter, regen_held.tokens, regen_held.prompt_len, device)
        train = chain_acceptance(target, drafter, regen.tokens[:n_eval], regen.prompt_len[:n_eval], device)
        summary["acceptance"] = {
            "heldout": {**held.as_dict(), "prompts": int(regen_held.tokens.shape[0])},
            "train": {**train.as_dict(), "prompts": int(min(n_eval, regen.tokens.shape[0]))},
        }
        print(
            f"[train] held-out acceptance length {held.mean:.2f} (train prompts {train.mean:.2f})", flush=True
        )
    if finish("eval"):
        return summary

    # export
    edir = out / "export"
    if not done("files", edir / "target-q8_0.gguf", edir / "drafter-q8_0.gguf"):
        export_target(target, tdir / "target-f32.gguf", "f32")
        export_target(target, edir / "target-q8_0.gguf", "q8_0")
        export_drafter_dir(drafter, edir / "drafter")
        convert_drafter(edir / "drafter", edir / "drafter-q8_0.gguf", "q8_0", edir / "target-q8_0.gguf")
        with open(edir / "heldout_prompts.jsonl", "w", encoding="utf-8") as f:
            for row, p in zip(regen_held.tokens, regen_held.prompt_len, strict=True):
                f.write(
                    json.dumps({"prompt": corpus.decode(row[:p].tolist()), "prompt_tokens": int(p)}) + "\n"
                )
        files = [edir / "target-q8_0.gguf", edir / "drafter-q8_0.gguf", *sorted((edir / "drafter").iterdir())]
        summary["files"] = {str(f.relative_to(edir)): f.stat().st_size for f in files}
        summary["files"]["target/target-f32.gguf (not shipped)"] = (tdir / "target-f32.gguf").stat().st_size
    if finish("export"):
        return summary

    # plots + card
    plots = plot_curves(_load_json(tdir / "log.json"), _load_json(ddir / "log.json"), edir)
    (edir / "MODEL_CARD.md").write_text(model_card(summary, [p.name for p in plots]), encoding="utf-8")
    summary["report"] = True
    finish("report")
    return summary


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m train_pair.train", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--preset", choices=sorted(presets.PRESETS), default="default")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto | cuda | cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads when --device is cpu")
    p.add_argument("--target-minutes", type=float, default=8.0)
    p.add_argument("--target-steps", type=int, default=0, help="exact step count (overrides minutes)")
    p.add_argument("--regen-minutes", type=float, default=1.5)
    p.add_argument(
        "--regen-seqs", type=int, default=0, help="regenerated sequences (0: as many as time allows)"
    )
    p.add_argument("--drafter-minutes", type=float, default=6.0)
    p.add_argument("--drafter-steps", type=int, default=0, help="exact step count (overrides minutes)")
    p.add_argument("--max-files", type=int, default=0, help="corpus: first N files only (smoke runs)")
    p.add_argument(
        "--corpus-root", type=Path, help="corpus: another stdlib tree (default: this interpreter's)"
    )
    p.add_argument("--heldout-permille", type=int, default=20, help="corpus: held-out share of files")
    p.add_argument("--tokenizer", choices=["auto", "core", "tokenizers"], default="auto")
    p.add_argument("--check-tokenizer", action="store_true", help="corpus: compare both tokenizer backends")
    p.add_argument("--compile", action="store_true", help="torch.compile the target for training")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a TrainSettings field"
    )
    p.add_argument("--resume", action="store_true", help="skip the stages whose outputs exist")
    p.add_argument(
        "--stop-after", choices=STAGES, help="stop after this stage (continue later with --resume)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
