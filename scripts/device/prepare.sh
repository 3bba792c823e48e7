#!/usr/bin/env bash
# Builds, in the project root, what the GPU machine lacks for the project's GPU scripts, in transfers
# of at most 64 MiB each (the working tree, about 5 MB, travels with every one):
#   .dev1/  the cp312 wheels of packages.txt, warp without its core library, the core's first piece
#   .dev2/  the core's second piece (warp.so is 299 MB, 78 MB as xz)
#   .dev3/  imageio-ffmpeg, its ffmpeg binary as xz (173 MB, 48 MB as xz): only video needs it
#   .gl/    NVIDIA's GL loader packages for EGL
#   .dev4/  the LIBERO Spatial suite's tasks from the task cache, as xz (prepare_libero.sh, run last)
# Versions are the ones in .venv, so the GPU runs what the tests ran. Run once here (a few minutes,
# mostly xz):   bash scripts/device/prepare.sh
# Then on the GPU machine, each command within 30 s of the last (what one sent is gone in the next;
# what it wrote under /tmp stays while the machine is held):
#   bash .dev1/call1.sh                              (carry .dev1 .gl)
#   bash .dev2/call2.sh [COMMAND]                    (carry .dev2; default bench_gpu.sh into $OUT)
#   bash .dev3/call3.sh bash scripts/gpu_recipe.sh "$OUT"   (carry .dev3)
#   bash .dev4/call4.sh [COMMAND]                    (carry .dev4; default bench_libero_gpu.sh into $OUT)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
cd "$root"
exclude=$(git rev-parse --git-path info/exclude)  # the main checkout's, also from a worktree
mkdir -p "$(dirname "$exclude")"
for d in /.dev1/ /.dev2/ /.dev3/ /.dev4/ /.gl/; do grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"; done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf .dev1 .dev2 .dev3 .gl
mkdir -p .dev1/whl .dev2 .dev3 .gl

version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
wheel() {  # wheel DIR DIST: DIST's cp312 manylinux wheel at .venv's version
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$1" "$2==$(version "$2")"
}
split_xz() {  # split_xz FILE OUT1 OUT2 FIRST_BYTES
  xz -9 -T2 -c "$1" > "$work/piece.xz"
  head -c "$4" "$work/piece.xz" > "$2"
  tail -c +"$(($4 + 1))" "$work/piece.xz" > "$3"
}

mapfile -t dists < <(sed -e 's/#.*//' -e '/^\s*$/d' "$here/packages.txt")
for dist in "${dists[@]}"; do
  case $dist in
    warp-lang|imageio-ffmpeg) wheel "$work" "$dist" ;;
    *) wheel .dev1/whl "$dist" ;;
  esac
done

# warp: the package without its CUDA-less CPU kernels and examples; the core library in two pieces.
mkdir "$work/warp" && (cd "$work/warp" && unzip -q "$work"/warp_lang-*.whl)
rm -rf "$work/warp/warp/bin/warp-clang.so" "$work/warp/warp/examples"
split_xz "$work/warp/warp/bin/warp.so" .dev1/warp.so.xz.1 .dev2/warp.so.xz.2 28000000
rm "$work/warp/warp/bin/warp.so"
tar -C "$work/warp" -cJf .dev1/warp_pkg.tar.xz warp $(cd "$work/warp" && ls -d warp_lang-*.dist-info)

# imageio-ffmpeg: the package without its binary, and the binary as xz.
mkdir "$work/ffmpeg" && (cd "$work/ffmpeg" && unzip -q "$work"/imageio_ffmpeg-*.whl)
binary=$(cd "$work/ffmpeg/imageio_ffmpeg/binaries" && ls ffmpeg-*)
xz -9 -T2 -c "$work/ffmpeg/imageio_ffmpeg/binaries/$binary" > .dev3/ffmpeg.xz
echo "$binary" > .dev3/ffmpeg_name
rm "$work/ffmpeg/imageio_ffmpeg/binaries/$binary"
tar -C "$work/ffmpeg" -cJf .dev3/imageio_ffmpeg_pkg.tar.xz imageio_ffmpeg $(cd "$work/ffmpeg" && ls -d imageio_ffmpeg-*.dist-info)

# NVIDIA's EGL needs the GL vendor-neutral loaders, which the machine lacks.
lists="$work/apt-lists"; mkdir -p "$lists/partial"
apt=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 "-oDir::State::Lists=$lists")
apt-get "${apt[@]}" update > /dev/null
(cd .gl && apt-get "${apt[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 > /dev/null)

for i in 1 2 3; do cp "$here/call$i.sh" "$here/gpu_env.sh" ".dev$i/"; done
du -sh .dev1 .dev2 .dev3 .gl
python3 - "$root" <<'PY'
import pathlib, sys
root = pathlib.Path(sys.argv[1])
size = lambda *dirs: sum(f.stat().st_size for d in dirs for f in (root / d).rglob("*") if f.is_file())
for dirs in ((".dev1", ".gl"), (".dev2",), (".dev3",)):
    mib = (size(*dirs) + 5e6) / 2**20  # + the working tree
    print(f"{' + '.join(dirs)}: {mib:.1f} MiB with the tree" + ("  OVER 64 MiB" if mib > 64 else ""))
    if mib > 64:
        sys.exit(1)
PY
bash "$here/prepare_libero.sh"
