#!/usr/bin/env bash
# Second command on the same GPU machine (sent with .dev2): warp's core library from its two pieces,
# ffmpeg's first piece kept for call3, the preflight checks
# (scripts/device/preflight.py), then COMMAND within the call's limit (default: the benchmark,
# scripts/bench_gpu.sh into $OUT/bench_gpu.json; `true` to stop after the checks).
#   bash .dev2/call2.sh [COMMAND...]
set -euo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
source .dev2/gpu_env.sh
if [[ ! -d $SITE/warp || ! -f $SITE/.pieces/warp.so.xz.1 ]]; then
  echo "call2: this machine has not run .dev1/call1.sh (a fresh machine?): send call1.sh first" >&2; exit 3
fi
unxz "$SITE/.pieces/warp.so.xz.1" .dev2/warp.so.xz.2 "$SITE/warp/bin/warp.so"
cp .dev2/ffmpeg.xz.1 "$SITE/.pieces/"  # ffmpeg's first piece, for call3
python3 scripts/device/preflight.py "${preflight_flags[@]}" --json "${OUT:-/tmp}/preflight.json"
if [[ $# -gt 0 ]]; then limited "$@"; else limited bash scripts/bench_gpu.sh "${OUT:-/tmp}/bench_gpu.json"; fi
