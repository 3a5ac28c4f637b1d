"""The generated dashboards: units from the catalog, Grafana 10 panel options, variables that
follow the config's target labels, rows needing KV events collapsed and marked, and a grid
without holes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from kvoffload.analysis.signals import FIGURES
from kvoffload.mixin import dashboards, grafana
from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.dashboards import DIAGNOSTICS_ROW, EXACT_ROW, NEEDS_KV_EVENTS, unit
from kvoffload.mixin.dashboards.tiers import TIERS_ROW
from kvoffload.mixin.generate import render_all
from kvoffload.mixin.renderings import RENDERINGS, record_name
from kvoffload.mixin.validate import validate
from kvoffload.sidecar.metrics import KV_EVENT_METRICS

DASHBOARDS = {rel: json.loads(text) for rel, text in render_all().items() if rel.endswith(".json")}
# Series only `serve --kv-events` exports (the KV-event table of the sidecar's /metrics, and
# the predicted TTFT effect, which needs the curve).
KV_EVENT_SERIES = (*KV_EVENT_METRICS, "kvoffload_predicted_offload_ttft_effect_seconds")


def _all_panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def _units(panel: dict[str, Any]) -> dict[str, str]:
    """refId → the unit Grafana shows that query in (a table's column override, else the
    panel's)."""
    default = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    out = {t["refId"]: default for t in panel.get("targets", [])}
    for o in panel.get("fieldConfig", {}).get("overrides", []):
        ref = o["matcher"]["options"].removeprefix("Value #")
        for prop in o["properties"]:
            if prop["id"] == "unit":
                out[ref] = prop["value"]
    return out


def _figure_series(cfg: MixinConfig) -> dict[str, str]:
    """Series name → figure key: each figure's recording rules and its sidecar gauge."""
    out = {f.metric: f.key for f in FIGURES}
    for r in RENDERINGS:
        if len(r.keys) == 1:
            for w in r.windows or (None,):
                out[r.record(cfg, w)] = r.keys[0]
    return out


@pytest.mark.parametrize("rel", sorted(DASHBOARDS))
def test_every_figure_shows_in_its_catalog_unit(rel: str) -> None:
    """A query reading a figure (its rule, else its sidecar gauge) is shown in the Grafana unit
    of the figure's catalog unit: shares in percent, multiples as ×, bytes/s as Bps."""
    series = _figure_series(MixinConfig())
    checked = 0
    for panel in _all_panels(DASHBOARDS[rel]):
        units = _units(panel)
        for t in panel.get("targets", []):
            # A rule's raw fallback may read sidecar gauges as operands: the rule names the
            # figure shown; a query without one shows its sidecar gauge.
            names = set(re.findall(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", t["expr"])) or set(
                re.findall(r"kvoffload_[a-z_]+", t["expr"])
            )
            keys = {series[n] for n in names if n in series}
            for key in keys:
                checked += 1
                assert units[t["refId"]] == unit(key), (panel["title"], key, units[t["refId"]])
    assert checked > 10


def test_multiples_are_not_percentages() -> None:
    """The reuse ratio is loaded ÷ stored bytes: 13.1 reads 13.1×, not 1,310%."""
    assert unit("reuse_ratio") == unit("speedup") == grafana.TIMES == "suffix:×"
    assert unit("cpu_fill_ratio_since_start") == grafana.TIMES
    assert unit("offload_hit_ratio") == "percentunit"
    reuse = record_name("reuse_ratio", MixinConfig())
    seen = 0
    for d in DASHBOARDS.values():
        for panel in _all_panels(d):
            units = _units(panel)
            for t in panel.get("targets", []):
                # The overview's stat pools the rule's formula over the selection (no rule).
                if reuse in t["expr"] or panel["title"].startswith("Reuse ratio"):
                    seen += 1
                    assert units[t["refId"]] == "suffix:×", panel["title"]
    assert seen >= 4 * 2  # overview stat and chart, fleet table and chart; two variants each


def _keys(obj: Any) -> Iterator[str]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _keys(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _keys(v)


@pytest.mark.parametrize("rel", sorted(DASHBOARDS))
def test_grafana_10_panel_options(rel: str) -> None:
    """No Grafana 6 `fieldOptions`; the bar gauge keeps its unit and range where Grafana ≥ 10
    reads them (fieldConfig.defaults) and reduces by options.reduceOptions."""
    d = DASHBOARDS[rel]
    assert "fieldOptions" not in set(_keys(d))
    for panel in _all_panels(d):
        if panel["type"] == "bargauge":
            assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
            assert panel["fieldConfig"]["defaults"]["max"] == 1.0
            assert panel["options"]["reduceOptions"] == {
                "calcs": ["mean"],
                "fields": "",
                "values": False,
            }
            assert "showThresholdMarkers" not in panel["options"]
        if panel["type"] in ("stat", "bargauge"):
            assert "reduceOptions" in panel["options"], panel["title"]


def test_the_job_variable_lists_jobs_rather_than_pinning_one() -> None:
    """Target variables list vLLM's own gauge under both spellings, narrowed by the rules'
    vLLM selector and nothing else: no recording rule (they fill without kvoffload's rules),
    and a regenerated selector is the only pin."""
    for selector in ('job="vllm"', 'job="llm", namespace="prod"'):
        cfg = MixinConfig(vllm_selector=selector)
        d = dashboards.overview(cfg)
        by_name = {v["name"]: v for v in d["templating"]["list"]}
        series = f'__name__=~"vllm[:_]num_requests_running", {selector}'
        assert by_name["job"]["definition"] == f"label_values({{{series}}}, job)"
        assert by_name["instance"]["definition"] == (
            f'label_values({{{series}, job=~"$job"}}, instance)'
        )
        assert by_name["engine"]["definition"] == (
            f'label_values({{{series}, job=~"$job", instance=~"$instance", '
            f'model_name=~"$model_name"}}, engine)'
        )
        for name in ("job", "instance", "model_name", "engine"):
            definition = by_name[name]["definition"]
            assert ":" not in definition.replace("vllm[:_]", ""), definition
            assert definition.count('job="') == 1, definition
    for d in DASHBOARDS.values():
        job = next(v for v in d["templating"]["list"] if v["name"] == "job")
        assert job["includeAll"] and job["multi"] and job["allValue"] == ".+"


def test_target_labels_flow_into_variables_and_filters() -> None:
    """Rules grouped by (instance, pod) have no `job`: the dashboards neither filter by it nor
    offer it; they offer and filter by `pod`. The result still validates."""
    cfg = MixinConfig(target_labels=("instance", "pod"))
    files = render_all(cfg)
    validate(files, None)
    rules = files["alerts/rules/kvoffload-rules.yaml"]
    assert "by (instance, pod, model_name)" in rules and "job, instance" not in rules
    for rel, text in files.items():
        if not rel.endswith(".json"):
            continue
        d = json.loads(text)
        names = [v["name"] for v in d["templating"]["list"]]
        assert names[:4] == ["datasource", "instance", "pod", "model_name"], names
        assert "$job" not in text and "job=~" not in text
        for panel in _all_panels(d):
            for t in panel.get("targets", []):
                for rule in re.findall(r"model_name:[a-z0-9_]+:[a-z0-9_]+\{[^}]*\}", t["expr"]):
                    if ":replica_" in rule:  # per model across its replicas: no target labels
                        continue
                    assert 'instance=~"$instance", pod=~"$pod"' in rule, (panel["title"], rule)
    overview = json.loads(files["dashboards/provisioning/kvoffload-overview.json"])
    engine = next(v for v in overview["templating"]["list"] if v["name"] == "engine")
    assert 'pod=~"$pod"' in engine["definition"] and 'job="vllm"' in engine["definition"]


def _reads_kv_events(panel: dict[str, Any]) -> bool:
    return any(name in t["expr"] for t in panel.get("targets", []) for name in KV_EVENT_SERIES)


@pytest.mark.parametrize("rel", sorted(DASHBOARDS))
def test_rows_needing_kv_events_are_collapsed_and_say_so(rel: str) -> None:
    d = DASHBOARDS[rel]
    for p in d["panels"]:
        if p["type"] != "row":
            assert not _reads_kv_events(p), f"{p['title']} needs KV events but shows open"
            continue
        needs = [c["title"] for c in p["panels"] if _reads_kv_events(c)]
        if p["title"].endswith(NEEDS_KV_EVENTS):
            assert p["collapsed"] and p["panels"] and needs, p["title"]
        elif p["title"] in (DIAGNOSTICS_ROW, TIERS_ROW):
            # Collapsed for its detail (or for servers without a secondary tier), not for KV
            # events: none of its panels reads them.
            assert p["collapsed"] and p["panels"] and not needs, p["title"]
        else:
            assert not p["collapsed"] and not p["panels"], p["title"]
    if "overview" in rel:
        rows = [p for p in d["panels"] if p["type"] == "row" and p["collapsed"]]
        assert [(r["title"], len(r["panels"])) for r in rows] == [
            (TIERS_ROW, 8),
            (EXACT_ROW, 7),
            (DIAGNOSTICS_ROW, 6),
        ]


def _tiles(panels: list[dict[str, Any]], top: int, bottom: int) -> list[str]:
    """Problems of `panels` as a tiling of the grid's full width from `top` to `bottom`."""
    cells: dict[tuple[int, int], str] = {}
    problems = []
    for p in panels:
        pos = p["gridPos"]
        if pos["x"] < 0 or pos["x"] + pos["w"] > grafana.GRID_WIDTH or pos["y"] < top:
            problems.append(f"{p['title']} outside its row: {pos}")
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                if (x, y) in cells:
                    problems.append(f"{p['title']} overlaps {cells[x, y]} at {(x, y)}")
                cells[x, y] = p["title"]
    holes = [
        (x, y) for y in range(top, bottom) for x in range(grafana.GRID_WIDTH) if (x, y) not in cells
    ]
    if holes:
        problems.append(f"empty grid area at {holes[:4]}… ({len(holes)} cells)")
    if cells and max(y for _x, y in cells) >= bottom:
        problems.append("panels reach under the next row")
    return problems


@pytest.mark.parametrize("rel", sorted(DASHBOARDS))
def test_every_row_is_tiled_without_holes(rel: str) -> None:
    """Each row's panels cover the full width from under the row to its last panel's bottom,
    without overlaps; the next row starts right there (right under a collapsed row)."""
    d = DASHBOARDS[rel]
    rows = [i for i, p in enumerate(d["panels"]) if p["type"] == "row"]
    assert rows and rows[0] == 0, "every panel is in a row"
    problems = []
    y = 0
    for n, i in enumerate(rows):
        row = d["panels"][i]
        assert row["gridPos"] == {"h": 1, "w": 24, "x": 0, "y": y}, (row["title"], y)
        end = rows[n + 1] if n + 1 < len(rows) else len(d["panels"])
        members = row["panels"] if row["collapsed"] else d["panels"][i + 1 : end]
        assert members, f"row {row['title']} is empty"
        bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in members)
        problems += [f"{row['title']}: {p}" for p in _tiles(members, y + 1, bottom)]
        y = y + 1 if row["collapsed"] else bottom
    assert not problems, "\n".join(problems)


def test_the_layout_refuses_a_line_that_leaves_a_hole() -> None:
    def panel(width: int, height: int) -> grafana.Panel:
        return grafana.stat("t", "d", "none", [grafana.target("up")], width=width, height=height)

    for members in ([panel(12, 8)], [panel(12, 8), panel(12, 5)], [panel(8, 5)] * 4):
        with pytest.raises(ValueError, match="empty area"):
            grafana.dashboard(
                title="t",
                uid="u",
                description="d",
                tags=(),
                sections=[grafana.Section("r", members)],
                variables=[],
                refresh="30s",
                time_from="now-1h",
            )


def test_figure_panels_say_what_the_catalog_says() -> None:
    """Panels showing one figure carry its catalog help text (the words of /metrics): stored −
    loaded is a lower bound of the bytes never loaded back, never an upper one."""
    cfg = MixinConfig()
    d = dashboards.overview(cfg)
    panels = {p["title"]: p for p in _all_panels(d)}
    wasted = panels[f"Stored but not loaded back ({cfg.slow_window})"]["description"]
    help_text = next(f.help for f in FIGURES if f.key == "wasted_bytes")
    assert help_text.replace("over the window", f"over {cfg.slow_window}") in wasted
    assert "lower bound" in wasted and record_name("wasted_bytes", cfg) in wasted
    for rel, text in render_all().items():
        assert not re.search(r"upper[ -]bound", text, re.I), rel


@pytest.mark.parametrize("rel", sorted(DASHBOARDS))
def test_panels_reading_a_rule_without_fallback_say_so_and_are_listed(rel: str) -> None:
    """Every recording rule a query reads has its raw fallback beside it, or the panel's
    description says it needs the rules and the top text panel names it."""
    cfg = MixinConfig()
    d = DASHBOARDS[rel]
    note = d["panels"][1]
    assert note["type"] == "text" and note["title"] == dashboards.NEEDS_RULES_TITLE
    fallback = dashboards.fallback_rules(cfg)
    for panel in _all_panels(d):
        for t in panel.get("targets", []):
            for name in dashboards.RULE_NAME.findall(t["expr"]):
                if name in fallback:
                    assert "\nor\n" in t["expr"], (panel["title"], name)
                else:
                    assert dashboards.NEEDS_RULES in panel["description"], panel["title"]
                    assert f"**{panel['title']}**" in note["options"]["content"]


def test_a_rule_only_panel_is_marked_and_listed() -> None:
    """A query on a rule whose expression reads another rule (no raw stand-in) gets the note in
    its description and a line in the text panel; one with a fallback gets neither."""
    cfg = MixinConfig()
    s = dashboards.PanelQueries(cfg, per_engine=False)
    rule_only = grafana.timeseries("Rule only", "d.", "s", [grafana.target("a:b:rate5m{x}")])
    raw = grafana.timeseries("Raw too", "d.", "s", [grafana.target(s.rule("offload_hit_ratio"))])
    about, _section = dashboards.with_rules_note(cfg, [grafana.Section("S", [rule_only, raw])])
    assert dashboards.NEEDS_RULES in rule_only.body.description
    assert dashboards.NEEDS_RULES not in raw.body.description
    content = about.panels[0].body.content
    assert "**Rule only** (S): a:b:rate5m" in content and "Raw too" not in content


def test_without_the_fallback_every_rule_panel_is_marked_and_listed() -> None:
    """`dashboard_raw_fallback=false` (rules alone, cheaper on a large fleet): no query carries
    a raw side, and every panel reading a rule says it needs them and is listed on top."""
    cfg = MixinConfig(dashboard_raw_fallback=False)
    assert dashboards.fallback_rules(cfg) == set()
    marked = 0
    for build in (dashboards.overview, dashboards.fleet):
        d = build(cfg)
        content = d["panels"][1]["options"]["content"]
        for panel in _all_panels(d):
            exprs = [t["expr"] for t in panel.get("targets", [])]
            if any(dashboards.RULE_NAME.search(e) for e in exprs):
                assert dashboards.NEEDS_RULES in panel["description"], panel["title"]
                assert f"**{panel['title']}**" in content, panel["title"]
                marked += 1
                # A rule and vLLM's raw series in one query would be a fallback.
                assert not any('__name__=~"vllm' in e for e in exprs), panel["title"]
    # The overview's pooled stats (sums over sums across the selection) read no rule at all.
    assert marked > 25
    validate(render_all(cfg), None)
