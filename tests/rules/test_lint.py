"""The generated rules and dashboards pass the mixtool and dashboard-linter rules, and the lint
catches what it claims to catch."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from rules_lint import (
    github_anchors,
    lint_alerts,
    lint_dashboard,
    lint_recording_rules,
    promql_problems,
)

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "dashboards").glob("*/*.json"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"


def _groups(name: str) -> list[dict]:
    return yaml.safe_load((ROOT / "alerts" / name).read_text())["groups"]


def _anchors() -> set[str]:
    return github_anchors(RUNBOOKS.read_text())


def test_alerts_follow_the_mixin_guidelines() -> None:
    groups = _groups("rules/kvoffload-alerts.yaml")
    assert sum(len(g["rules"]) for g in groups) >= 8
    assert lint_alerts(groups, _anchors()) == []


def test_recording_rules_are_named_and_valid() -> None:
    assert lint_recording_rules(_groups("rules/kvoffload-rules.yaml")) == []


def test_every_runbook_section_belongs_to_an_alert() -> None:
    alerts = {
        r["alert"].lower() for g in _groups("rules/kvoffload-alerts.yaml") for r in g["rules"]
    }
    sections = {a for a in _anchors() if a.startswith("kvoffload")}
    assert sections == alerts


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_dashboard_passes_the_linter(path: Path) -> None:
    assert lint_dashboard(json.loads(path.read_text())) == []


def test_there_are_import_and_provisioning_dashboards() -> None:
    names = {f"{p.parent.name}/{p.name}" for p in DASHBOARDS}
    assert names == {
        f"{v}/kvoffload-{d}.json" for v in ("import", "provisioning") for d in ("overview", "fleet")
    }


# -- the lint has teeth ------------------------------------------------------------------------
def _overview() -> dict:
    return json.loads((ROOT / "dashboards/provisioning/kvoffload-overview.json").read_text())


def _first_timeseries(d: dict) -> dict:
    return next(p for p in d["panels"] if p["type"] == "timeseries")


@pytest.mark.parametrize(
    "expr, problem",
    [
        ('sum(vllm:prompt_tokens_total{job=~"$job"})', "not inside rate"),
        ('sum({__name__=~"vllm[:_]prefix_cache_hits_total"})', "not inside rate"),
        ("histogram_quantile(0.9, vllm:time_to_first_token_seconds_bucket)", "not inside rate"),
        ("rate(vllm:prompt_tokens_total[5m])", "not $__rate_interval"),
        ("rate(vllm:prompt_tokens_total[$__rate_interval]", "invalid PromQL"),
    ],
)
def test_promql_lint_catches(expr: str, problem: str) -> None:
    assert any(problem in p for p in promql_problems(expr)), promql_problems(expr)


def test_promql_lint_accepts_rates_and_recording_rules() -> None:
    assert (
        promql_problems(
            'sum by (engine) (rate({__name__=~"vllm[:_]kv_offload_load_bytes_total", '
            'instance=~"$instance"}[$__rate_interval]))'
        )
        == []
    )
    assert promql_problems('model_name:vllm_prompt_tokens:rate5m{job=~"$job"}') == []


@pytest.mark.parametrize(
    "breakage, problem",
    [
        (lambda p: p.pop("description"), "no description"),
        (lambda p: p["fieldConfig"]["defaults"].update(unit="tokens/s"), "invalid unit"),
        (lambda p: p.update(datasource={"type": "prometheus", "uid": "prom-1"}), "$datasource"),
        (lambda p: p["targets"].clear(), "no targets"),
    ],
)
def test_dashboard_lint_catches_panel_faults(breakage, problem: str) -> None:
    d = _overview()
    breakage(_first_timeseries(d))
    assert any(problem in p for p in lint_dashboard(d)), lint_dashboard(d)


def test_dashboard_lint_catches_dashboard_faults() -> None:
    d = _overview()
    d["templating"]["list"].append(copy.deepcopy(d["templating"]["list"][0]) | {"name": "ds2"})
    d["templating"]["list"][1]["allValue"] = ""
    del d["uid"]
    problems = lint_dashboard(d)
    assert any("exactly one datasource" in p for p in problems)
    assert any("allValue" in p for p in problems)
    assert any("no uid" in p for p in problems)


def test_alert_lint_catches_mixin_faults() -> None:
    groups = _groups("rules/kvoffload-alerts.yaml")
    rule = groups[0]["rules"][0]
    rule["alert"] = "kv_offload_bad"
    rule["annotations"]["summary"] = "{{ $labels.instance }} is bad"
    rule["annotations"]["description"] = "Static text."
    rule["annotations"]["runbook_url"] = "docs/runbooks.md#nosuchsection"
    del rule["labels"]["severity"]
    problems = lint_alerts(groups, _anchors())
    for words in (
        "CamelCase",
        "severity",
        "must not be templated",
        "end with '.'",
        "must be templated",
        "#nosuchsection",
    ):
        assert any(words in p for p in problems), (words, problems)


def test_github_anchors() -> None:
    assert github_anchors("## KVOffloadTransferSlow\n### What it means, briefly\n") == {
        "kvoffloadtransferslow",
        "what-it-means-briefly",
    }
