"""The package's import graph runs one way: each layer imports only itself and those below.

Read from the source (every `import`, also those inside functions and TYPE_CHECKING blocks),
so a lazy import cannot hide a circle the way `mixin.promql` ↔ `analysis` once did, and no module
imports itself through others (a circle, type-only imports included).
"""

from __future__ import annotations

import ast
from pathlib import Path

import kvoffload

PACKAGE = Path(kvoffload.__file__).parent
# Lowest first. A module may import its own layer's package and any package listed before it.
LAYERS: list[set[str]] = [
    {"<top>"},  # units, errors, links, thresholds, progress, overrides, logrepeat, flagvalues
    {"ingest"},  # scraping, parsing, the vLLM catalog, host memory
    {"kvevents"},
    {"recording"},
    {"analysis"},
    {"sim"},
    {"sidecar"},
    {"fleet"},
    {"mixin"},
    {"cli"},
]
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
ENTRY_POINTS = {"kvoffload.__main__"}  # runs the CLI: above everything by definition


def _package(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return "<top>"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> set[str]:
    out: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                if node.module:
                    out.add(f"{base}.{node.module}")
                else:  # `from . import sibling`: the names are modules
                    out.update(f"{base}.{a.name}" for a in node.names)
            elif node.module:
                # `from kvoffload import mixin` names a module: the arrow goes to it.
                out.update(_from_target(node.module, a.name) for a in node.names)
    return {name for name in out if name.split(".")[0] == "kvoffload"}


def _from_target(module: str, name: str) -> str:
    """`module.name` when that is a submodule, else `module`: what `from module import name` reads.

    Without it `from kvoffload import mixin` would count as an arrow to the top package."""
    path = PACKAGE.parent.joinpath(*module.split("."), name)
    submodule = path.is_dir() or any(path.with_suffix(s).is_file() for s in (".py", ".pyi"))
    return f"{module}.{name}" if submodule else module


def _arrows() -> list[tuple[str, str]]:
    arrows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        if module in ENTRY_POINTS:
            continue
        arrows.extend((module, target) for target in _imports(path, module))
    return arrows


def _graph() -> dict[str, set[str]]:
    """Module → the package modules it imports (a dotted name cut back to the module it names).

    A compiled module (its `.pyi` stub) is a leaf: it imports nothing of the package."""
    modules = {_module_name(p) for pattern in ("*.py", "*.pyi") for p in PACKAGE.rglob(pattern)}

    def module_of(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        return name

    return {
        _module_name(path): {module_of(t) for t in _imports(path, _module_name(path))}
        - {_module_name(path)}
        for path in PACKAGE.rglob("*.py")
    }


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, without recursion).

    Each is a circle: a module that, through its imports, imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, targets = work[-1]
            target = next((t for t in targets if t in graph), None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                at = stack.index(node)
                component, stack[at:] = stack[at:], []
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle() -> None:
    assert _circles(_graph()) == []


def test_the_circle_check_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]


def test_every_package_has_a_layer() -> None:
    packages = {_package(_module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert packages - set(RANK) == set(), "add the new package to LAYERS"


def test_no_import_runs_up_a_layer() -> None:
    upward = [
        f"{source} imports {target}"
        for source, target in _arrows()
        if RANK[_package(target)] > RANK[_package(source)]
    ]
    assert upward == []


def test_analysis_imports_nothing_from_the_mixin() -> None:
    assert [a for a in _arrows() if a[0].startswith("kvoffload.analysis")
            and a[1].startswith("kvoffload.mixin")] == []  # fmt: skip


def test_the_check_sees_lazy_and_type_only_imports(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from kvoffload.mixin.config import MixinConfig\n"
        "def f():\n    from kvoffload.cli import main\n"
        "from . import sibling\n"
        "from kvoffload import mixin\n"
        "from kvoffload.mixin import generate\n"
        "from kvoffload.units import parse_duration\n"
    )
    found = _imports(source, "kvoffload.analysis.probe")
    assert found == {
        "kvoffload.mixin.config",
        "kvoffload.cli",
        "kvoffload.analysis.sibling",
        "kvoffload.mixin",
        "kvoffload.mixin.generate",
        "kvoffload.units",
    }
