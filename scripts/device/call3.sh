#!/usr/bin/env bash
# Third command on the same GPU machine (sent with .dev3), for scripts that read or write video (the
# recipe's demonstrations): imageio-ffmpeg with its ffmpeg binary, then COMMAND in the GPU environment.
#   bash .dev3/call3.sh bash scripts/gpu_recipe.sh "$OUT"
set -euo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
if [[ ! -f /tmp/site/warp/bin/warp.so ]]; then
  echo "call3: warp is not complete on this machine: send .dev1/call1.sh and .dev2/call2.sh first" >&2; exit 3
fi
source .dev3/gpu_env.sh
untar_xz .dev3/imageio_ffmpeg_pkg.tar.xz /tmp/site
binary=$(cat .dev3/ffmpeg_name)
unxz .dev3/ffmpeg.xz "/tmp/site/imageio_ffmpeg/binaries/$binary"
chmod +x "/tmp/site/imageio_ffmpeg/binaries/$binary"
python3 -c "import imageio_ffmpeg; print('ffmpeg', imageio_ffmpeg.get_ffmpeg_exe())"
run_in_gpu_env "$@"
