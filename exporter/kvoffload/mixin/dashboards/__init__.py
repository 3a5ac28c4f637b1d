"""The Grafana dashboards: an overview per model and engine, and a fleet view across instances.

Panels read the recording rules where one exists, so dashboards, alerts and sidecar agree.
One module per dashboard; panels.py, queries.py and layout.py hold what they share."""

from __future__ import annotations

# Besides the rules, panels read the sidecar's gauges for what PromQL cannot compute, and raw
# vLLM series for per-engine views.
from kvoffload.mixin import grafana as g
from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.dashboards.fleet import FLEET, fleet
from kvoffload.mixin.dashboards.layout import with_rules_note
from kvoffload.mixin.dashboards.overview import OVERVIEW, overview
from kvoffload.mixin.dashboards.panels import (
    DIAGNOSTICS_ROW,
    EXACT_ROW,
    NEEDS_KV_EVENTS,
    ONLY_WHERE,
    about,
    unit,
)
from kvoffload.mixin.dashboards.queries import (
    NEEDS_RULES,
    NEEDS_RULES_TITLE,
    RULE_NAME,
    PanelQueries,
    fallback_rules,
    needs_rules,
    raw_expr,
)

__all__ = [
    "DIAGNOSTICS_ROW",
    "EXACT_ROW",
    "FLEET",
    "NEEDS_KV_EVENTS",
    "NEEDS_RULES",
    "NEEDS_RULES_TITLE",
    "ONLY_WHERE",
    "OVERVIEW",
    "RULE_NAME",
    "PanelQueries",
    "about",
    "fallback_rules",
    "fleet",
    "needs_rules",
    "overview",
    "raw_expr",
    "render",
    "unit",
    "with_rules_note",
]


def render(cfg: MixinConfig) -> dict[str, str]:
    """Relative path → JSON text of every dashboard, import and provisioning variants."""
    out: dict[str, str] = {}
    for name, build in ((OVERVIEW, overview), (FLEET, fleet)):
        d = build(cfg)
        types = [p["type"] for p in d["panels"] if p["type"] != "row"]
        out[f"import/kvoffload-{name}.json"] = g.to_json(g.for_import(d, types))
        # Indented by one: the provisioning files become ConfigMaps (deploy/kustomize), whose
        # client-side `kubectl apply` annotation must stay under 256 KiB.
        out[f"provisioning/kvoffload-{name}.json"] = g.to_json(g.for_provisioning(d), indent=1)
    return out
