"""The project installs as one package set, declared twice: pyproject.toml and environment.yml."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    """Normalised distribution name of a requirement string ('jax[cpu]>=0.4' -> 'jax')."""
    name = re.split(r"[\[<>=!~; ]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _pyproject_requirements() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    return {_name(r): r.replace(" ", "") for r in reqs}


def _conda_requirements() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return {_name(r): r.replace(" ", "") for r in pip_section if not r.startswith("-")}


def test_environment_yml_matches_pyproject():
    pyproject, conda = _pyproject_requirements(), _conda_requirements()
    missing = sorted(set(pyproject) - set(conda))
    extra = sorted(set(conda) - set(pyproject))
    assert not missing and not extra, (
        f"environment.yml and pyproject.toml disagree: missing from environment.yml {missing}, "
        f"missing from pyproject.toml {extra}. Add the package to both files."
    )
    differing = {n: (pyproject[n], conda[n]) for n in pyproject if pyproject[n] != conda[n]}
    assert not differing, f"version specifiers differ (pyproject, environment.yml): {differing}"


def test_every_module_imports():
    """Every module of the five packages imports (a move or rename that left a stale import fails here)."""
    import importlib
    import pkgutil

    failed = {}
    count = 0
    for package in ("infra", "policies", "rlcore", "sims", "vla_rl"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            if info.name.endswith("__main__"):
                continue
            count += 1
            try:
                importlib.import_module(info.name)
            except Exception as err:  # report every broken module, not only the first
                failed[info.name] = f"{type(err).__name__}: {err}"
    assert count > 50, f"only {count} modules found: the package discovery is broken"
    assert not failed, f"modules that do not import: {failed}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    test_command = commands[-1]
    assert test_command == "make test", f".ci/run ends with {test_command!r}"
    assert "make test" in readme, "README.md must give `make test` as the test command"
