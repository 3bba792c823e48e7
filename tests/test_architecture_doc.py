"""docs/ARCHITECTURE.md against the code: every dotted name it cites imports, every path it cites exists."""

import builtins
import dataclasses
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("infra", "vla_rl", "sims", "policies", "rlcore")
_ALTERNATIVES = "|".join(PACKAGES)
NAME = re.compile(rf"(?<![/\w.])(?:{_ALTERNATIVES})(?:\.[A-Za-z_]\w*)++(?<!\.md)")
PATH = re.compile(rf"(?<![\w/])(?:{_ALTERNATIVES}|scripts|tests|configs|docs)/[\w./-]*\.(?:py|md|yaml|sh)\b")
CLASS_ATTR = re.compile(r"`([A-Z][A-Za-z0-9]+)(?:\.([a-z_]\w*))?[(`]")
"""A backquoted class (``GangBackend``) or method (``GangBackend.start_actor``) cited without its module."""


def resolve(dotted: str) -> object:
    """The object ``dotted`` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_every_cited_name_resolves():
    text = DOC.read_text()
    names = sorted(set(NAME.findall(text)))
    assert len(names) > 40, f"only {len(names)} names found: the pattern is broken"
    missing = {}
    for name in names:
        try:
            resolve(name)
        except (ImportError, AttributeError) as err:
            missing[name] = f"{type(err).__name__}: {err}"
    assert not missing, f"docs/ARCHITECTURE.md cites names the code does not have: {missing}"


def test_every_cited_path_exists():
    text = DOC.read_text()
    paths = sorted(set(PATH.findall(text)))
    assert paths, "no paths found: the pattern is broken"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/ARCHITECTURE.md cites paths that do not exist: {missing}"


def _project_classes() -> dict[str, list[type]]:
    import pkgutil

    found: dict[str, list[type]] = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            if info.name.endswith("__main__"):
                continue
            for name, obj in vars(importlib.import_module(info.name)).items():
                if isinstance(obj, type) and obj.__module__.startswith(PACKAGES):
                    found.setdefault(name, []).append(obj)
    return found


def _has(cls: type, attr: str) -> bool:
    return hasattr(cls, attr) or (dataclasses.is_dataclass(cls) and attr in {f.name for f in dataclasses.fields(cls)})


def test_every_cited_class_and_method_exists():
    classes = _project_classes()
    cited = sorted(set(CLASS_ATTR.findall(DOC.read_text())))
    assert len(cited) > 20, f"only {len(cited)} classes found: the pattern is broken"
    external = {"VectorEnv", "TensorDict"}  # gymnasium's and tensordict's, named as such in the text
    missing = [f"{c}.{a}" if a else c for c, a in cited
               if not (hasattr(builtins, c) or c in external)
               and (c not in classes or (a and not any(_has(k, a) for k in classes[c])))]
    assert not missing, f"docs/ARCHITECTURE.md cites classes or methods the code does not have: {missing}"
