# Sourced by the staged GPU scripts (gpu_bench.sh, gpu_mmq_tiles.sh): build (setup.sh), the
# call's clock, and the 27B-shaped target + drafter written in the background.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
mkdir -p "$OUT"
t0=$(date +%s)
source tools/device/setup.sh
set +e +u +o pipefail
export DFLASH_COMMIT=${DFLASH_COMMIT:-unknown}
# seconds left of the call (CALL_S: the call's limit less a margin; 585 for a 600 s call)
left() { echo $((${CALL_S:-585} - ($(date +%s) - t0))); }
# /tmp/q27.gguf + /tmp/d27.gguf, in the background (setsid: it outlives this call, not the
# machine; the next call, within 30 s, finds them)
start_27b_synth() {
  [ -f /tmp/d27.gguf ] && return
  setsid bash -c 'python3 -m dflash.synth model --preset qwen36-27b --out /tmp/q27.gguf &&
    python3 -m dflash_convert.synthetic /tmp/d27dir --preset 27b &&
    python3 -m dflash_convert.cli /tmp/d27dir -o /tmp/d27.part --outtype bf16 --target /tmp/q27.gguf &&
    mv /tmp/d27.part /tmp/d27.gguf' > /tmp/synth.log 2>&1 < /dev/null &
}
