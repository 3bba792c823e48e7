#!/usr/bin/env bash
# Third command on the same GPU machine (sent with .dev3), for what records or reads video (the
# recipe's demonstrations): ffmpeg's binary (its two pieces) into imageio-ffmpeg, the recipe's preflight checks (its
# instruction embeddings, sent here: the machine has no MiniLM), then COMMAND within the call's limit
# (default: scripts/gpu_recipe.sh into $OUT).
#   bash .dev3/call3.sh [COMMAND...]
set -euo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
source .dev3/gpu_env.sh
if [[ ! -f $SITE/warp/bin/warp.so || ! -f $SITE/.pieces/ffmpeg.xz.1 ]]; then
  echo "call3: warp or ffmpeg's first piece is not on this machine: send .dev1/call1.sh and .dev2/call2.sh first" >&2; exit 3
fi
binary=$(cat .dev3/ffmpeg_name)
unxz "$SITE/.pieces/ffmpeg.xz.1" .dev3/ffmpeg.xz.2 "$SITE/imageio_ffmpeg/binaries/$binary"
chmod +x "$SITE/imageio_ffmpeg/binaries/$binary"
cp .dev3/instruction_embeddings.pt "$SITE/.pieces/"  # kept for later calls on this machine
export VLA_RL_EMBEDDINGS=$SITE/.pieces/instruction_embeddings.pt
python3 scripts/device/preflight.py "${preflight_flags[@]}" --recipe --embeddings "$VLA_RL_EMBEDDINGS" \
  --json "${OUT:-/tmp}/preflight_recipe.json"
if [[ $# -gt 0 ]]; then limited "$@"; else limited bash scripts/gpu_recipe.sh "${OUT:-/tmp}"; fi
