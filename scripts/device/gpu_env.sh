# Sourced by call1.sh to call4.sh (prepare.sh copies it into each transfer): the environment the
# project's GPU scripts run in on the GPU machine, xz through Python's lzma (the machine's python3
# has it; its tar and xz tools are not relied on), and the per-call time limit.
# DEVICE_REHEARSAL=1 (scripts/device/rehearse.sh): the same calls on this machine's CPU, without
# touching / (no GL packages unpacked), into $SITE instead of /tmp/site.
SITE=${SITE:-/tmp/site}
# The project is not installed there: its packages are found in the tree's root (the call's working directory).
export PYTHONPATH=$SITE:$PWD MUJOCO_GL=egl PYOPENGL_PLATFORM=egl XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHON=python3
# Work in a call stays under this (the call itself may run 600 s; its transfers and start are extra).
CALL_LIMIT_S=${CALL_LIMIT_S:-560}
# NVIDIA's EGL vendor file: where the lent machines keep it, else where other images do.
for vendor in /usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json /usr/share/glvnd/egl_vendor.d/10_nvidia.json \
              /etc/glvnd/egl_vendor.d/10_nvidia.json; do
  if [[ -z ${__EGL_VENDOR_LIBRARY_FILENAMES:-} && -f $vendor ]]; then export __EGL_VENDOR_LIBRARY_FILENAMES=$vendor; fi
done
preflight_flags=()
if [[ ${DEVICE_REHEARSAL:-0} == 1 ]]; then preflight_flags+=(--cpu); fi

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

limited() {  # limited COMMAND...: COMMAND stopped at the call's limit (TERM, then KILL 20 s later)
  timeout --signal=TERM --kill-after=20 "$CALL_LIMIT_S" "$@"
}
