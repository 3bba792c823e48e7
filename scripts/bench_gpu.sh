#!/usr/bin/env bash
# The prepared GPU benchmark, one JSON (scripts/bench_sims_gpu.py; figures in docs/sims.md):
# - simulators: the Warp backend's physics steps/s, environment steps/s and 64x64 frames/s (and
#   MJX's steps/s with BENCH_MJX=1) at 1,024-8,192 worlds of the suite scene on one GPU;
# - training (scripts/bench_train_device.py): VLA PPO env-steps/s of the default job at
#   BENCH_TRAIN_ENVS environments, co-located on the GPU (env.backend=warp, one process) against
#   in process (batch sims on the CPU, policy on the GPU); with BENCH_FLEET=1 and Ray installed,
#   pipelined against co-located on a local Ray cluster.
# At most 8 minutes: training runs right after the first simulator size, sizes left after
# BENCH_BUDGET_S (360 s, training included) are skipped, the JSON is rewritten after every part,
# and the whole run is stopped at 470 s.
#
#   scripts/bench_gpu.sh [OUT.json] [more bench_sims_gpu.py arguments]
#   scripts/bench_gpu.sh /tmp/bench_gpu.json --smoke      # every part at toy sizes on Warp's CPU device
#
# Needs torch, mujoco, mujoco-warp, warp-lang, gymnasium, tensordict, PyYAML, tqdm (and jax,
# mujoco-mjx for BENCH_MJX=1; EGL for the in-process job's frames); no Ray, no language model
# (random stand-in embeddings without MiniLM). mujoco_warp compiles its CUDA kernels on the first
# run (cached by Warp under ~/.cache/warp or $WARP_CACHE_PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/bench_gpu.json}
shift || true
python=${PYTHON:-python}
if [[ -z ${PYTHON:-} && -x .venv/bin/python ]]; then python=.venv/bin/python; fi
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl} HF_HUB_OFFLINE=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX and torch share the GPU
mkdir -p "$(dirname "$out")"
"$python" - <<'PY'
import importlib.util, sys
need = ["torch", "numpy", "mujoco", "mujoco_warp", "warp", "gymnasium", "tensordict", "yaml", "tqdm"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"bench_gpu.sh: missing Python packages {missing}: bring their wheels (pip install --no-deps)")
PY
flags=()
if [[ ${BENCH_MJX:-0} == 1 ]]; then flags+=(--mjx); fi
if [[ ${BENCH_FLEET:-0} == 1 ]]; then flags+=(--train-fleet); fi
exec timeout --signal=TERM 470 "$python" scripts/bench_sims_gpu.py --json "$out" \
    --device "${BENCH_DEVICE:-cuda:0}" --envs "${BENCH_ENVS:-1024,2048,4096,8192}" \
    --steps "${BENCH_STEPS:-20}" --budget-s "${BENCH_BUDGET_S:-360}" \
    --train-envs "${BENCH_TRAIN_ENVS:-1024}" --train-steps "${BENCH_TRAIN_STEPS:-16}" "${flags[@]}" "$@"
