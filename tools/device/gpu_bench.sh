#!/usr/bin/env bash
# GPU benches in one call: the CUDA test suite, the trained pair (AR / chain / DDTree sweep, ours
# and upstream), the 27B-shaped chain vs upstream draft-dflash at the same synthetic acceptance
# (issue 3) and the DDTree step cost per budget (issue 4). The pair is the packaged one, or a run
# that gpu_train_and_test.sh started (PAIR=/tmp/pair/export, collected when its training ends).
# JSON and logs land in $OUT. Carry: .carry (upstream.tar.gz, whl/).
cd "$(dirname "$0")/../.." || exit 1
mkdir -p "$OUT"
t0=$(date +%s)
source tools/device/setup.sh
set +e +u +o pipefail
export DFLASH_COMMIT=${DFLASH_COMMIT:-unknown}
PAIR=${PAIR:-dflash/data/pair}
if [ "$PAIR" = /tmp/pair/export ]; then
  until grep -q "stage report done" /tmp/pair/train.log 2>/dev/null || [ $(($(date +%s) - t0)) -gt 200 ]; do sleep 5; done
  cp /tmp/pair/train.log "$OUT/" && tar -C /tmp/pair -cf - export train.log | split -b 15M - "$OUT/pair.tar.part-"
fi
[ -f /tmp/q27.gguf ] || (python3 -m dflash.synth model --preset qwen36-27b --out /tmp/q27.gguf > /tmp/synth.log 2>&1 &&
  python3 -m dflash_convert.synthetic /tmp/d27dir --preset 27b >> /tmp/synth.log 2>&1 &&
  python3 -m dflash_convert.cli /tmp/d27dir -o /tmp/d27.gguf --outtype bf16 --target /tmp/q27.gguf >> /tmp/synth.log 2>&1) &
synth=$!
DFLASH_TEST_NGL=99 DFLASH_REQUIRE_CUDA=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_tree_ops.py \
  tests/test_oracle_upstream.py tests/test_verify_commit.py tests/test_tree_verify.py tests/test_spec_chain.py \
  tests/test_ddtree.py > "$OUT/cuda-tests.log" 2>&1
echo "[gpu] CUDA tests rc=$? at $(($(date +%s) - t0)) s: $(tail -n 1 "$OUT/cuda-tests.log")"
timeout 120 python3 -m dflash.bench --pair "$PAIR" --prompts bench/prompts/pair-heldout-code48.jsonl -ngl 99 -n 512 \
  --budgets "${PAIR_BUDGETS-16,32,64,128}" -o "$OUT/h200-pair.json" > "$OUT/pair-bench.log" 2>&1
echo "[gpu] pair bench rc=$? at $(($(date +%s) - t0)) s"; grep -A12 "^| mode" "$OUT/pair-bench.log"
wait "$synth"
timeout 150 python3 -m dflash.bench -m /tmp/q27.gguf --draft /tmp/d27.gguf --kv-types f16 -p 512 -n 128 -r 3 \
  --no-upstream --llama-server "$LLAMA_SERVER" --synth-len 10 -o "$OUT/h200-27b-chain-vs-upstream.json" \
  > "$OUT/chain-bench.log" 2>&1
echo "[gpu] chain bench rc=$? at $(($(date +%s) - t0)) s"; tail -n 12 "$OUT/chain-bench.log"
left=$((585 - ($(date +%s) - t0)))
timeout "$left" python3 -m dflash.bench --tree-steps -m /tmp/q27.gguf --draft /tmp/d27.gguf -ngl 99 -c 4096 \
  --kv-type f16 --synthetic-accept 8 --budgets 1,2,4,8,16,32,64,128,256 -o "$OUT/h200-27b-tree-steps.json" \
  > "$OUT/tree-bench.log" 2>&1
echo "[gpu] tree-steps rc=$? at $(($(date +%s) - t0)) s"; tail -n 12 "$OUT/tree-bench.log"
