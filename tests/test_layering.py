"""The package's import graph runs one way: each layer imports only itself and those below.

Read from the source (every `import`, also those inside functions and TYPE_CHECKING blocks),
so a lazy import cannot hide a circle the way `mixin.promql` ↔ `analysis` once did.
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
                out.add(node.module)
    return {name for name in out if name.split(".")[0] == "kvoffload"}


def _arrows() -> list[tuple[str, str]]:
    arrows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        if module in ENTRY_POINTS:
            continue
        arrows.extend((module, target) for target in _imports(path, module))
    return arrows


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
        "if TYPE_CHECKING:\n    from kvoffload.mixin.promql import MixinConfig\n"
        "def f():\n    from kvoffload.cli import main\n"
        "from . import sibling\n"
    )
    found = _imports(source, "kvoffload.analysis.probe")
    assert found == {"kvoffload.mixin.promql", "kvoffload.cli", "kvoffload.analysis.sibling"}
