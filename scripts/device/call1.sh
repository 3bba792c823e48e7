#!/usr/bin/env bash
# First command on the GPU machine (sent with .dev1 and .gl): NVIDIA's GL loaders, the wheels of
# packages.txt into /tmp/site, warp without its core library, and the core's first piece.
set -euo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
source .dev1/gpu_env.sh
for deb in .gl/*.deb; do dpkg -x "$deb" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev1/whl/*.whl
untar_xz .dev1/warp_pkg.tar.xz /tmp/site
mkdir -p /tmp/wp && cp .dev1/warp.so.xz.1 /tmp/wp/
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
echo "call1: ready; send .dev2/call2.sh within 30 s"
