#!/usr/bin/env bash
# Second command on the same GPU machine (sent with .dev2): warp's core library from its two pieces,
# then COMMAND in the GPU environment (default: scripts/bench_gpu.sh into $OUT/bench_gpu.json).
#   bash .dev2/call2.sh [COMMAND...]
set -euo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
if [[ ! -d /tmp/site/warp || ! -f /tmp/wp/warp.so.xz.1 ]]; then
  echo "call2: this machine has not run .dev1/call1.sh (a fresh machine?): send call1.sh first" >&2; exit 3
fi
source .dev2/gpu_env.sh
unxz /tmp/wp/warp.so.xz.1 .dev2/warp.so.xz.2 /tmp/site/warp/bin/warp.so
python3 -c "import warp as wp; wp.init(); print('warp', wp.__version__, wp.get_cuda_devices())"
run_in_gpu_env "$@"
