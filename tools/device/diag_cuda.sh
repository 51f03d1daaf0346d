#!/usr/bin/env bash
# GPU: build, then the smallest CUDA engine runs (tools/device/diag_cuda.py) under
# compute-sanitizer, which names the faulting kernel when a CUDA error needs chasing.
cd "$(dirname "$0")/../.." || exit 1
source tools/device/setup.sh > /tmp/setup.log 2>&1
set +e +u +o pipefail
tail -n 2 /tmp/setup.log
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for p in tiny-a tiny-b; do
  timeout 120 "$CS" --tool memcheck --print-limit 3 python3 tools/device/diag_cuda.py "$p" 2>&1 \
    | grep -v "Host Frame" | head -40
done
