# Sourced by call1.sh to call4.sh (prepare.sh and prepare_libero.sh copy it into each transfer): the
# environment the project's GPU scripts run in on the GPU machine, and xz through Python's lzma
# (the machine's python3 has it; its tar and xz tools are not relied on).
export PYTHONPATH=/tmp/site MUJOCO_GL=egl PYOPENGL_PLATFORM=egl XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHON=python3
vendor=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
if [[ -f $vendor ]]; then export __EGL_VENDOR_LIBRARY_FILENAMES=$vendor; fi

unxz() {  # unxz SRC... DEST: the xz stream of the concatenated SRC files, decompressed to DEST
  python3 -c "import lzma, shutil, sys
with open(sys.argv[-1], 'wb') as out:
    d = lzma.LZMADecompressor()
    for name in sys.argv[1:-1]:
        with open(name, 'rb') as f:
            for chunk in iter(lambda: f.read(1 << 24), b''):
                out.write(d.decompress(chunk))" "$@"
}

untar_xz() {  # untar_xz ARCHIVE DIR
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2], filter='data')" "$1" "$2"
}

run_in_gpu_env() {  # the command given, or the GPU benchmark into $OUT
  if [[ $# -gt 0 ]]; then "$@"; else bash scripts/bench_gpu.sh "${OUT:-/tmp}/bench_gpu.json"; fi
}
