#!/usr/bin/env bash
# GPU: the chain delta rule's forms on their own (tools/device/gdn_chain_standalone.cu: the chain
# kernel, the one-round kernel, the gram kernel; the 27B's 48 layers at 1 / 16 / 32 / 64 tokens).
# The binary is carried gzipped as .carry/gdn_chain_sa.gz (built here with nvcc -O3 for sm_90a,
# stripped, ~0.6 MB; its commit in .carry/gdn_chain_sa.commit), or built there from the carried
# upstream headers (.carry/upstream.tar.gz) when it does not start. A fresh machine to the end:
# about a minute. JSON lines in $OUT/gdn-standalone.jsonl. Argument: chain, one_round, gram or all.
cd "$(dirname "$0")/../.." || exit 1
mkdir -p "$OUT"
BIN=/tmp/gdn_chain_sa_carried
[ -f .carry/gdn_chain_sa.gz ] && [ ! -x "$BIN" ] && gzip -dc .carry/gdn_chain_sa.gz > "$BIN" && chmod +x "$BIN"
if [ -x "$BIN" ]; then
  echo "binary: carried, built at $(cat .carry/gdn_chain_sa.commit 2>/dev/null || echo 'an unknown commit')"
else
  mkdir -p /tmp/up && tar xzf .carry/upstream.tar.gz -C /tmp/up
  T=/tmp/up/ggml
  nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o /tmp/gdn_chain_sa tools/device/gdn_chain_standalone.cu \
    -I$T/src -I$T/include -I$T/src/ggml-cuda -Iggml_ext/include -Iggml_ext/kernels -Itools/device -DGGML_USE_CUDA 2>&1 |
    grep -E "error" | head
  BIN=/tmp/gdn_chain_sa
  echo "binary: built here from this tree"
fi
timeout 150 "$BIN" "${LABEL:-standalone}" "${1:-all}" > "$OUT/gdn-standalone.jsonl" 2>&1
echo "rc=$?"
python3 - "$OUT/gdn-standalone.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        print(line.rstrip())
        continue
    r = json.loads(line)
    print(f'{r["form"]:>9} {r["tokens"]:3d} tokens: {r["us_48_layers_median"]:8.1f} us / 48 layers '
          f'(min {r["us_48_layers_min"]:.1f}), vs chain {r["max_rel_diff_vs_chain"]:.2g}, out {r["checksum_out"]}')
PY
