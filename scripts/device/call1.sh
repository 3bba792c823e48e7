#!/usr/bin/env bash
# First command on the GPU machine (sent with .dev1 and .gl): NVIDIA's GL loaders, the wheels of
# packages.txt, warp without its core library, imageio-ffmpeg without its ffmpeg binary, all into
# $SITE (/tmp/site), and the core's first piece kept for call2.sh. About 20 s.
#   bash .dev1/call1.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
source .dev1/gpu_env.sh
if [[ ${DEVICE_REHEARSAL:-0} != 1 ]]; then  # the rehearsal never unpacks packages into this machine's /
  for deb in .gl/*.deb; do dpkg -x "$deb" /; done
  ldconfig
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .dev1/whl/*.whl
untar_xz .dev1/warp_pkg.tar.xz "$SITE"
untar_xz .dev1/imageio_ffmpeg_pkg.tar.xz "$SITE"
mkdir -p "$SITE/.pieces" && cp .dev1/warp.so.xz.1 "$SITE/.pieces/"
if command -v nvidia-smi > /dev/null; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; fi
echo "call1: ready; send .dev2/call2.sh within 30 s"
