#!/usr/bin/env bash
# The prepared GPU benchmark, one JSON (scripts/bench_sims_gpu.py; figures in docs/sims.md):
# - simulators: the Warp backend's physics steps/s, environment steps/s and 64x64 frames/s at
#   1,024-8,192 worlds of the suite scene on one GPU, with the determinism mode that ran and whether
#   CUDA graphs were captured; at the first size the same with env.suite.warp_deterministic (its cost);
#   MJX's steps/s at BENCH_MJX_ENVS (1,024 and 4,096; empty: none);
# - training (scripts/bench_train_device.py): VLA PPO env-steps/s of the default job at
#   BENCH_TRAIN_ENVS environments, co-located on the GPU (env.backend=warp, one process); with
#   BENCH_TRAIN_MODES=inprocess,colocated also in process (batch sims on the CPU, EGL frames: about
#   377 frames/s on NVIDIA's driver, so 40+ s per iteration); with BENCH_FLEET=1 and Ray installed,
#   pipelined against co-located on a local Ray cluster.
# At most 8 minutes: training runs right after the first simulator size, sizes left after
# BENCH_BUDGET_S (360 s, training included) are skipped, the JSON is rewritten after every part,
# and the whole run is stopped at 470 s.
#
#   scripts/bench_gpu.sh [OUT.json] [more bench_sims_gpu.py arguments]
#   scripts/bench_gpu.sh /tmp/bench_gpu.json --smoke      # every part at toy sizes on Warp's CPU device
#
# Before anything runs, scripts/check_imports.py names every third-party module that the code
# reachable from scripts/bench_sims_gpu.py imports and this Python lacks (imageio_ffmpeg only where imported
# at module level: the benchmark writes no video; mujoco.mjx too when MJX is
# asked for); no Ray, no language model needed (random stand-in embeddings without MiniLM).
# mujoco_warp compiles its CUDA kernels on the first run (cached by Warp under ~/.cache/warp).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/bench_gpu.json}
shift || true
python=${PYTHON:-python}
if [[ -z ${PYTHON:-} && -x .venv/bin/python ]]; then python=.venv/bin/python; fi
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl} HF_HUB_OFFLINE=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX and torch share the GPU
mkdir -p "$(dirname "$out")"
"$python" scripts/check_imports.py --lazy imageio_ffmpeg scripts/bench_sims_gpu.py || exit 3  # no video, no demos
mjx_envs=${BENCH_MJX_ENVS-1024,4096}
if [[ -n $mjx_envs ]] && ! "$python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('mujoco.mjx') is None)"; then
  echo "bench_gpu.sh: mujoco.mjx is missing (mujoco-mjx's wheel); set BENCH_MJX_ENVS= to leave MJX out" >&2; exit 3
fi
flags=()
if [[ ${BENCH_FLEET:-0} == 1 ]]; then flags+=(--train-fleet); fi
if [[ ${BENCH_DETERMINISTIC:-0} == 1 ]]; then flags+=(--deterministic); fi
exec timeout --signal=TERM 470 "$python" scripts/bench_sims_gpu.py --json "$out" \
    --device "${BENCH_DEVICE:-cuda:0}" --envs "${BENCH_ENVS:-1024,2048,4096,8192}" \
    --steps "${BENCH_STEPS:-20}" --budget-s "${BENCH_BUDGET_S:-360}" \
    --mjx-envs "$mjx_envs" --train-modes "${BENCH_TRAIN_MODES:-colocated}" \
    --train-envs "${BENCH_TRAIN_ENVS:-1024}" --train-steps "${BENCH_TRAIN_STEPS:-16}" "${flags[@]}" "$@"
