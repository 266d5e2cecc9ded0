"""The package's shape, read from its imports with ``ast``: data flows one way,

    autolayout.core  ->  cost_models  ->  search  ->  (the face: autolayout/__init__, _cli)
                                      ->  runtime ->

no module imports a private name of another folder (a folder offers the others what its
``__init__.py`` exports), no import cycles between modules, and no import inside a function
except of a heavy dependency (pandas, matplotlib, OR-Tools, SciPy), said so in a comment."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# folder on disk -> package name
FOLDERS = {
    "autolayout/core": "autolayout.core",
    "cost_models": "autolayout.cost_models",
    "search": "autolayout.search",
    "runtime": "autolayout.runtime",
    "autolayout": "autolayout",
}
# which folders a folder may import
ALLOWED = {
    "autolayout.core": {"autolayout.core"},
    "autolayout.cost_models": {"autolayout.core", "autolayout.cost_models"},
    "autolayout.search": {"autolayout.core", "autolayout.cost_models", "autolayout.search"},
    "autolayout.runtime": {"autolayout.core", "autolayout.cost_models", "autolayout.runtime"},
    "autolayout": set(FOLDERS.values()),
}
# imported where first used, said so: each takes 0.3 s or more of every command's start
HEAVY = ("pandas", "matplotlib", "ortools", "scipy", "orbax", "tensorboardX")


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            out[name] = path
    return out


MODULES = _modules()


def _folder(module: str) -> str:
    """The folder (package) a module belongs to."""
    best = ""
    for package in FOLDERS.values():
        if (module == package or module.startswith(package + ".")) and len(package) > len(best):
            best = package
    return best


def _resolve(module: str, node: ast.ImportFrom | ast.Import) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) pairs of one import statement."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")
        is_package = MODULES[module].stem == "__init__"
        parts = parts[: len(parts) - node.level + (1 if is_package else 0)]
        base = ".".join(parts + ([base] if base else []))
    return [(base, a.name) for a in node.names]


def _imports(module: str):
    """(node, imported module, name, at top level) for every import outside TYPE_CHECKING."""
    tree = ast.parse(MODULES[module].read_text())
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for n in ast.walk(node))
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in typing_only:
            for target, name in _resolve(module, node):
                yield node, target, name, id(node) in top


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for _, target, name, _ in _imports(m):
            if not target.startswith("autolayout"):
                continue
            sub = f"{target}.{name}" if name else None
            if sub in MODULES:  # `from . import ilp` names a module
                edges[m].add(sub)
            elif target in MODULES:
                edges[m].add(target)
    return edges


def test_the_modules_are_found():
    assert "autolayout.core._ir" in MODULES and "autolayout.search.planner" in MODULES
    assert "autolayout.cost_models.pricing" in MODULES and "autolayout._cli" in MODULES


def test_folders_import_only_the_folders_below_them():
    bad = []
    for m in MODULES:
        for _, target, _, _ in _imports(m):
            if target.startswith("autolayout") and _folder(target) not in ALLOWED[_folder(m)]:
                bad.append(f"{m} imports {target}")
    assert not bad, bad


def test_no_private_name_crosses_a_folder():
    bad = []
    for m in MODULES:
        for _, target, name, _ in _imports(m):
            if not target.startswith("autolayout") or _folder(target) == _folder(m):
                continue
            parts = target.split(".") + ([name] if name else [])
            if any(p.startswith("_") for p in parts):
                bad.append(f"{m}: {target} {name or ''}")
            elif target != _folder(target):
                bad.append(f"{m}: {target} is not its folder's __init__")
    assert not bad, bad


def test_no_import_cycles():
    edges = _edges()
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n) :] + [n])
            elif n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_imports_inside_functions_are_heavy_optional_ones_said_so():
    bad = []
    for m, path in MODULES.items():
        lines = path.read_text().splitlines()
        for node, target, _, top in _imports(m):
            if top:
                continue
            line = lines[node.lineno - 1]
            if target.split(".")[0] not in HEAVY or "heavy" not in line:
                bad.append(f"{m}:{node.lineno}: {line.strip()}")
    assert not bad, bad
