#!/usr/bin/env bash
# The prepared LIBERO GPU benchmark, one JSON (scripts/bench_libero_gpu.py; docs/sims.md, LIBERO):
# spatial/0 on the warp backend with both cameras at 128x128, then 64x64, at 256-8,192 worlds:
# env-steps/s, frames/s, build and first-step (kernel compilation, graph capture) seconds, whether
# CUDA graphs were captured, against the issue's 100k env-steps/s. Rows left after
# BENCH_LIBERO_BUDGET_S (300 s) are skipped, the JSON is rewritten after every row, and the whole
# run is stopped at 420 s. The task cache comes from VLA_RL_LIBERO_CACHE (on the GPU machine,
# scripts/device/call4.sh, sent as .dev4/call4.sh, unpacks the Spatial suite's bundle there and runs this).
#
#   scripts/bench_libero_gpu.sh [OUT.json] [more bench_libero_gpu.py arguments]
#   scripts/bench_libero_gpu.sh /tmp/bench_libero_gpu.json --smoke   # 2 worlds at 16x16 on Warp's CPU device
#
# Before anything runs, scripts/check_imports.py names every third-party module that the code
# reachable from scripts/bench_libero_gpu.py imports and this Python lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/bench_libero_gpu.json}
shift || true
python=${PYTHON:-python}
if [[ -z ${PYTHON:-} && -x .venv/bin/python ]]; then python=.venv/bin/python; fi
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl} HF_HUB_OFFLINE=1
mkdir -p "$(dirname "$out")"
"$python" scripts/check_imports.py scripts/bench_libero_gpu.py || exit 3
exec timeout --signal=TERM 420 "$python" scripts/bench_libero_gpu.py --json "$out" \
    --device "${BENCH_DEVICE:-cuda:0}" --tasks "${BENCH_LIBERO_TASKS:-spatial/0}" \
    --envs "${BENCH_LIBERO_ENVS:-256,1024,4096,8192}" --sizes "${BENCH_LIBERO_SIZES:-128,64}" \
    --seconds "${BENCH_LIBERO_SECONDS:-5}" --budget-s "${BENCH_LIBERO_BUDGET_S:-300}" "$@"
