#!/usr/bin/env bash
# Train the pair end to end with one command (on the GPU machine; works on the CPU at --preset tiny):
#   bash tools/train_pair/run.sh OUT_DIR [train.py flags, e.g. --target-minutes 8 --drafter-minutes 6 --seed 0]
# Needs torch, numpy, safetensors, gguf, tokenizers (or dflash's native module) and matplotlib (for the
# plots). A gguf wheel in .whl/ is installed to a temporary folder when gguf is missing (the GPU image lacks it).
# PACK_TO=DIR: afterwards, also write OUT_DIR/export + train.log as a tar in 15 MiB parts to DIR (the device
# tool returns files of at most 16 MiB): cat DIR/pair.tar.part-* | tar x
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: run.sh OUT_DIR [train.py flags]}
shift
py=${PYTHON:-python3}
if ! "$py" -c "import gguf" 2>/dev/null; then
    whl=$(find .whl .carry/whl -maxdepth 1 -name 'gguf-*.whl' 2>/dev/null | sort | head -n 1 || true)
    if [ -z "$whl" ]; then
        echo "run.sh: the gguf package is missing: pip install gguf, or put its wheel in .whl/" >&2
        exit 1
    fi
    "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/train_pair_site "$whl"
    export PYTHONPATH=/tmp/train_pair_site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=.:tools:convert${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
mkdir -p "$out"
"$py" -m train_pair.train --out "$out" "$@" 2>&1 | tee -a "$out/train.log"
if [ -n "${PACK_TO:-}" ]; then
    mkdir -p "$PACK_TO"
    tar -C "$out" -cf - export train.log | split -b 15M - "$PACK_TO/pair.tar.part-"
    (cd "$PACK_TO" && sha256sum pair.tar.part-* >pair.sha256)
fi
