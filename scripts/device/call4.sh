#!/usr/bin/env bash
# Fourth command on the same GPU machine (sent with .dev4), after .dev1/call1.sh and .dev2/call2.sh
# (.dev4 is built by prepare_libero.sh, which copies this script there):
# the LIBERO task bundle (the Spatial suite's task folders, assets and decimated meshes; see
# prepare_libero.sh) unpacked into /tmp/libero-cache, then COMMAND with VLA_RL_LIBERO_CACHE set there
# (default: scripts/bench_libero_gpu.sh into $OUT/bench_libero_gpu.json).
#   bash .dev4/call4.sh [COMMAND...]
set -euo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
source .dev4/gpu_env.sh
if [[ ! -f $SITE/warp/bin/warp.so ]]; then
  echo "call4: warp is not complete on this machine: send .dev1/call1.sh and .dev2/call2.sh first" >&2; exit 3
fi
export VLA_RL_LIBERO_CACHE=/tmp/libero-cache
mkdir -p "$VLA_RL_LIBERO_CACHE"
untar_xz .dev4/libero_bundle.tar.xz "$VLA_RL_LIBERO_CACHE"
echo "call4: LIBERO tasks in $VLA_RL_LIBERO_CACHE: $(cd "$VLA_RL_LIBERO_CACHE" && ls -d spatial/* object/* goal/* 10/* 2>/dev/null | tr '\n' ' ')"
if [[ $# -gt 0 ]]; then limited "$@"; else limited bash scripts/bench_libero_gpu.sh "${OUT:-/tmp}/bench_libero_gpu.json"; fi
