"""The mixtool and dashboard-linter rules, in Python (neither Go tool installs here).

mixtool (monitoring-mixins/mixtool, pkg/mixer/lint.go): CamelCase alert names, a severity
label, a summary that is present, untemplated and a sentence, a templated description; plus a
runbook_url whose anchor exists in docs/runbooks.md. dashboard-linter (grafana/dashboard-
linter): title and uid, one `datasource` variable used by every panel and target, job and
instance variables (multi, `.+`), title, description and a valid unit on every panel, valid
PromQL, counters only inside rate/irate/increase, `$__rate_interval` as their range.
Each function returns a list of problems; empty means clean.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import promql_parser

ALERT_NAME = re.compile(r"^([A-Z]+[a-z0-9]+)+$")
SUMMARY_STYLE = re.compile(r"^[A-Z].+\.$")
RECORD_NAME = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")
SEVERITIES = {"critical", "warning", "info"}
COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")
RATE_FUNCTIONS = {"rate", "irate", "increase"}
# What a pooled panel's description says (kvoffload.mixin.dashboards.panels.POOLED).
POOLED = "sums of rates over sums of rates"
# A range no dashboard writes by hand: it marks where $__rate_interval stood.
RATE_INTERVAL_MARK = "211d"
DATASOURCE_UIDS = {"$datasource", "${datasource}"}

# grafana/dashboard-linter lint/rule_panel_units.go (Grafana's valueFormats categories), the
# units these dashboards may use; anything else is reported.
VALID_UNITS = {
    "none",
    "string",
    "short",
    "percent",
    "percentunit",
    "bytes",
    "decbytes",
    "bits",
    "decbits",
    "Bps",
    "binBps",
    "bps",
    "MBs",
    "GBs",
    "s",
    "ms",
    "µs",
    "ns",
    "m",
    "h",
    "d",
    "dtdurations",
    "ops",
    "reqps",
    "rps",
    "wps",
    "iops",
    "cps",
    "bool",
}
UNIT_PANELS = {"stat", "singlestat", "graph", "table", "timeseries", "gauge"}
# Grafana's custom units (`suffix:×`, `prefix:$`: a fixed text after or before the value).
CUSTOM_UNIT = re.compile(r"^(suffix|prefix):\S.*$")


def valid_unit(unit: object) -> bool:
    return unit in VALID_UNITS or (isinstance(unit, str) and bool(CUSTOM_UNIT.match(unit)))


# -- alerts ------------------------------------------------------------------------------------
def github_anchors(markdown: str) -> set[str]:
    """Anchors GitHub generates for the headings of a Markdown file."""
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).lower())
            anchors.add(text.replace(" ", "-"))
    anchors |= set(re.findall(r'<a (?:name|id)="([^"]+)"', markdown))
    return anchors


def lint_alerts(groups: list[dict[str, Any]], runbook_anchors: set[str]) -> list[str]:
    problems = []
    for group in groups:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            name = rule["alert"]
            labels = rule.get("labels") or {}
            notes = rule.get("annotations") or {}
            summary, description = notes.get("summary"), notes.get("description")
            if not ALERT_NAME.match(name):
                problems.append(f"{name}: alert name not CamelCase")
            if labels.get("severity") not in SEVERITIES:
                problems.append(f"{name}: severity label missing or not one of {SEVERITIES}")
            if not summary:
                problems.append(f"{name}: summary missing")
            else:
                if "{{" in summary:
                    problems.append(f"{name}: summary must not be templated")
                if not SUMMARY_STYLE.match(summary):
                    problems.append(f"{name}: summary must start upper-case and end with '.'")
            if not description:
                problems.append(f"{name}: description missing")
            elif "{{" not in description:
                problems.append(f"{name}: description must be templated")
            url = notes.get("runbook_url", "")
            if "#" not in url:
                problems.append(f"{name}: runbook_url missing or without an anchor")
            elif url.rsplit("#", 1)[1] not in runbook_anchors:
                problems.append(f"{name}: runbook anchor #{url.rsplit('#', 1)[1]} not found")
            if "for" not in rule:
                problems.append(f"{name}: no `for:` duration")
            problems += [f"{name}: {p}" for p in promql_problems(rule["expr"], dashboard=False)]
    return problems


def lint_recording_rules(groups: list[dict[str, Any]]) -> list[str]:
    problems = []
    for group in groups:
        for rule in group["rules"]:
            if "record" not in rule:
                continue
            if not RECORD_NAME.match(rule["record"]):
                problems.append(f"{rule['record']}: not level:metric:operations")
            problems += [
                f"{rule['record']}: {p}" for p in promql_problems(rule["expr"], dashboard=False)
            ]
    return problems


# -- PromQL ------------------------------------------------------------------------------------
def substitute(expr: str) -> str:
    """Grafana variables → values the parser accepts (dashboard-linter does the same)."""
    expr = re.sub(r"\$\{?__rate_interval\}?", RATE_INTERVAL_MARK, expr)
    expr = re.sub(r"\$\{?__(interval|range)\}?", "5m", expr)
    return re.sub(r"\$\{?(\w+)\}?", r"\1_value", expr)


def _children(node: Any) -> list[Any]:
    out = []
    for attr in ("expr", "lhs", "rhs", "param", "vector_selector"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, str | int | float):
            out.append(child)
    out += list(getattr(node, "args", None) or [])
    return out


def _selector_name(vs: promql_parser.VectorSelector) -> str:
    if vs.name:
        return vs.name
    for m in vs.matchers.matchers:
        if m.name == "__name__":
            return m.value
    return ""


def _leftmost(node: Any) -> Any:
    while isinstance(node, promql_parser.BinaryExpr | promql_parser.ParenExpr):
        node = node.lhs if isinstance(node, promql_parser.BinaryExpr) else node.expr
    return node


def _rule_window(parents: list[Any]) -> timedelta | None:
    """Inside a dashboard's `rule or raw` fallback (the rule's own expression, for a Prometheus
    without the rules): the window the rule's name ends in (…rate5m → 5 minutes). That branch
    follows the rule's lint (its window, its counters since start), not the dashboard's."""
    for p in parents:
        if isinstance(p, promql_parser.BinaryExpr) and str(p.op) == "or":
            lhs = _leftmost(p.lhs)
            name = _selector_name(lhs) if isinstance(lhs, promql_parser.VectorSelector) else ""
            m = re.search(r":[a-z_]+?(\d+)([smhd])$", name) if name.count(":") == 2 else None
            if m:
                unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
                return timedelta(**{unit: int(m.group(1))})
            if name.count(":") == 2:
                return timedelta(0)  # a rule without a window: no rate in its expression
    return None


def _duration(text: str) -> timedelta:
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[text[-1]]
    return timedelta(**{unit: int(text[:-1])})


def promql_problems(
    expr: str,
    dashboard: bool = True,
    series_only: bool = False,
    stated: frozenset[timedelta] = frozenset(),
) -> list[str]:
    """Problems of one query. dashboard: Grafana variables substituted and the dashboard-linter
    rules applied (rules may read raw counters); series_only: a label_values() selector, only
    validity counts."""
    try:
        tree = promql_parser.parse(substitute(expr) if dashboard else expr)
    except ValueError as exc:
        return [f"invalid PromQL ({exc}): {expr}"]
    problems: list[str] = []
    if series_only:
        return problems

    def visit(node: Any, parents: list[Any]) -> None:
        window = _rule_window(parents) if dashboard else None
        if isinstance(node, promql_parser.VectorSelector) and dashboard and window is None:
            name = _selector_name(node)
            # A regex like vllm[:_]x_total ends with the same suffix as the name it matches.
            if name.endswith(COUNTER_SUFFIXES):
                ok = (
                    len(parents) >= 2
                    and isinstance(parents[-1], promql_parser.MatrixSelector)
                    and isinstance(parents[-2], promql_parser.Call)
                    and parents[-2].func.name in RATE_FUNCTIONS
                )
                if not ok:
                    problems.append(f"counter {name} not inside rate/irate/increase")
        if isinstance(node, promql_parser.Call) and node.func.name in RATE_FUNCTIONS and dashboard:
            want = timedelta(days=211) if window is None else window
            for arg in node.args:
                # A pooled stat reads the rule's window, which its description states.
                stated_ok = window is None and getattr(arg, "range", None) in stated
                if isinstance(arg, promql_parser.MatrixSelector) and arg.range != want:
                    if stated_ok:
                        continue
                    problems.append(
                        f"{node.func.name}() range is not "
                        f"{'$__rate_interval' if window is None else 'the rule window'}"
                    )
        for child in _children(node):
            visit(child, [*parents, node])

    visit(tree, [])
    return problems


# -- dashboards --------------------------------------------------------------------------------
def _uses_datasource_var(ref: Any) -> bool:
    uid = ref.get("uid") if isinstance(ref, dict) else ref
    return uid in DATASOURCE_UIDS


def lint_dashboard(d: dict[str, Any]) -> list[str]:
    title = d.get("title") or "<untitled>"
    problems = []
    if not d.get("title"):
        problems.append("dashboard has no title")
    if not d.get("uid"):
        problems.append(f"{title}: dashboard has no uid")
    variables = d.get("templating", {}).get("list", [])
    datasources = [v for v in variables if v.get("type") == "datasource"]
    if len(datasources) != 1 or datasources[0].get("name") != "datasource":
        problems.append(f"{title}: needs exactly one datasource variable named 'datasource'")
    elif (
        datasources[0].get("query") != "prometheus" or datasources[0].get("label") != "Data source"
    ):
        problems.append(f"{title}: datasource variable must query prometheus, label 'Data source'")
    by_name = {v.get("name"): v for v in variables}
    for name in ("job", "instance"):
        v = by_name.get(name)
        if v is None:
            problems.append(f"{title}: no {name} variable")
            continue
        if v.get("type") != "query" or not _uses_datasource_var(v.get("datasource")):
            problems.append(f"{title}: {name} variable must be a query on $datasource")
        if not v.get("multi") or v.get("allValue") != ".+":
            problems.append(f"{title}: {name} variable must be multi-select with allValue '.+'")
        if v.get("label") != name.capitalize():
            problems.append(f"{title}: {name} variable should be labelled {name.capitalize()}")
    for v in variables:
        if v.get("type") == "query":
            m = re.fullmatch(r"label_values\((.+), *(\w+)\)", v.get("definition", ""))
            if not m:
                problems.append(f"{title}: variable {v.get('name')}: not label_values(sel, l)")
            else:
                problems += [
                    f"{title}: variable {v['name']}: {p}"
                    for p in promql_problems(m.group(1), series_only=True)
                ]
            if v.get("refresh") != 2:
                problems.append(f"{title}: variable {v.get('name')} must refresh on time change")
    for panel in _panels(d):
        problems += [
            f"{title} / {panel.get('title') or '<untitled>'}: {p}" for p in lint_panel(panel)
        ]
    return problems


def _panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in d.get("panels", []):
        if p.get("type") == "row":
            out += p.get("panels", [])
        else:
            out.append(p)
    return out


def lint_panel(panel: dict[str, Any]) -> list[str]:
    problems = []
    if not panel.get("title"):
        problems.append("no title")
    if not panel.get("description"):
        problems.append("no description")
    if not _uses_datasource_var(panel.get("datasource")):
        problems.append("panel does not use the $datasource variable")
    if panel.get("type") in UNIT_PANELS:
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if not valid_unit(unit):
            problems.append(f"no or invalid unit {unit!r}")
    targets = panel.get("targets") or []
    if not targets and panel.get("type") != "text":
        problems.append("no targets")
    for t in targets:
        if not _uses_datasource_var(t.get("datasource", panel.get("datasource"))):
            problems.append(f"target {t.get('refId')} does not use the $datasource variable")
        problems += promql_problems(t.get("expr", ""), stated=_stated_windows(panel))
    return problems


def _stated_windows(panel: dict[str, Any]) -> frozenset[timedelta]:
    """The windows a pooled panel (sums over sums of the rule's formula across the selection,
    no rule to read) says it covers ("over 5m"): its rate() ranges may be those."""
    description = panel.get("description", "")
    if POOLED not in description:
        return frozenset()
    return frozenset(
        _duration(d) for d in re.findall(r"(?:over|Pooled over) (\d+[smhd])\b", description)
    )
