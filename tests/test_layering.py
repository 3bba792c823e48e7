"""The layering of docs/ARCHITECTURE.md. An import pointing the wrong way is a design bug.

- infra/ knows nothing of robots, sims/ nothing of networks, policies/ nothing of simulators, and
  rlcore/ (the RL math both trainers share) nothing of the project;
- the scheduler core (``infra.scheduler``) is engine-free: no Ray, no service, no LLM jobs;
- the shared plumbing (``infra.common``) imports nothing of the project, so it is the bottom layer:
  sims may import it (atomic files), and nothing else of infra;
- production code never imports the LLM simulator (``infra.llm.sim``) or a benchmark;
- no code outside a suite's own package and the suite registry (``sims.registry``) branches on a suite's
  name (``is_libero(...)``, ``task.startswith("libero_")``): it asks ``sims.suite_of(task)`` instead.
"""

import ast
import re
from pathlib import Path

import pytest

import sims

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sims", "policies", "vla_rl", "infra", "rlcore")
SIMULATION_OR_BENCH = ("infra.llm.sim", "scripts")
"""Modules only benchmarks, scripts and tests may import."""

RULES: list[tuple[str, tuple[str, ...], str]] = [
    ("sims", ("policies", "vla_rl", "infra"), "simulators know nothing of networks or training"),
    ("policies", ("sims", "vla_rl", "infra"), "networks know nothing of simulators"),
    ("infra", ("sims", "policies", "vla_rl"), "infra knows nothing of robots"),
    ("rlcore", ("sims", "policies", "vla_rl", "infra"), "the shared RL math imports nothing of the project"),
    ("infra.scheduler", ("ray", "infra.service", "infra.ray_cluster", "infra.replay", "infra.llm"),
     "the scheduler core is engine-free and knows no jobs"),
    ("infra.common", ("sims", "policies", "vla_rl", "rlcore", "infra.scheduler", "infra.service", "infra.ray_cluster",
                      "infra.replay", "infra.llm"), "shared plumbing imports nothing of the project"),
    ("vla_rl", ("sims.libero", "sims.gantry"), "the trainer reaches a suite through sims.registry (sims.suite_of)"),
]

MAY_IMPORT: dict[str, tuple[str, ...]] = {"sims": ("infra.common",)}
"""Exceptions to a package's forbidden prefixes: the bottom layer below them."""


SUITE_HOMES = ("sims.registry", "sims.gantry", "sims.libero")
"""Where a suite's name may be tested: the registry and each suite's own package (the gantry suite's entry
module; its task code in sims/ never names a suite)."""
SUITE_SCOPE = (*PACKAGES, "scripts")
"""Folders whose code must not branch on a suite's name."""


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Dotted names of every absolute import of ``path`` (``from a.b import c`` gives ``a.b`` and ``a.b.c``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(root: Path) -> list[str]:
    """Every module under ``root``'s packages that breaks a rule, one line per module and rule."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = module_name(path, root)
            imports = imported_modules(path)
            rules = [rule for rule in RULES if _within(module, rule[0])]
            if not any(_within(module, s) for s in SIMULATION_OR_BENCH):
                rules.append((module, SIMULATION_OR_BENCH, "production never imports simulators or benchmarks"))
            for source, forbidden, reason in rules:  # a package's own modules are not "the project" of its rule
                allowed = (source, *MAY_IMPORT.get(source, ()))
                bad = sorted(n for n in imports if any(_within(n, f) for f in forbidden)
                             and not any(_within(n, a) for a in allowed))
                if bad:
                    found.append(f"{module} imports {', '.join(bad)} ({reason})")
    return found


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def suite_name_tests(path: Path, names: tuple[str, ...]) -> list[str]:
    """Each place of ``path`` that tests a suite's name, as ``line: source``: a comparison with, or a
    ``startswith``/``endswith``/``removeprefix`` of, a string that starts with a suite's name, and any use of a
    name ``is_<suite>...`` (``is_libero``, ``is_libero_task``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pattern = re.compile(rf"({'|'.join(map(re.escape, names))})", re.IGNORECASE)
    helper = re.compile(rf"is_({'|'.join(map(re.escape, names))})", re.IGNORECASE)
    found = []
    for node in ast.walk(tree):
        strings: list[str] = []
        if isinstance(node, ast.Compare):
            strings = _strings(node)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith", "removeprefix", "removesuffix")):
            strings = [s for arg in node.args for s in _strings(arg)]
        named = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        named = named or (node.name if isinstance(node, ast.FunctionDef | ast.alias) else "")
        if any(pattern.match(s) for s in strings) or helper.match(named):
            where = named if isinstance(node, ast.FunctionDef) else ast.get_source_segment(path.read_text(), node)
            found.append(f"{node.lineno}: {where or named}")
    return found


def suite_branches(root: Path, names: tuple[str, ...]) -> list[str]:
    """Every module under ``root``'s code folders, outside :data:`SUITE_HOMES`, that tests a suite's name."""
    found = []
    for folder in SUITE_SCOPE:
        for path in sorted((root / folder).rglob("*.py")):
            module = module_name(path, root)
            if not any(_within(module, home) for home in SUITE_HOMES):
                found.extend(f"{module}:{hit} (tests a suite's name; ask sims.suite_of(task))"
                             for hit in suite_name_tests(path, names))
    return found


SUITE_NAMES = tuple(suite.name for suite in sims.suites())


def test_no_code_outside_a_suite_branches_on_its_name():
    assert set(SUITE_NAMES) >= {"gantry", "libero"}
    found = suite_branches(ROOT, SUITE_NAMES)
    assert not found, "suite-name branches outside the suites and the registry:\n" + "\n".join(found)


@pytest.mark.parametrize(("path", "source"), [
    ("vla_rl/planted.py", "def f(task):\n    return task.startswith('libero_')"),
    ("vla_rl/planted.py", "def f(env):\n    return env.task == 'libero_spatial'"),
    ("scripts/planted.py", "from vla_rl.config import is_libero"),
    ("sims/planted.py", "def f(suite):\n    return suite in ('gantry', 'other')"),
])
def test_a_planted_suite_name_branch_is_found(tmp_path, path, source):
    for folder in SUITE_SCOPE:
        (tmp_path / folder).mkdir()
    (tmp_path / "sims" / "libero").mkdir()
    (tmp_path / "sims" / "libero" / "plugin.py").write_text("def claims(task):\n    return task.startswith('libero_')\n")
    (tmp_path / "vla_rl" / "neighbour.py").write_text("import sims\nsuite = sims.suite_of('libero_spatial')\n")
    planted = tmp_path / path
    planted.write_text(source + "\n")
    found = suite_branches(tmp_path, SUITE_NAMES)
    assert len(found) == 1 and found[0].startswith(module_name(planted, tmp_path) + ":"), found


def test_no_import_points_the_wrong_way():
    found = violations(ROOT)
    assert not found, "imports that break docs/ARCHITECTURE.md's layering:\n" + "\n".join(found)


@pytest.mark.parametrize(("path", "line", "reason"), [
    ("infra/scheduler/planted.py", "from infra.llm.service_actors import RolloutService", "engine-free"),
    ("infra/scheduler/planted.py", "import ray", "engine-free"),
    ("infra/llm/planted.py", "from infra.llm.sim.workload import JobProfile", "never imports simulators"),
    ("vla_rl/planted.py", "from scripts.bench_sims import main", "never imports simulators or benchmarks"),
    ("vla_rl/planted.py", "from sims.libero.vec_env import CONTROLLERS", "through sims.registry"),
    ("infra/common/planted.py", "from infra.scheduler import Cluster", "plumbing imports nothing"),
    ("sims/planted.py", "import policies", "simulators know nothing of networks"),
    ("sims/planted.py", "from infra.scheduler import Cluster", "simulators know nothing of networks"),
    ("sims/planted.py", "import infra.common.files, infra.service", "simulators know nothing of networks"),
])
def test_a_planted_violation_is_found(tmp_path, path, line, reason):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "infra" / "scheduler" / "core.py").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "infra" / "scheduler" / "core.py").write_text("import heapq\n")  # clean neighbours
    (tmp_path / "infra" / "common").mkdir()
    (tmp_path / "infra" / "common" / "neighbour.py").write_text("from infra.common.files import write_atomic\n")
    (tmp_path / "sims" / "neighbour.py").write_text("from infra.common.files import write_atomic\n")  # allowed
    planted = tmp_path / path
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text(line + "\n")
    found = violations(tmp_path)
    assert len(found) == 1 and found[0].startswith(module_name(planted, tmp_path) + " imports") and reason in found[0], found
