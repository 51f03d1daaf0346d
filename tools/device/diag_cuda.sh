source tools/device/setup.sh > /tmp/setup.log 2>&1; set +e +u +o pipefail; tail -3 /tmp/setup.log
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1); echo "sanitizer: $CS"
timeout 120 "$CS" --tool memcheck --print-limit 3 python3 tools/device/diag_cuda.py tiny-a 2>&1 | grep -v "^=========     Host Frame\|^=========         in " | head -60
