"""The generator: committed files match it, users can regenerate for their labels, and every
figure of the signal catalog has a PromQL rendering or a stated reason why not."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvoffload.analysis.signals import FIGURES
from kvoffload.errors import InputError
from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.generate import check, generate, parse_overrides, render_all
from kvoffload.mixin.renderings import NOT_IN_PROMQL, RENDERINGS, figure_expr, record_name

from rules_procs import PROMTOOL, need

ROOT = Path(__file__).resolve().parents[2]


def test_committed_files_match_the_generator() -> None:
    stale = check(ROOT)
    assert stale == [], f"regenerate with `kvoffload generate --out .`: {stale}"


def test_no_stray_generated_files() -> None:
    expected = set(render_all())
    # The folder test is on the path inside the checkout: a checkout under a `tests` folder
    # (a worktree named so) would otherwise see no file at all.
    on_disk = {
        str(p.relative_to(ROOT))
        for d in ("alerts", "dashboards")
        for p in (ROOT / d).rglob("*")
        if p.is_file() and "tests" not in p.relative_to(ROOT).parts
    }
    assert on_disk == expected


def test_generation_is_deterministic() -> None:
    """Another process with other hash seeds (set and dict orders) writes the same bytes."""
    code = (
        "import json; from kvoffload.mixin.generate import render_all; "
        "print(json.dumps(render_all(), sort_keys=True))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "4242")
    }
    assert outputs == {json.dumps(render_all(), sort_keys=True) + "\n"}


def test_every_catalog_figure_is_rendered_or_explained() -> None:
    keys = {f.key for f in FIGURES}
    rendered = {k for r in RENDERINGS for k in r.keys}
    assert rendered <= keys, f"renderings of unknown figures: {rendered - keys}"
    assert not rendered & set(NOT_IN_PROMQL)
    assert keys == rendered | set(NOT_IN_PROMQL), (
        f"figures without a PromQL rendering or a reason: {keys - rendered - set(NOT_IN_PROMQL)}"
    )


def test_figures_not_in_promql_are_documented() -> None:
    doc = (ROOT / "docs" / "rules.md").read_text()
    for key in NOT_IN_PROMQL:
        assert f"`{key}`" in doc, key


def test_the_rules_table_in_the_docs_is_generated_and_current() -> None:
    from kvoffload.mixin.reference import rules_table, splice

    doc = (ROOT / "docs" / "rules.md").read_text()
    assert doc == splice(doc, rules_table()), "regenerate: make generate"


def test_every_recording_rule_is_documented() -> None:
    doc = (ROOT / "docs" / "rules.md").read_text()
    records = {
        r["record"]
        for g in yaml.safe_load((ROOT / "alerts" / "rules" / "kvoffload-rules.yaml").read_text())[
            "groups"
        ]
        for r in g["rules"]
    }
    missing = [r for r in records if f"`{r}`" not in doc]
    assert not missing, missing


def test_regenerate_for_other_labels_windows_and_thresholds(tmp_path: Path) -> None:
    written = generate(
        tmp_path,
        selector='job="llm", namespace="prod"',
        rate_window="2m",
        slow_window="6h",
        low_reuse_ratio=0.1,
        sidecar_selector='job="kvo"',
        alert_for={**MixinConfig().alert_for, "KVOffloadTransferSlow": "1h"},
    )
    assert {str(p.relative_to(tmp_path)) for p in written} == set(render_all())
    rules = (tmp_path / "alerts" / "rules" / "kvoffload-rules.yaml").read_text()
    alerts = yaml.safe_load((tmp_path / "alerts" / "rules" / "kvoffload-alerts.yaml").read_text())
    assert 'job="vllm"' not in rules and 'job="llm", namespace="prod"' in rules
    assert "[2m]" in rules and "[6h]" in rules and "[5m]" not in rules
    assert ":ratio_rate2m" in rules and ":ratio_rate6h" in rules
    by_name = {r["alert"]: r for r in alerts["groups"][0]["rules"]}
    assert "< 0.1\n" in by_name["KVOffloadLowPrefixReuse"]["expr"]
    assert by_name["KVOffloadTransferSlow"]["for"] == "1h"
    assert 'kvoffload_up{job="kvo"}' in by_name["KVOffloadExporterTargetDown"]["expr"]
    overview = json.loads((tmp_path / "dashboards/import/kvoffload-overview.json").read_text())
    exprs = [t["expr"] for p in overview["panels"] for t in p.get("targets", [])]
    assert any(":ratio_rate2m{" in e for e in exprs)
    need(PROMTOOL)
    for name in ("rules/kvoffload-rules.yaml", "rules/kvoffload-alerts.yaml"):
        result = subprocess.run(
            [PROMTOOL, "check", "rules", str(tmp_path / "alerts" / name)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_rewrites_only_what_changed(tmp_path: Path) -> None:
    generate(tmp_path)
    rules = tmp_path / "alerts" / "rules" / "kvoffload-rules.yaml"
    before = rules.stat().st_mtime_ns
    rules.with_name("kvoffload-alerts.yaml").write_text("edited by hand\n")
    assert check(tmp_path) == ["alerts/rules/kvoffload-alerts.yaml"]
    generate(tmp_path)
    assert check(tmp_path) == [] and rules.stat().st_mtime_ns == before


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"no_such_setting": 1}, "unknown setting"),
        ({"rate_window": "5 minutes"}, "not a Prometheus duration"),
        ({"alert_for": {"KVOffloadTransferSlow": "15m"}}, "no duration for"),
        ({"target_labels": ("job", "pod")}, "must include 'instance'"),
        ({"world_size": 0}, "world_size"),
    ],
)
def test_bad_settings_are_refused(tmp_path: Path, overrides: dict, words: str) -> None:
    with pytest.raises(InputError, match=words):
        generate(tmp_path, **overrides)


def test_world_size_scales_load_tokens_per_second() -> None:
    one = figure_expr("load_tokens_per_second", MixinConfig())
    four = figure_expr("load_tokens_per_second", MixinConfig(world_size=4))
    assert not re.search(r"\*\s*4$", one) and re.search(r"\*\s*4$", four)


def test_dashboards_use_object_datasources_and_fixed_uids() -> None:
    for rel, text in render_all().items():
        if not rel.endswith(".json"):
            continue
        d = json.loads(text)
        assert d["schemaVersion"] >= 39 and d["uid"] in ("kvoffload-overview", "kvoffload-fleet")
        assert "rows" not in d and "style" not in d
        for p in d["panels"]:
            if p["type"] == "row":
                continue
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            for t in p["targets"]:
                assert t["datasource"] == p["datasource"]
                assert set(t) <= {
                    "datasource",
                    "expr",
                    "legendFormat",
                    "refId",
                    "instant",
                    "range",
                    "format",
                    "editorMode",
                }
        if rel.startswith("dashboards/import/"):
            assert d["__inputs"][0]["name"] == "DS_PROMETHEUS"
            ds = next(v for v in d["templating"]["list"] if v["type"] == "datasource")
            assert ds["current"]["value"] == "${DS_PROMETHEUS}"
        else:
            assert "__inputs" not in d


def test_dashboards_read_the_recording_rules() -> None:
    files = render_all()
    overview = json.loads(files["dashboards/provisioning/kvoffload-overview.json"])
    fleet = json.loads(files["dashboards/provisioning/kvoffload-fleet.json"])
    # The overview's stats pool the formula over the selection; the fleet table reads the rule.
    exprs = "\n".join(
        t["expr"] for d in (overview, fleet) for p in d["panels"] for t in p.get("targets", [])
    )
    cfg = MixinConfig()
    for key in (
        "offload_hit_ratio",
        "gpu_prefix_hit_ratio",
        "load_gbps",
        "store_gbps",
        "reuse_ratio",
        "wasted_bytes",
        "speedup",
        "cpu_fill_seconds",
        "store_rate_bytes_per_second",
        "gpu_turnover_seconds",
    ):
        assert record_name(key, cfg) in exprs, key
    names = {v["name"] for v in overview["templating"]["list"]}
    assert names == {"datasource", "job", "instance", "model_name", "engine"}


def test_parse_overrides_types_the_cli_settings() -> None:
    got = parse_overrides(
        [
            "low_reuse_ratio=0.1",
            "world_size=4",
            "target_labels=job,instance,pod",
            "alert_for.KVOffloadTransferSlow=1h",
            "runbook_url_base=https://x/rb.md",
            "prometheusrule_namespace=monitoring",
        ]
    )
    assert got["low_reuse_ratio"] == 0.1 and got["world_size"] == 4
    assert got["target_labels"] == ("job", "instance", "pod")
    assert got["alert_for"]["KVOffloadTransferSlow"] == "1h"
    assert got["alert_for"]["KVOffloadRecommendEnable"] == "30m"  # the others stay
    assert got["runbook_url_base"] == "https://x/rb.md"
    assert got["prometheusrule_namespace"] == "monitoring"
    MixinConfig().with_overrides(**got)  # and they make a valid config


@pytest.mark.parametrize(
    "pair, words",
    [
        ("nonsense", "expected KEY=VALUE"),
        ("no_such=1", "expected KEY=VALUE"),
        ("low_reuse_ratio=lots", "takes a number"),
        ("alert_for=1h", "alert_for.<key>"),
        ("world_size.x=1", "not a mapping"),
    ],
)
def test_parse_overrides_refuses(pair: str, words: str) -> None:
    with pytest.raises(InputError, match=words):
        parse_overrides([pair])


def test_renamed_thresholds_keep_their_old_names() -> None:
    """Two settings took the advisor's names (one name per threshold); the old ones still work."""
    old = parse_overrides(["min_gpu_prefix_hit_ratio=0.03", "min_ttft_cost_seconds=0.01"])
    assert old == {"min_reuse_evidence_ratio": 0.03, "min_ttft_saving_seconds": 0.01}
    cfg = MixinConfig().with_overrides(min_ttft_cost_seconds=0.02)
    assert cfg.min_ttft_saving_seconds == 0.02
