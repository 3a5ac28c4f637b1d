"""The knobs' advice on the simulator with KV events from a file (the what-ifs' second pass):
store_threshold and eviction_policy named with their numbers on the scenarios built for them,
and on none of the existing ones where they would lose hits or TTFT."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvoffload.analysis.analyze import Settings, analyze_groups
from kvoffload.analysis.knobs import ARC_MARGIN
from kvoffload.analysis.result import GroupAnalysis
from kvoffload.analysis.window import Window
from kvoffload.cli.report import render_report
from kvoffload.ingest.catalog import WANTED_FAMILIES, extract, wanted
from kvoffload.ingest.parse import parse_text
from kvoffload.kvevents.replay import load_event_file
from kvoffload.sidecar.metrics import WHATIF_METRICS, SidecarCollector
from kvoffload.sim import SimServer, scenarios

from helpers import write_simulator_events

INSTANCE = "sim:8000"


def analyzed(name: str, tmp: Path) -> GroupAnalysis:
    """A scenario scraped over its whole length, its KV events written to a file and
    analyzed with it, as `kvoffload analyze FILE --events FILE.kvev` does."""
    sc = scenarios.get(name)
    window = Window(None)
    path = tmp / f"{name}.kvev"

    def scrape(sim: SimServer, t: float) -> None:
        body = parse_text(sim.render(), wanted, WANTED_FAMILIES)
        window.update(extract(body, sc.start_epoch + t, INSTANCE))

    write_simulator_events(path, name, scrape)
    events = {INSTANCE: load_event_file(str(path))}
    (group,) = analyze_groups(window, Settings(), events=events)
    return group


@pytest.fixture(scope="module")
def one_off(tmp_path_factory: pytest.TempPathFactory) -> GroupAnalysis:
    return analyzed("one-off-questions", tmp_path_factory.mktemp("one-off"))


@pytest.mark.slow
def test_one_off_questions_get_a_store_threshold_with_its_numbers(one_off: GroupAnalysis) -> None:
    g = one_off
    rec = g.recommendation
    assert rec.action == scenarios.get("one-off-questions").advice == "store_threshold"
    assert rec.kv_connector_extra_config is not None
    n = rec.kv_connector_extra_config["store_threshold"]
    (why,) = [r for r in rec.reasons if r.startswith('set "store_threshold"')]
    rows = g.kv_events["whatif"]["store_threshold"]  # type: ignore[index]
    row = next(r for r in rows if r["size"] == "current" and r["store_threshold"] == n)
    base = next(r for r in rows if r["size"] == "current" and r["store_threshold"] == 1)
    # The numbers quoted are the what-if's own: bytes stored and the hit ratio, with and without.
    assert f"stores {row['stored_bytes'] / 2**30:.2f} GiB instead of " in why
    assert f"{base['stored_bytes'] / 2**30:.2f} GiB" in why
    assert f"hit ratio {base['cpu_hit_ratio']:.3f} → {row['cpu_hit_ratio']:.3f}" in why
    assert row["stored_bytes"] < 0.75 * base["stored_bytes"]
    assert row["cpu_hit_ratio"] >= base["cpu_hit_ratio"]


@pytest.mark.slow
def test_a_scan_heavy_mix_gets_arc_with_its_numbers(tmp_path: Path) -> None:
    g = analyzed("scan-heavy", tmp_path)
    rec = g.recommendation
    assert rec.action == scenarios.get("scan-heavy").advice
    assert rec.kv_connector_extra_config == {"eviction_policy": "arc"}
    (why,) = [r for r in rec.reasons if r.startswith('set "eviction_policy": "arc"')]
    rows = {
        r["policy"]: r["cpu_hit_ratio"]
        for r in g.kv_events["whatif"]["eviction"]  # type: ignore[index]
        if r["size"] == "advised"
    }
    assert rows["arc"] >= rows["lru"] + 0.02
    assert f"ARC's hit ratio {rows['arc']:.3f} beats LRU's {rows['lru']:.3f}" in why


@pytest.mark.slow
@pytest.mark.parametrize("name", ["laptop-eviction", "rag-hot-set-fits", "buffer-too-small"])
def test_no_threshold_where_it_loses_hits(tmp_path: Path, name: str) -> None:
    """There a threshold gives up most hits (vLLM sights a block only up to the first absent
    one, so a long prefix takes many requests to store); ARC is named only where it wins by
    the margin (buffer-too-small at its advised 12 GiB: 0.942 against LRU's 0.922)."""
    g = analyzed(name, tmp_path)
    rec = g.recommendation
    assert rec.action == scenarios.get(name).advice, rec.reasons
    config = rec.kv_connector_extra_config or {}
    assert "store_threshold" not in config, rec.reasons
    at = "advised" if rec.kv_offloading_size_gib is not None else "current"
    rows = g.kv_events["whatif"]  # type: ignore[index]
    threshold = {
        r["store_threshold"]: r["cpu_hit_ratio"] for r in rows["store_threshold"] if r["size"] == at
    }
    assert threshold[2] < threshold[1]  # the threshold would lose hits
    hit = {r["policy"]: r["cpu_hit_ratio"] for r in rows["eviction"] if r["size"] == at}
    assert ("eviction_policy" in config) == (hit["arc"] >= hit["lru"] + ARC_MARGIN)


@dataclass
class _Status:
    """What the sidecar's collector reads of a service, holding one analyzed group (the live
    sidecar's what-ifs need a file of its events: the group comes from one)."""

    group: GroupAnalysis
    targets: list[object] = field(default_factory=list)
    events: dict[str, object] = field(default_factory=dict)

    def groups(self) -> list[GroupAnalysis]:
        return [self.group]


@pytest.mark.slow
def test_the_whatifs_and_the_knob_reach_metrics_json_and_report(one_off: GroupAnalysis) -> None:
    g = one_off
    registry = CollectorRegistry()
    registry.register(SidecarCollector(_Status(g)))  # type: ignore[arg-type]
    body = generate_latest(registry).decode()
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", body, re.M))
    for name in WHATIF_METRICS:
        assert helps[name] == WHATIF_METRICS[name][2]
    n = g.recommendation.kv_connector_extra_config["store_threshold"]  # type: ignore[index]
    key = 'model_name="Qwen/Qwen3-8B",target="sim:8000"'
    assert f"kvoffload_recommended_store_threshold{{{key}}} {float(n)}" in body
    row = next(
        r
        for r in g.kv_events["whatif"]["store_threshold"]  # type: ignore[index]
        if r["size"] == "current" and r["store_threshold"] == n
    )
    stored = [
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("kvoffload_whatif_stored_bytes{")
        and f'store_threshold="{n}"' in line
        and 'tier="current"' in line
    ]
    assert stored == [row["stored_bytes"]], body
    config = g.to_json()["recommendation"]["kv_connector_extra_config"]  # type: ignore[index]
    assert config == g.recommendation.kv_connector_extra_config and config["store_threshold"] == n
    text = render_report([g], "one-off-questions")
    assert f'kv_connector_extra_config: {{"store_threshold": {n}' in text
    assert "what-if store_threshold at the " in text and "N=2: hit " in text
