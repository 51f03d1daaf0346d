#!/usr/bin/env bash
# GPU call 2 of 2 (right after gpu_train_and_test.sh, machine still warm): wait for the pair's
# training, then the benches - the trained pair (AR / chain / DDTree sweep, ours and upstream),
# the 27B-shaped chain vs upstream draft-dflash at the same synthetic acceptance (issue 3), and
# the DDTree step cost per budget (issue 4). JSON and the packed pair land in $OUT.
cd "$(dirname "$0")/../.."
mkdir -p "$OUT"
t0=$(date +%s)
source tools/device/setup.sh
set +e +u +o pipefail
export DFLASH_COMMIT=${DFLASH_COMMIT:-unknown}
until grep -q "stage report done" /tmp/pair/train.log 2>/dev/null || [ $(($(date +%s) - t0)) -gt 200 ]; do sleep 5; done
tail -n 3 /tmp/pair/train.log; cp /tmp/pair/train.log "$OUT/"
echo "[gpu] training collected at $(($(date +%s) - t0)) s"
if [ -f /tmp/pair/export/drafter-q8_0.gguf ]; then
  tar -C /tmp/pair -cf - export train.log | split -b 15M - "$OUT/pair.tar.part-"
  timeout 150 python3 -m dflash.bench --pair /tmp/pair/export --prompts dflash/data/pair/prompts.jsonl -ngl 99 \
    -n 128 --budgets "${PAIR_BUDGETS-4,8,16,32,64}" -o "$OUT/h200-pair.json" > "$OUT/pair-bench.log" 2>&1
  echo "[gpu] pair bench rc=$? at $(($(date +%s) - t0)) s"; tail -n 25 "$OUT/pair-bench.log"
fi
timeout 200 python3 -m dflash.bench -m /tmp/q27.gguf --draft /tmp/d27.gguf --kv-types f16 -p 512 -n 256 -r 3 \
  --no-upstream --llama-server "$LLAMA_SERVER" --synth-len 10 -o "$OUT/h200-27b-chain-vs-upstream.json" \
  > "$OUT/chain-bench.log" 2>&1
echo "[gpu] chain bench rc=$? at $(($(date +%s) - t0)) s"; tail -n 20 "$OUT/chain-bench.log"
left=$((570 - ($(date +%s) - t0)))
[ -n "${SKIP_TREE:-}" ] || timeout "$left" python3 -m dflash.bench --tree-steps -m /tmp/q27.gguf --draft /tmp/d27.gguf -ngl 99 -c 4096 \
  --kv-type f16 --synthetic-accept 8 -o "$OUT/h200-27b-tree-steps.json" > "$OUT/tree-bench.log" 2>&1
echo "[gpu] tree-steps rc=$? at $(($(date +%s) - t0)) s"; tail -n 20 "$OUT/tree-bench.log"
if [ -n "${DIAG:-}" ]; then
  DFLASH_TEST_NGL=99 timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/test_tree_verify.py > "$OUT/diag.log" 2>&1
  grep -v "^  File" "$OUT/diag.log" | head -40
fi
