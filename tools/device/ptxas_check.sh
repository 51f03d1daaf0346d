#!/usr/bin/env bash
# The tensor-core GEMM's kernels through ptxas for sm_90a without a GPU: registers, spills, and
# ptxas's wgmma serialization advisories (C7514 / C7515: it waits after every wgmma, which
# silently undoes a pipelined kernel). Needs nvcc (CUDA 13, as on the H200) and cuBLAS's headers
# (ggml-cuda's common.cuh includes them): CUBLAS_INCLUDE, e.g. the include folder of an unzipped
# `pip download --no-deps nvidia-cublas` wheel (nvidia/cu13/include). The patched upstream tree
# comes from vendor/materialise.py.
#
#   CUBLAS_INCLUDE=/tmp/cublas/x/nvidia/cu13/include bash tools/device/ptxas_check.sh [regex]
#
# The GEMM's files (gemm_kquant_mma.cu, gemm_mma_*.cu, gemm_q4k_wgmma_forms.cu: gemm_mma_forms.cuh),
# compiled side by side, or only those PTXAS_FILES names (e.g. "gemm_mma_q4k.cu": ~70 s against
# ~4 min for all on this 2-core machine). Prints one line a kernel whose mangled name matches regex
# (default: wgmma), then the advisories; exits 1 when any kernel spills or is serialized, 2 when a
# file does not compile. With cuobjdump (CUOBJDUMP, or on PATH; the nvidia-cuda-cuobjdump wheel has
# one) it also prints each kernel's hot loop from the SASS
# (tools/device/sass_loops.py: instructions a trip, and from the stage barrier to the first
# tensor-core product), and keeps the listing in SASS_OUT when that is set (for --before).
set -euo pipefail
cd "$(dirname "$0")/../.."
pattern=${1:-wgmma}
: "${CUBLAS_INCLUDE:?the include folder holding cublas_v2.h}"
tree=$(python3 vendor/materialise.py --dest "${DFLASH_PTXAS_TREE:-/tmp/dflash-ptxas-tree}")
ggml="$tree/ggml"
log=$(mktemp)
files=${PTXAS_FILES:-$(cd ggml_ext/kernels && echo gemm_kquant_mma.cu gemm_mma_*.cu gemm_q4k_wgmma_forms.cu)}
export ggml log CUBLAS_INCLUDE
# shellcheck disable=SC2016  # expanded by the bash that xargs starts
printf '%s\n' $files | xargs -P "$(nproc)" -I{} bash -c 'nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a \
  -DDFLASH_HAVE_WGMMA=1 -DGGML_USE_CUDA -Xptxas -v -cubin -o "$log.{}.cubin" ggml_ext/kernels/{} -I"$ggml/src" \
  -I"$ggml/include" -I"$ggml/src/ggml-cuda" -Iggml_ext/include -Iggml_ext/kernels -I"$CUBLAS_INCLUDE" > "$log.{}" 2>&1' \
  || { for f in $files; do grep -H -m5 error "$log.$f" || true; done; exit 2; }
for f in $files; do cat "$log.$f" >> "$log"; done
status=0
python3 - "$log" "$pattern" <<'EOF' || status=$?
import re
import sys

text = open(sys.argv[1]).read().splitlines()
pattern = re.compile(sys.argv[2])
bad = 0
name = None
for line in text:
    m = re.search(r"Compiling entry function '(\S+)'", line)
    if m:
        name = m.group(1)
    if not name or not pattern.search(name):
        continue
    if "registers" in line:
        print(f"{line.split(':', 1)[1].strip():60s} {name}")
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and (int(m.group(1)) or int(m.group(2))):
        print(f"SPILL {line.strip()} {name}")
        bad = 1
for line in text:
    if re.search(r"C751[45]", line) and pattern.search(line):
        print(f"SERIALIZED {line.strip()}")
        bad = 1
sys.exit(bad)
EOF
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
if [ -n "$cuobjdump" ]; then
  sass=${SASS_OUT:-$log.sass}
  for f in $files; do "$cuobjdump" -sass "$log.$f.cubin"; done > "$sass"
  python3 tools/device/sass_loops.py "$sass" "$pattern" ${SASS_BEFORE:+--before "$SASS_BEFORE"} || true
fi
exit $status
