"""Every `kvoffload_*` name the mixin and the docs read is one the sidecar exports.

Why: alerts, dashboards and docs name the sidecar's series as strings, so a typo or a rename
would leave a panel or an alert silently empty.
"""

from __future__ import annotations

import re
from pathlib import Path

from kvoffload.analysis.signals import FIGURES
from kvoffload.sidecar.metrics import SERIES

ROOT = Path(__file__).resolve().parents[1]
READERS = ("alerts", "dashboards", "docs", "deploy", "examples")
# What prometheus_client adds to a family's name on the wire.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "info": ("_info",),
}
# A whole name: not a recording rule's middle part (`level:name:ops`), nor a `name_*` pattern.
NAME = re.compile(r"(?<![:\w])kvoffload_[a-z0-9_]*[a-z0-9](?![a-z0-9_*:])")


def _exported() -> set[str]:
    names = {f.metric for f in FIGURES}
    for row in SERIES:
        names.add(row.name)
        names.update(row.name + suffix for suffix in SUFFIXES.get(row.type, ()))
    return names


def _read_names() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for folder in READERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if not path.is_file() or path.suffix not in {".yaml", ".yml", ".json", ".md"}:
                continue
            for name in NAME.findall(path.read_text(errors="replace")):
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_sidecar_name_read_elsewhere_is_exported() -> None:
    exported = _exported()
    read = _read_names()
    unknown = {name: sorted(set(where))[:3] for name, where in read.items() if name not in exported}
    assert not unknown, unknown
    # The check reads something: the alerts, dashboards and docs name over 50 sidecar series.
    assert sum(1 for name in read if name in exported) > 50
