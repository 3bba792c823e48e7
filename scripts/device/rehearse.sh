#!/usr/bin/env bash
# Replays the GPU machine's device session on this machine's CPU, so that a missing package, a step
# over the time limit or a transfer over 64 MiB fails here and not in a rare 15-minute lease.
#
#   bash scripts/device/rehearse.sh           # the whole sequence (about 10 minutes on 2 cores with a cold xz cache)
#   bash scripts/device/rehearse.sh --quick   # the fast part (make test runs it): scripts, limits, plan
#
# The whole sequence: the working tree as a call sends it (tracked and untracked, not ignored files)
# copied to a scratch folder; the transfers built by prepare.sh for the rehearsal's Python; a fresh
# virtual environment of REHEARSE_PYTHON with only what the GPU machine has (gpu_machine.txt, from
# this disk's package indexes, no network); then each call of the session in order, carrying only its
# own folders (the others removed, as a new call's tree lacks them), every call's command on Warp's
# CPU device at toy sizes (bench_gpu.sh --smoke; gpu_recipe.sh with RECIPE_TINY=1), under the
# device's 600 s per call, failing a call whose work passes 560 s or whose transfer passes 64 MiB.
# Two things come from this disk that the GPU machine does not get: torch (the machine has its own,
# 2.11 with CUDA; here the CPU build, which pip takes from the local wheel folder) and warp's CPU
# kernel compiler warp-clang.so (the GPU compiles with NVRTC; prepare.sh leaves it out).
# REHEARSE_PYTHON defaults to Python 3.12, the GPU machine's (pyenv's 3.12.1 here); this disk's indexes
# hold torch and numpy, scipy, PyYAML, matplotlib, pyarrow, pillow, regex and jaxlib for 3.11 only, and
# PyPI's cp312 torch is the CUDA 13 build (2.7 GB of wheels with its CUDA libraries, 1.3 GB of them not
# on this disk), so here REHEARSE_PYTHON=python3.11 is what runs: the transfers are then built for 3.11
# (DEVICE_PY), with the same versions.
# REHEARSE_TORCH=2.11.0 instead installs the GPU machine's torch and the rest from the package index (PyPI:
# 2.7 GB for torch's CUDA 13 build, which runs on the CPU), so Python 3.12 rehearses as the machine runs it.
# Settings: REHEARSE_PYTHON, REHEARSE_TORCH, PYTHON (the interpreter whose versions the transfers take; .venv's),
# REHEARSE_DIR (scratch; default a temporary folder, removed after), REHEARSE_TRANSFERS (a DEST of
# prepare.sh built for REHEARSE_PYTHON's version, reused instead of building the transfers again).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
cd "$root"
limit=560
device_limit=600
python=${PYTHON:-.venv/bin/python}
if [[ -z ${PYTHON:-} && ! -x $python ]]; then python=python3; fi

quick() {
  local status=0 s
  for s in "$here"/*.sh scripts/bench_gpu.sh scripts/gpu_recipe.sh scripts/bench_libero_gpu.sh; do
    bash -n "$s" || { echo "rehearse: $s does not parse" >&2; status=1; }
  done
  # Each call's work runs under the call limit, which stays below the device's.
  grep -q "CALL_LIMIT_S=\${CALL_LIMIT_S:-$limit}" "$here/gpu_env.sh" || { echo "rehearse: gpu_env.sh's limit is not $limit s" >&2; status=1; }
  for s in call2.sh call3.sh call4.sh; do
    grep -q 'limited "\$@"' "$here/$s" || { echo "rehearse: $s runs its command without the call limit" >&2; status=1; }
  done
  local bench recipe
  bench=$(sed -n 's/.*timeout --signal=TERM \([0-9]*\) .*/\1/p' scripts/bench_gpu.sh | head -1)
  recipe=$(sed -n 's/^budget=\${RECIPE_BUDGET_S:-\([0-9]*\)}/\1/p' scripts/gpu_recipe.sh)
  for pair in "bench_gpu.sh:$bench" "gpu_recipe.sh:$recipe"; do
    if [[ -z ${pair#*:} || ${pair#*:} -ge $limit ]]; then echo "rehearse: ${pair%%:*}'s budget (${pair#*:} s) is not below $limit s" >&2; status=1; fi
  done
  # Every file a call reads from its folder is one prepare.sh (or prepare_libero.sh) writes there.
  for n in 1 2 3 4; do
    for f in $(grep -o "\.dev$n/[A-Za-z0-9_.]*" "$here/call$n.sh" | sort -u); do
      grep -q "${f#.dev$n/}" "$here/prepare.sh" "$here/prepare_libero.sh" || { echo "rehearse: call$n.sh reads $f, which nothing prepares" >&2; status=1; }
    done
  done
  MUJOCO_GL=egl "$python" "$here/preflight.py" --cpu > /dev/null || { echo "rehearse: preflight fails in this interpreter" >&2; status=1; }
  # The calls' environment finds the project's packages without an install (the GPU machine has none):
  # with -S no site-packages and with -P not the working directory, so only PYTHONPATH as gpu_env.sh sets it.
  (SITE=$root/.nonexistent; source "$here/gpu_env.sh" && "$python" -S -P -c "import importlib.util as u, sys
missing = [p for p in ('sims', 'vla_rl', 'policies', 'infra', 'rlcore') if u.find_spec(p) is None]
sys.exit(f'not found: {missing}' if missing else None)") \
    || { echo "rehearse: gpu_env.sh's PYTHONPATH does not reach the project's packages" >&2; status=1; }
  return $status
}

if [[ ${1:-} == --quick ]]; then quick && echo "rehearse --quick: ok"; exit; fi
quick
rehearse_python=${REHEARSE_PYTHON:-/root/.pyenv/versions/3.12.1/bin/python}
py_version=$("$rehearse_python" -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
scratch=${REHEARSE_DIR:-$(mktemp -d)}
if [[ -z ${REHEARSE_DIR:-} ]]; then trap 'rm -rf "$scratch"' EXIT; fi
tree=$scratch/tree site=$scratch/site out=$scratch/out stash=$scratch/stash venv=$scratch/venv
mkdir -p "$tree" "$site" "$out" "$stash"
build_venv() {  # the GPU machine's packages into $venv (it shares nothing with the transfers, so they build together)
  local source_of="this disk only" index has
  [[ -n ${REHEARSE_TORCH:-} ]] && source_of="torch $REHEARSE_TORCH, the package index"
  echo "rehearse: a fresh virtual environment of $rehearse_python with what the GPU machine has ($source_of)"
  "$rehearse_python" -m venv "$venv"
  mapfile -t has < <(sed -e 's/#.*//' -e '/^\s*$/d' "$here/gpu_machine.txt")
  if [[ -n ${REHEARSE_TORCH:-} ]]; then
    # The GPU machine's own torch (its CUDA build runs on the CPU too), with everything from the package index.
    has+=("torch==$REHEARSE_TORCH")
    index=()
  else
    has+=("torch==$("$python" -c "import torch; print(torch.__version__)")")  # the CPU build the tests ran
    index=(PIP_INDEX_URL=file:///opt/pypi/simple PIP_EXTRA_INDEX_URL=file:///opt/pypi-more/simple)
  fi
  if ! env "${index[@]}" "$venv/bin/python" -m pip install -q --only-binary=:all: "${has[@]}"; then
    echo "rehearse: what the GPU machine has does not install for Python $py_version (no torch wheel for it" \
         "on this disk?): set REHEARSE_TORCH=2.11.0 to take the GPU machine's torch from the package index," \
         "or REHEARSE_PYTHON to an interpreter this disk has wheels for (python3.11)"
    return 1
  fi
}

began=$(date +%s)
build_venv > "$scratch/venv.log" 2>&1 & venv_pid=$!
echo "rehearse: the tree as a call sends it -> $tree"
git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$tree"
if [[ -n ${REHEARSE_TRANSFERS:-} ]]; then  # transfers prepare.sh built before (DEST=..., DEVICE_PY=$py_version)
  echo "rehearse: the transfers of $REHEARSE_TRANSFERS"
  cp -r "$REHEARSE_TRANSFERS"/.dev1 "$REHEARSE_TRANSFERS"/.dev2 "$REHEARSE_TRANSFERS"/.dev3 "$REHEARSE_TRANSFERS"/.gl "$stash/"
else
  echo "rehearse: the transfers for Python $py_version"
  DEST=$stash DEVICE_PY=$py_version LIBERO=0 PYTHON=$python bash "$here/prepare.sh"
fi
echo "rehearse: the tree and the transfers in $(( $(date +%s) - began )) s"
if ! wait "$venv_pid"; then cat "$scratch/venv.log" >&2; exit 1; fi
cat "$scratch/venv.log"
echo "rehearse: the transfers and the virtual environment in $(( $(date +%s) - began )) s"
clang=$("$python" -c "import os, warp; print(os.path.join(os.path.dirname(warp.__file__), 'bin', 'warp-clang.so'))")

call() {  # call N COMMAND...: call N's script with its folders carried, as the device runs it
  local n=$1; shift
  local carried=(".dev$n"); [[ $n == 1 ]] && carried+=(.gl)
  rm -rf "$tree"/.dev? "$tree/.gl"
  for c in "${carried[@]}"; do cp -r "$stash/$c" "$tree/"; done
  local mib start wall rc=0
  mib=$(du -sbc "$tree" | tail -1 | awk '{printf "%.1f", $1 / 1048576}')
  start=$(date +%s)
  (cd "$tree" && env PATH="$venv/bin:$PATH" DEVICE_REHEARSAL=1 SITE="$site" OUT="$out" MUJOCO_GL=egl \
     timeout "$device_limit" bash ".dev$n/call$n.sh" "$@") > "$out/call$n.log" 2>&1 || rc=$?
  wall=$(( $(date +%s) - start ))
  echo "rehearse: call$n ${*:-(default)}: exit $rc, ${wall} s, $mib MiB sent"
  if [[ $rc != 0 ]]; then tail -30 "$out/call$n.log" >&2; echo "rehearse: call$n failed (log: $out/call$n.log)" >&2; exit 1; fi
  if [[ $wall -gt $limit ]]; then echo "rehearse: call$n took $wall s, over the $limit s a call's work may take" >&2; exit 1; fi
  if [[ ${mib%.*} -ge 64 ]]; then echo "rehearse: call$n sent $mib MiB, over 64 MiB" >&2; exit 1; fi
}
call 1
cp "$clang" "$site/warp/bin/"  # this rehearsal's CPU device only (see the header)
call 2 env BENCH_MJX_ENVS= bash scripts/bench_gpu.sh "$out/bench_gpu.json" --smoke
call 3 env RECIPE_DEVICE=cpu RECIPE_TINY=1 bash scripts/gpu_recipe.sh "$out/recipe"
"$venv/bin/python" - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
bench = json.loads((out / "bench_gpu.json").read_text())["results"]
recipe = json.loads((out / "recipe" / "sft_rl.json").read_text())["results"]
assert bench["envs_4"]["warp_env_steps_per_s"] > 0 and bench["host_syncs"]["constant"] and bench["host_syncs_terminate"]["constant"], bench
assert set(recipe) == {"sft", "rl"} and all("train" in r for r in recipe.values()), recipe
json.loads((out / "recipe" / "llm_rlvr.json").read_text())
print("rehearse: the benchmark's and the recipe's JSON hold every part")
PY
echo "rehearse: ok in $(( $(date +%s) - began )) s"
