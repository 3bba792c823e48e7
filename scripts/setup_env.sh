#!/usr/bin/env bash
# Creates or reuses the project's virtual environment and installs what is missing.
#   - system libraries via apt when root on Debian/Ubuntu (otherwise it prints the apt command to run):
#     EGL + Mesa for headless rendering, and FFmpeg's shared libraries, which torchcodec loads when
#     the tests run LeRobot's own dataset loader (docs/demos.md);
#   - the CPU build of torch when there is no NVIDIA GPU (a plain `torch` would pull a multi-GB CUDA build);
#   - the project itself, editable, with the dev extras;
#   - with LIBERO=1, LIBERO (scripts/setup_libero.py): its export toolchain into
#     ~/.cache/vla-rl/libero/toolchain (pip --no-deps --target: robosuite 1.4.0 never enters the
#     project's environment) and the 40 tasks of Spatial, Object, Goal and 10 exported once into the
#     cache (about 4 CPU-seconds a task); and LIBERO's own robosuite environment, .venv-libero
#     (scripts/setup_libero_venv.py: robosuite 1.4.0 on mujoco 2.3.7, pinned, about 2 GB), the
#     anchor of scripts/bench_libero.py and scripts/compare_libero.py. Off by default: the LIBERO
#     tests export the tasks they use themselves, the first test that needs .venv-libero
#     (tests/sims/conftest.py's libero_python) makes it when it is absent, and `make train` does
#     not need LIBERO.
# Re-running is cheap: a stamp keyed on pyproject.toml skips pip when nothing changed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$root/.venv}"
python="${PYTHON:-python3}"
extras="${EXTRAS:-dev}"

say() { printf '[setup] %s\n' "$*"; }

ensure_system_libraries() {
    local missing=()
    for pkg in libegl1 libegl-mesa0 libgl1-mesa-dri ffmpeg; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    if ! command -v apt-get >/dev/null 2>&1; then
        say "headless rendering and LeRobot's tests need ${missing[*]}; install them with your system's package manager."
        return 0
    fi
    if [ "$(id -u)" -eq 0 ]; then
        say "installing ${missing[*]} (headless rendering, LeRobot's video decoding)"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        say "headless rendering and LeRobot's tests need: sudo apt-get install -y ${missing[*]}"
        say "continuing; tests and jobs that render or decode with LeRobot will fail until they are installed."
    fi
}

ensure_venv() {
    if [ ! -x "$venv/bin/python" ]; then
        say "creating virtual environment at $venv"
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install -q --upgrade pip
    fi
}

pip_retrying() {
    local attempt
    for attempt in 1 2 3; do
        "$@" && return 0
        say "pip failed (attempt $attempt of 3); trying again"
        sleep $((attempt * 10))
    done
    return 1
}

ensure_packages() {
    local stamp="$venv/.setup-stamp-$extras"
    local want
    want="$(cat "$root/pyproject.toml" | sha256sum | cut -c1-16)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    # A dropped connection to the package index should not fail a fresh machine's setup: pip resumes
    # partial downloads, and the whole install is tried again (it keeps what it already installed).
    local pip=(pip_retrying "$venv/bin/python" -m pip install -q --disable-pip-version-check
               --retries 10 --timeout 60 --resume-retries 20)
    if ! command -v nvidia-smi >/dev/null 2>&1 && ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
        say "no NVIDIA GPU: installing the CPU build of torch"
        "${pip[@]}" "torch==2.13.0" || "${pip[@]}" "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
    fi
    say "installing the project and its dependencies (extras: $extras)"
    "${pip[@]}" -e "$root[$extras]"
    echo "$want" >"$stamp"
}

ensure_libero() {
    [ "${LIBERO:-0}" = "1" ] || return 0
    # Cheap when everything is cached (a file check per task); a failure leaves the rest usable.
    "$venv/bin/python" "$root/scripts/setup_libero.py" \
        || say "LIBERO setup failed; LIBERO tests fail until python scripts/setup_libero.py succeeds"
    "$venv/bin/python" "$root/scripts/setup_libero_venv.py" >/dev/null \
        || say "LIBERO's own environment failed; bench_libero.py needs python scripts/setup_libero_venv.py to succeed"
}

ensure_system_libraries
ensure_venv
ensure_packages
ensure_libero
say "environment ready: $venv"
