"""The floors of the house: every import in the five packages (those inside functions too)
looks down or sideways, never up; no two packages import each other, even through a third;
no package imports another package's private (underscore) names.
"""
import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGES = ("native", "traces", "synth", "analysis", "replay")

# Bottom to top. A module belongs to the longest prefix that names it, and that prefix is its
# package here; it may import its own package and any package on a lower floor, and a package
# on its own floor only where the two do not import each other.
FLOORS = (
    ("native", "traces", "traces.errors", "traces.schema", "traces.trace", "traces.library", "traces.targets",
     "traces.reading"),
    ("traces.formats", "traces.convert", "traces.capture"),
    ("analysis", "synth"),
    ("replay",),
    ("replay.bench",),
    ("replay.cli", "replay.cli_reference", "replay.commands"),
)
FLOOR = {package: n for n, packages in enumerate(FLOORS) for package in packages}


def _repo() -> Path:
    here = Path(__file__).resolve().parent
    while not (here / "pyproject.toml").exists():
        here = here.parent
    return here


REPO = _repo()


@cache
def modules() -> dict[str, Path]:
    """Every module of the five packages by dotted name (the Rust extension by its stub)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py*")):
            if path.suffix not in (".py", ".pyi") or "__pycache__" in path.parts:
                continue
            parts = path.relative_to(REPO).with_suffix("").parts
            found.setdefault(".".join(parts[:-1] if parts[-1] == "__init__" else parts), path)
    return found


def is_package(name: str) -> bool:
    return modules()[name].name == "__init__.py"


def package_of(module: str) -> str:
    """The longest prefix in FLOORS that names `module` (or is `module` itself)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FLOOR:
            return ".".join(parts[:n])
    raise AssertionError(f"{module} is on no floor: add it to FLOORS in {__file__}")


@cache
def imports() -> list[tuple[str, str, str | None, int]]:
    """(importing module, imported module, imported name or None, line) for every import of
    one of the five packages, wherever it stands in the file."""
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(name, alias.name, None, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = name.split(".")[: None if is_package(name) else -1]
                    base = ".".join(parent[: len(parent) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.append((name, sub, None, node.lineno) if sub in modules()
                                 else (name, base, alias.name, node.lineno))
    return [i for i in found if i[1].split(".")[0] in PACKAGES]


def where(module: str, line: int) -> str:
    return f"{modules()[module].relative_to(REPO)}:{line}"


def test_every_module_is_on_a_floor():
    for module in modules():
        package_of(module)


def test_no_import_runs_up_a_floor():
    upward = [f"{where(src, line)}: {src} ({package_of(src)}, floor {FLOOR[package_of(src)]}) "
              f"imports {dst} ({package_of(dst)}, floor {FLOOR[package_of(dst)]})"
              for src, dst, _, line in imports() if FLOOR[package_of(dst)] > FLOOR[package_of(src)]]
    assert not upward, "\n".join(upward)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("level", ["floor packages", "top-level packages"])
def test_no_two_packages_import_each_other(level):
    def group(module):
        return package_of(module) if level == "floor packages" else module.split(".")[0]

    edges, why = {}, {}
    for src, dst, _, line in imports():
        a, b = group(src), group(dst)
        if a != b:
            edges.setdefault(a, set()).add(b)
            why.setdefault((a, b), f"{where(src, line)} imports {dst}")
    cycles = _cycles(edges)
    assert not cycles, "\n".join(
        " <-> ".join(c) + ": " + "; ".join(why[a, b] for a in c for b in c if (a, b) in why)
        for c in cycles)


def _private_owner(dotted: str) -> str | None:
    """The package a private name in `dotted` belongs to, or None when no part is private."""
    parts = dotted.split(".")
    for n, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            holder = ".".join(parts[:n])
            return holder if is_package(holder) else holder.rpartition(".")[0]
    return None


def test_no_package_imports_another_packages_private_names():
    reaching = []
    for src, dst, name, line in imports():
        owner = _private_owner(f"{dst}.{name}" if name else dst)
        if owner is not None and src != owner and not src.startswith(owner + "."):
            reaching.append(f"{where(src, line)}: {src} imports {dst}{'.' + name if name else ''}, "
                            f"private to {owner}")
    assert not reaching, "\n".join(reaching)


def test_every_package_states_its_api_and_other_packages_import_only_that():
    """Each package's __init__ names its API in __all__, every name there exists, and what
    another package imports from it (a module or a name) is in it."""
    import importlib

    declared, problems = {}, []
    for package in (m for m in modules() if is_package(m)):
        names = getattr(importlib.import_module(package), "__all__", None)
        if names is None:
            problems.append(f"{modules()[package].relative_to(REPO)} has no __all__")
            continue
        declared[package] = set(names)
        problems += [f"{package}.__all__ names {name}, which is not there" for name in names
                     if f"{package}.{name}" not in modules()
                     and not hasattr(importlib.import_module(package), name)]
    for src, dst, name, line in imports():
        parts = (f"{dst}.{name}" if name else dst).split(".")
        for n in range(1, len(parts)):
            package = ".".join(parts[:n])
            if package in declared and not (src == package or src.startswith(package + ".")) \
                    and parts[n] not in declared[package]:
                problems.append(f"{where(src, line)} imports {'.'.join(parts[:n + 1])}, which is "
                                f"not in {package}.__all__")
    assert not problems, "\n".join(problems)
