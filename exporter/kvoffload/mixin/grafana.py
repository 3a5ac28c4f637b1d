"""Grafana dashboard JSON through grafanalib, the only module that imports it.

Its output (grafanalib 0.7.1, dormant) is an old shape, normalised here to Grafana 10–12's.
Swapping grafanalib out then touches only this file."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvoffload.errors import InputError

try:
    import grafanalib.core as G
    from grafanalib._gen import DashboardEncoder
except ModuleNotFoundError as exc:  # an extra: the sidecar image does without it
    raise InputError(
        "the dashboards need grafanalib: pip install 'kvoffload[generate]' "
        "(from a clone: pip install '.[generate]')"
    ) from exc

SCHEMA_VERSION = 39
DATASOURCE_VAR = "datasource"
DATASOURCE_REF = {"type": "prometheus", "uid": "${" + DATASOURCE_VAR + "}"}
IMPORT_INPUT = "DS_PROMETHEUS"
GRID_WIDTH = 24
# A ratio of like quantities shown as a multiple ("13.1×"): Grafana's custom-unit syntax.
TIMES = "suffix:×"

# Target keys worth keeping; the rest are Graphite/legacy leftovers of grafanalib's Target.
_TARGET_KEYS = (
    "datasource",
    "expr",
    "legendFormat",
    "refId",
    "instant",
    "range",
    "format",
    "editorMode",
)
_PANEL_DROP = (
    "cacheTimeout",
    "editable",
    "error",
    "height",
    "hideTimeOverride",
    "links",
    "maxDataPoints",
    "minSpan",
    "repeat",
    "repeatDirection",
    "maxPerRow",
    "span",
    "timeFrom",
    "timeShift",
    "transparent",
    "interval",
    "targets_legacy",
)
_DASHBOARD_DROP = ("rows", "sharedCrosshair", "style", "hideControls", "gnetId")
_VARIABLE_KEYS = (
    "name",
    "label",
    "type",
    "datasource",
    "query",
    "definition",
    "current",
    "options",
    "hide",
    "includeAll",
    "multi",
    "allValue",
    "refresh",
    "regex",
    "sort",
)


@dataclass
class Panel:
    """A grafanalib panel with the grid size it wants."""

    body: Any
    width: int
    height: int


@dataclass
class Section:
    """A dashboard row: its title, its panels, and whether it starts collapsed.

    A collapsed row holds its panels, as Grafana stores one."""

    title: str
    panels: Sequence[Panel]
    collapsed: bool = False


def target(
    expr: str, legend: str = "", *, instant: bool = False, table: bool = False, ref: str = "A"
) -> G.Target:
    return G.Target(
        expr=expr,
        legendFormat=legend,
        refId=ref,
        instant=instant,
        format="table" if table else "time_series",
    )


def _refs(targets: Sequence[G.Target]) -> list[G.Target]:
    """Give each target its own refId (A, B, ...), as Grafana requires."""
    out = []
    for i, t in enumerate(targets):
        t.refId = chr(ord("A") + i)
        out.append(t)
    return out


def _steps(lines: Sequence[tuple[float, str]]) -> list[G.Threshold]:
    steps = [G.Threshold("transparent", 0, 0.0)]  # index 0 is the base step: value null
    steps += [G.Threshold(color, i + 1, float(value)) for i, (value, color) in enumerate(lines)]
    return steps


def value_mappings(codes: dict[int, tuple[str, str]]) -> list[dict[str, Any]]:
    """Grafana value mappings: code → (text, colour), e.g. an action's number → its name."""
    options = {
        str(code): {"text": text, "color": color, "index": i}
        for i, (code, (text, color)) in enumerate(sorted(codes.items()))
    }
    return [{"type": "value", "options": options}]


def annotation(name: str, expr: str, title: str, text: str, tags: str, step: str) -> dict[str, Any]:
    """A Prometheus annotation: a mark on every time panel where `expr` has a sample."""
    return {
        "datasource": dict(DATASOURCE_REF),
        "enable": True,
        "hide": False,
        "iconColor": "orange",
        "name": name,
        "expr": expr,
        "step": step,
        "titleFormat": title,
        "textFormat": text,
        "tagKeys": tags,
        "useValueForTime": False,
        "target": {"expr": expr, "refId": "Anno", "interval": step},
    }


def timeseries(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[G.Target],
    *,
    stack: bool = False,
    min_value: float | None = None,
    max_value: float | None = None,
    lines: Sequence[tuple[float, str]] = (),
    colours: dict[str, str] | None = None,
    width: int = 12,
    height: int = 8,
) -> Panel:
    """A time series panel.

    `lines` are (value, color) dashed reference lines; `colours` fix a series' colour by display
    name (one per advice, say)."""
    overrides = [
        {
            "matcher": {"id": "byName", "options": name},
            "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": colour}}],
        }
        for name, colour in (colours or {}).items()
    ]
    body = G.TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE_REF,
        targets=_refs(targets),
        unit=unit,
        valueMin=min_value,
        valueMax=max_value,
        fillOpacity=30 if stack else 10,
        showPoints="never",
        lineWidth=1,
        stacking={"mode": "normal", "group": "A"} if stack else {"mode": "none"},
        legendDisplayMode="table",
        legendPlacement="bottom",
        legendCalcs=["lastNotNull", "max"],
        tooltipMode="multi",
        thresholds=_steps(lines) if lines else [G.Threshold("green", 0, 0.0)],
        thresholdsStyleMode="dashed" if lines else "off",
        overrides=overrides,
    )
    return Panel(body, width, height)


def stat(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[G.Target],
    *,
    text_mode: str = "value",
    decimals: int | None = None,
    thresholds: Sequence[tuple[float, str]] = (),
    mappings: Sequence[dict[str, Any]] = (),
    width: int = 4,
    height: int = 5,
) -> Panel:
    """A single-value panel.

    text_mode "name" shows the series' legend (a label value); `mappings` turn a value into a
    coloured text."""
    steps = [G.Threshold("blue", 0, 0.0)]
    steps += [G.Threshold(c, i + 1, float(v)) for i, (v, c) in enumerate(thresholds)]
    body = G.Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE_REF,
        targets=_refs(targets),
        format=unit,
        textMode=text_mode,
        decimals=decimals,
        # A sparkline of names or of mapped codes means nothing.
        graphMode="none" if text_mode == "name" or mappings else "area",
        reduceCalc="lastNotNull",
        colorMode="value",
        thresholds=steps,
        mappings=list(mappings),
        noValue="–",
    )
    return Panel(body, width, height)


def bargauge(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[G.Target],
    *,
    min_value: float = 0.0,
    max_value: float | None = None,
    width: int = 12,
    height: int = 8,
) -> Panel:
    """One bar per series (e.g. per histogram bucket), each the mean over the time range.
    (grafanalib writes Grafana 6's options; `_bargauge` rewrites them.)"""
    body = G.BarGauge(
        title=title,
        description=description,
        dataSource=DATASOURCE_REF,
        targets=_refs(targets),
        format=unit,
        min=min_value,
        max=max_value,
        calc="mean",
        orientation="horizontal",
        displayMode="gradient",
        thresholds=[G.Threshold("blue", 0, 0.0)],
    )
    return Panel(body, width, height)


def table(
    title: str,
    description: str,
    targets: Sequence[G.Target],
    columns: Sequence[tuple[str, str, str]],
    *,
    mappings: dict[str, list[dict[str, Any]]] | None = None,
    width: int = 24,
    height: int = 9,
) -> Panel:
    """Instant queries merged into one row per series; columns = (refId field, header, unit).
    A column in `mappings` (by refId) shows its mapped texts on their colours."""
    overrides = []
    for ref, header, unit in columns:
        properties: list[dict[str, Any]] = [
            {"id": "unit", "value": unit},
            {"id": "displayName", "value": header},
        ]
        if mappings and ref in mappings:
            properties += [
                {"id": "mappings", "value": mappings[ref]},
                {"id": "custom.cellOptions", "value": {"type": "color-background"}},
            ]
        overrides.append(
            {"matcher": {"id": "byName", "options": f"Value #{ref}"}, "properties": properties}
        )
    body = G.Table(
        title=title,
        description=description,
        dataSource=DATASOURCE_REF,
        targets=_refs(targets),
        unit="none",
        overrides=overrides,
        thresholds=[G.Threshold("green", 0, 0.0)],
        transformations=[
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}}},
        ],
    )
    return Panel(body, width, height)


def text(title: str, description: str, content: str, *, width: int = 24, height: int = 4) -> Panel:
    """A Markdown text panel (no query)."""
    body = G.Text(title=title, description=description, content=content, mode="markdown")
    return Panel(body, width, height)


def datasource_variable() -> G.Template:
    return G.Template(
        name=DATASOURCE_VAR, label="Data source", type="datasource", query="prometheus", hide=0
    )


def query_variable(name: str, query: str, *, label: str | None = None) -> G.Template:
    """A multi-select label_values() variable whose "All" is `.+` (dashboard-linter style)."""
    return G.Template(
        name=name,
        label=label or name.replace("_", " ").capitalize(),
        query=query,
        dataSource=DATASOURCE_REF,
        includeAll=True,
        multi=True,
        allValue=".+",
        refresh=2,
        sort=1,
        type="query",
    )


def _layout(section: Section, y: int) -> int:
    """Pack a section's panels in lines from `y` on; return the y under the last line. Every
    line must fill the grid's width with panels of one height: no empty grid areas."""
    line: list[Panel] = []

    def close(line: list[Panel]) -> None:
        if sum(p.width for p in line) != GRID_WIDTH or len({p.height for p in line}) != 1:
            shape = ", ".join(f"{p.width}x{p.height}" for p in line)
            raise ValueError(f"row {section.title!r}: a line of {shape} leaves an empty area")

    for p in section.panels:
        if sum(q.width for q in line) + p.width > GRID_WIDTH:
            close(line)
            y += line[0].height
            line = []
        p.body.gridPos = G.GridPos(h=p.height, w=p.width, x=sum(q.width for q in line), y=y)
        line.append(p)
    if line:
        close(line)
        y += line[0].height
    return y


def dashboard(
    *,
    title: str,
    uid: str,
    description: str,
    tags: Sequence[str],
    sections: Sequence[Section],
    variables: Sequence[G.Template],
    refresh: str,
    time_from: str,
    links: Sequence[dict[str, Any]] = (),
    annotations: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The dashboard as Grafana JSON: one row per section, panels packed on the 24-column grid.

    A collapsed row holds its panels and takes one grid unit; the rows after it follow straight
    on."""
    panels: list[Any] = []
    y = 0
    for section in sections:
        row = G.RowPanel(
            title=section.title,
            gridPos=G.GridPos(h=1, w=GRID_WIDTH, x=0, y=y),
            collapsed=section.collapsed,
        )
        panels.append(row)
        y += 1
        end = _layout(section, y)
        if section.collapsed:
            row.panels = [p.body for p in section.panels]
        else:
            panels += [p.body for p in section.panels]
            y = end
    d = G.Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=list(tags),
        panels=panels,
        templating=G.Templating(list=list(variables)),
        refresh=refresh,
        time=G.Time(time_from, "now"),
        timezone="browser",
        graphTooltip=1,
    ).auto_panel_ids()
    raw = json.loads(json.dumps(d.to_json_data(), cls=DashboardEncoder))
    raw["links"] = list(links)
    out = _normalise(raw)
    out["annotations"]["list"] += list(annotations)
    return out


# -- normalisation -----------------------------------------------------------------------------
def _drop_nulls(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _drop_nulls(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_drop_nulls(v) for v in obj]
    return obj


def _thresholds(field_config: dict[str, Any]) -> None:
    defaults = field_config.get("defaults", {})
    th = defaults.get("thresholds")
    if not th:
        return
    steps = []
    for step in th.get("steps", []):
        value = step.get("value")
        steps.append({"color": step["color"], "value": None if value in (None, "null") else value})
    defaults["thresholds"] = {"mode": "absolute", "steps": steps}


def _target(t: dict[str, Any]) -> dict[str, Any]:
    out = {k: t[k] for k in _TARGET_KEYS if k in t and t[k] is not None}
    out["datasource"] = dict(DATASOURCE_REF)
    out["range"] = not t.get("instant", False)
    out["editorMode"] = "code"
    if out.get("format") == "time_series":
        del out["format"]
    return out


def _panel(p: dict[str, Any]) -> dict[str, Any]:
    # Thresholds first: they hold the one null that matters (the base step).
    if "fieldConfig" in p:
        _thresholds(p["fieldConfig"])
    thresholds = p.get("fieldConfig", {}).get("defaults", {}).get("thresholds")
    p = _drop_nulls({k: v for k, v in p.items() if k not in _PANEL_DROP})
    if thresholds is not None:
        p["fieldConfig"]["defaults"]["thresholds"] = thresholds
    if p.get("type") == "row":
        row = {k: p[k] for k in ("collapsed", "gridPos", "id", "panels", "title", "type")}
        row["panels"] = [_panel(child) for child in row["panels"]]
        return row
    p["datasource"] = dict(DATASOURCE_REF)
    if p.get("type") == "text":
        p["targets"] = []
        return p
    p["targets"] = [_target(t) for t in p.get("targets", [])]
    if not p.get("transformations"):
        p.pop("transformations", None)
    if p.get("type") == "table":
        # grafanalib's Table still writes the pre-7 table panel's keys at the top level.
        for legacy in ("columns", "fontSize", "mappings", "color"):
            p.pop(legacy, None)
    if p.get("type") == "bargauge":
        p = _bargauge(p)
    return p


def _bargauge(p: dict[str, Any]) -> dict[str, Any]:
    """Grafana 6's `options.fieldOptions` (calcs, unit, min/max, thresholds) → Grafana 10's form.

    That is `fieldConfig.defaults` and `options.reduceOptions`, all Grafana ≥ 10 reads."""
    options = dict(p.get("options", {}))
    legacy = options.pop("fieldOptions", {})
    for key in ("showThresholdLabels", "showThresholdMarkers"):  # the gauge's, not the bar's
        options.pop(key, None)
    defaults = {k: v for k, v in (legacy.get("defaults") or {}).items() if k != "links"}
    field_config = p.setdefault("fieldConfig", {"defaults": {}})
    field_config["defaults"] = {
        **defaults,
        **field_config.get("defaults", {}),
        "color": {"mode": "thresholds"},
    }
    field_config.setdefault("overrides", [])
    options["reduceOptions"] = {
        "calcs": list(legacy.get("calcs") or ["mean"]),
        "fields": "",
        "values": bool(legacy.get("values", False)),
    }
    options |= {
        "showUnfilled": True,
        "valueMode": "color",
        "namePlacement": "auto",
        "sizing": "auto",
        "minVizWidth": 8,
        "minVizHeight": 16,
    }
    p["options"] = options
    return p


def _variable(v: dict[str, Any]) -> dict[str, Any]:
    out = {k: v[k] for k in _VARIABLE_KEYS if k in v}
    out["current"] = {}
    out["options"] = []
    out["regex"] = v.get("regex") or ""
    if v["type"] == "datasource":
        for k in ("datasource", "allValue", "definition"):
            out.pop(k, None)
        out["refresh"] = 1
    else:
        out["datasource"] = dict(DATASOURCE_REF)
        out["definition"] = v["query"]
        out["query"] = {"query": v["query"], "refId": f"{v['name']}-variable"}
    return out


# grafanalib writes schemaVersion 12, string datasources, legacy keys and Grafana 6's bar gauge
# options; Grafana 10–12 export object datasource refs (DATASOURCE_REF), schemaVersion 39,
# `fieldConfig`/`options.reduceOptions` and no legacy or null keys.
def _normalise(d: dict[str, Any]) -> dict[str, Any]:
    for k in _DASHBOARD_DROP:
        d.pop(k, None)
    d["schemaVersion"] = SCHEMA_VERSION
    d["panels"] = [_panel(p) for p in d["panels"]]
    d["templating"] = {"list": [_variable(v) for v in d["templating"]["list"]]}
    d["annotations"] = {
        "list": [
            {
                "builtIn": 1,
                "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "enable": True,
                "hide": True,
                "iconColor": "rgba(0, 211, 255, 1)",
                "name": "Annotations & Alerts",
                "type": "dashboard",
            }
        ]
    }
    d["timepicker"] = {}
    d.pop("__inputs", None)
    # Top-level nulls only: panels keep the null of their base threshold step.
    return {k: v for k, v in d.items() if v is not None} | {"id": None}


# -- variants ----------------------------------------------------------------------------------
def for_import(d: dict[str, Any], panel_types: Sequence[str]) -> dict[str, Any]:
    """The "Import dashboard" variant of a dashboard.

    Grafana asks for the Prometheus data source (input DS_PROMETHEUS) and makes it the `datasource`
    variable's default."""
    out = json.loads(json.dumps(d))
    for v in out["templating"]["list"]:
        if v["type"] == "datasource":
            ref = "${" + IMPORT_INPUT + "}"
            v["current"] = {"selected": False, "text": ref, "value": ref}
    requires = [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
    ]
    requires += [
        {"type": "panel", "id": t, "name": t.capitalize(), "version": ""}
        for t in sorted(set(panel_types))
    ]
    inputs = [
        {
            "name": IMPORT_INPUT,
            "label": "Prometheus",
            "description": "",
            "type": "datasource",
            "pluginId": "prometheus",
            "pluginName": "Prometheus",
        }
    ]
    return {"__inputs": inputs, "__requires": requires, **out}


def for_provisioning(d: dict[str, Any]) -> dict[str, Any]:
    """The file-provisioning variant: no inputs; the variable starts on the default
    Prometheus data source of the Grafana instance."""
    return json.loads(json.dumps(d))


def to_json(d: dict[str, Any], indent: int = 2) -> str:
    """The dashboard as committed: sorted keys, one value a line (diffs stay readable)."""
    return json.dumps(d, indent=indent, sort_keys=True, ensure_ascii=False) + "\n"
