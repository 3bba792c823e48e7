#!/usr/bin/env bash
# Builds .dev4/ in the project root: the LIBERO tasks the GPU machine's LIBERO benchmark builds
# (scripts/bench_libero_gpu.sh), which has neither the libero package nor a task cache. One xz tar
# from sims.libero.toolchain.bundle (the task folders, every asset file their models reference, the decimated
# visual meshes and markers at the default budget of 2,000 triangles; members relative to the cache
# root), with call4.sh and gpu_env.sh. The Spatial suite's ten tasks: 186 files, 38.5 MB, as xz
# smaller than as a plain tar (its meshes compress, its PNG textures, 27 MB, do not).
# prepare.sh runs this last; alone it rebuilds only .dev4 (a minute, mostly xz). Needs the tasks in
# the cache (python scripts/setup_libero.py).
#   bash scripts/device/prepare_libero.sh        # LIBERO_TASKS="spatial/0 spatial/1" packs others
# Then on the GPU machine, right after .dev1/call1.sh and .dev2/call2.sh (each within 30 s of the last):
#   bash .dev4/call4.sh [COMMAND]                (carry .dev4; default scripts/bench_libero_gpu.sh into $OUT)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
cd "$root"
exclude=$(git rev-parse --git-path info/exclude)  # the main checkout's, also from a worktree
mkdir -p "$(dirname "$exclude")"
grep -qxF /.dev4/ "$exclude" 2>/dev/null || echo /.dev4/ >> "$exclude"
python=${PYTHON:-.venv/bin/python}
read -r -a tasks <<< "${LIBERO_TASKS:-spatial/0 spatial/1 spatial/2 spatial/3 spatial/4 spatial/5 spatial/6 spatial/7 spatial/8 spatial/9}"
rm -rf .dev4
mkdir .dev4
"$python" -m sims.libero.toolchain.bundle .dev4/libero_bundle.tar.xz "${tasks[@]}"
cp "$here/call4.sh" "$here/gpu_env.sh" .dev4/
# What one transfer carries: .dev4 and the working tree (tracked and untracked, not ignored files).
"$python" - <<'PY'
import pathlib, subprocess, sys
listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True).stdout
tree = sum(p.stat().st_size for p in map(pathlib.Path, listed.decode().split("\0")) if p.is_file())
dev4 = sum(f.stat().st_size for f in pathlib.Path(".dev4").rglob("*") if f.is_file())
mib = (tree + dev4) / 2**20
print(f".dev4: {dev4 / 2**20:.1f} MiB, {mib:.1f} MiB with the {tree / 2**20:.1f} MiB tree")
if mib > 64:
    sys.exit(f"prepare_libero.sh: .dev4 with the tree is {mib:.1f} MiB, over the 64 MiB one transfer carries; "
             "pack fewer tasks (LIBERO_TASKS=...) and send the rest in another call")
PY
