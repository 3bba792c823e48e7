#!/usr/bin/env bash
# Builds, in the project root, what the GPU machine lacks for the project's GPU scripts, in transfers
# of at most 64 MiB each with the working tree (which travels with every one):
#   .dev1/ + .gl/  the cp312 wheels of packages.txt, warp without its core library, imageio-ffmpeg
#                  without its ffmpeg binary, the core's first piece; NVIDIA's GL loader packages
#   .dev2/  the core's second piece (warp.so is 299 MB, 78 MB as xz), the first piece of imageio-ffmpeg's
#           ffmpeg binary as xz (173 MB, 48 MB as xz; only video needs it)
#   .dev3/  the ffmpeg binary's second piece; the
#           recipe's instruction embeddings (no MiniLM there; scripts/device/embed_instructions.py)
#   .dev4/  the LIBERO Spatial suite's tasks from the task cache, as xz (prepare_libero.sh, run last)
# Versions are PYTHON's (.venv's), so the GPU runs what the tests ran. Run once here (a few minutes,
# mostly xz):   bash scripts/device/prepare.sh
# Then one device session (docs/results.md "On a GPU"), each command within 30 s of the last (what a
# call sent is gone in the next; what it wrote under /tmp stays while the machine is held):
#   bash .dev1/call1.sh                     carry .dev1 .gl   installs, ~20 s
#   bash .dev2/call2.sh [COMMAND]           carry .dev2       warp, preflight, default the benchmark (<= 560 s)
#   bash .dev3/call3.sh [COMMAND]           carry .dev3       ffmpeg, preflight, default the recipe (<= 560 s)
#   bash .dev4/call4.sh [COMMAND]           carry .dev4       LIBERO tasks, default its benchmark (<= 560 s)
# The benchmark is calls 1-2, the recipe calls 1-3 (`.dev2/call2.sh true`): one of them per 15-minute lease.
# scripts/device/rehearse.sh replays the sequence on this machine's CPU.
# Settings: DEST (where the .dev folders go; default the project root), DEVICE_PY (the GPU machine's
# Python, 3.12), LIBERO=0 (no .dev4).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
cd "$root"
dest=${DEST:-$root}
python=${PYTHON:-.venv/bin/python}
device_py=${DEVICE_PY:-3.12}
if [[ $dest == "$root" ]]; then
  exclude=$(git rev-parse --git-path info/exclude)  # the main checkout's, also from a worktree
  mkdir -p "$(dirname "$exclude")"
  for d in /.dev1/ /.dev2/ /.dev3/ /.dev4/ /.gl/; do grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"; done
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$dest/.dev1" "$dest/.dev2" "$dest/.dev3" "$dest/.gl"
mkdir -p "$dest/.dev1/whl" "$dest/.dev2" "$dest/.dev3" "$dest/.gl"

version() { "$python" -c "import importlib.metadata as m; print(m.version('$1'))"; }
wheel() {  # wheel DIR DIST: DIST's manylinux wheel for DEVICE_PY at PYTHON's version
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$device_py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$1" "$2==$(version "$2")"
}
xz_cached() {  # xz_cached SRC DEST: SRC as xz -9 (minutes on 2 cores), kept by content in ~/.cache for reruns
  local cache="${XDG_CACHE_HOME:-$HOME/.cache}/vla_rl_device" key
  key=$(sha256sum "$1" | cut -c1-32)
  mkdir -p "$cache"
  if [[ ! -s $cache/$key.xz ]]; then xz -9 -T2 -c "$1" > "$cache/$key.xz.tmp" && mv "$cache/$key.xz.tmp" "$cache/$key.xz"; fi
  cp "$cache/$key.xz" "$2"
}
mib() { "$python" -c "import pathlib, sys; print(sum(f.stat().st_size for a in sys.argv[1:] for f in
  ([pathlib.Path(a)] if pathlib.Path(a).is_file() else pathlib.Path(a).rglob('*')) if f.is_file()) / 2**20)" "$@"; }
split_to_fill() {  # split_to_fill SRC MIB FIRST REST DIR...: SRC's head into FIRST, as many bytes as bring DIR... with
  # the tree to MIB MiB (none if they are there already), and the rest into REST (the calls join the two with unxz)
  local first
  first=$("$python" -c "print(max(0, int(($2 - $tree_mib - $(mib "${@:5}")) * 2**20)))")
  head -c "$first" "$1" > "$3"
  tail -c +"$((first + 1))" "$1" > "$4"
}
tree_mib=$(git ls-files -co --exclude-standard -z | xargs -0 "$python" -c "import os, sys
print(sum(os.path.getsize(p) for p in sys.argv[1:] if os.path.isfile(p)) / 2**20)")

mapfile -t dists < <(sed -e 's/#.*//' -e '/^\s*$/d' "$here/packages.txt")
for dist in "${dists[@]}"; do
  case $dist in
    warp-lang|imageio-ffmpeg) wheel "$work" "$dist" ;;
    *) wheel "$dest/.dev1/whl" "$dist" ;;
  esac
done

# imageio-ffmpeg: the package without its binary (.dev1: importing it needs no ffmpeg), the binary as xz (.dev2, .dev3).
mkdir "$work/ffmpeg" && (cd "$work/ffmpeg" && unzip -q "$work"/imageio_ffmpeg-*.whl)
binary=$(cd "$work/ffmpeg/imageio_ffmpeg/binaries" && ls ffmpeg-*)
# The binary is one xz block (one thread): it compresses in the background beside warp's core below, so a cold
# cache keeps both cores busy.
xz_cached "$work/ffmpeg/imageio_ffmpeg/binaries/$binary" "$work/ffmpeg.xz" & ffmpeg_xz=$!
echo "$binary" > "$dest/.dev3/ffmpeg_name"
tar -C "$work/ffmpeg" --exclude="imageio_ffmpeg/binaries/$binary" -cJf "$dest/.dev1/imageio_ffmpeg_pkg.tar.xz" \
  imageio_ffmpeg $(cd "$work/ffmpeg" && ls -d imageio_ffmpeg-*.dist-info)

# NVIDIA's EGL needs the GL vendor-neutral loaders, which the machine lacks.
lists="$work/apt-lists"; mkdir -p "$lists/partial"
apt=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 "-oDir::State::Lists=$lists")
apt-get "${apt[@]}" update > /dev/null
(cd "$dest/.gl" && apt-get "${apt[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 > /dev/null)

# The recipe's instructions, embedded here (MiniLM is installed here, not there).
"$python" "$here/embed_instructions.py" "$dest/.dev3/instruction_embeddings.pt"

# warp: the package without its CPU kernel compiler (warp-clang.so; the GPU compiles with NVRTC) and
# examples; the core library as xz, split so that .dev1 fills up to 60 MiB with the tree.
mkdir "$work/warp" && (cd "$work/warp" && unzip -q "$work"/warp_lang-*.whl)
rm -rf "$work/warp/warp/bin/warp-clang.so" "$work/warp/warp/examples"
xz_cached "$work/warp/warp/bin/warp.so" "$work/warp.so.xz"
rm "$work/warp/warp/bin/warp.so"
tar -C "$work/warp" -cJf "$dest/.dev1/warp_pkg.tar.xz" warp $(cd "$work/warp" && ls -d warp_lang-*.dist-info)
split_to_fill "$work/warp.so.xz" 60 "$dest/.dev1/warp.so.xz.1" "$dest/.dev2/warp.so.xz.2" "$dest/.dev1" "$dest/.gl"
# ffmpeg's xz, likewise split: its first piece fills .dev2 up to 59 MiB with the tree (call2 keeps it for call3),
# so that neither .dev2 nor .dev3 (the embeddings' call) runs close to 64 MiB as the tree grows.
wait "$ffmpeg_xz"
split_to_fill "$work/ffmpeg.xz" 59 "$dest/.dev2/ffmpeg.xz.1" "$dest/.dev3/ffmpeg.xz.2" "$dest/.dev2"

for i in 1 2 3; do cp "$here/call$i.sh" "$here/gpu_env.sh" "$dest/.dev$i/"; done
status=0
for dirs in ".dev1 .gl" .dev2 .dev3; do
  read -r -a parts <<< "$dirs"
  total=$("$python" -c "print(round($tree_mib + $(mib "${parts[@]/#/$dest/}"), 1))")
  over=$("$python" -c "print(int($total > 64))")
  echo "prepare: ${dirs// / + } with the ${tree_mib%.*}-MiB tree: $total MiB$([[ $over == 1 ]] && echo '  OVER 64 MiB')"
  if [[ $over == 1 ]]; then status=1; fi
done
if [[ $status != 0 ]]; then echo "prepare: a transfer is over 64 MiB; see above" >&2; exit 1; fi
if [[ ${LIBERO:-1} == 1 ]]; then bash "$here/prepare_libero.sh"; fi
