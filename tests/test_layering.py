"""The layering of docs/ARCHITECTURE.md: infra knows nothing of robots, sims nothing of networks,
policies nothing of simulators, and rlcore (the RL math both trainers share) of nothing in the project.
An import pointing the wrong way is a design bug."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "sims": {"policies", "vla_rl", "infra"},
    "policies": {"sims", "vla_rl", "infra"},
    "infra": {"sims", "policies", "vla_rl"},
    "rlcore": {"sims", "policies", "vla_rl", "infra"},
}


def _imported_top_level_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_points_the_wrong_way(package):
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = _imported_top_level_modules(path) & FORBIDDEN[package]
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, f"{package}/ must not import {sorted(FORBIDDEN[package])}: " + "; ".join(offenders)
