"""The knobs' advice on the simulator with KV events from a file (the what-ifs' second pass):
store_threshold and eviction_policy named with their numbers on the scenarios built for them,
and on none of the existing ones where they would lose hits or TTFT."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload.analysis.analyze import Settings, analyze_groups
from kvoffload.analysis.knobs import ARC_MARGIN
from kvoffload.analysis.result import GroupAnalysis
from kvoffload.analysis.window import Window
from kvoffload.ingest.catalog import WANTED_FAMILIES, extract, wanted
from kvoffload.ingest.parse import parse_text
from kvoffload.kvevents.eventfile import EventFileWriter, RawMessage
from kvoffload.kvevents.replay import load_event_file
from kvoffload.sim import SimServer, scenarios
from kvoffload.sim.kv_events import encode_batch

INSTANCE = "sim:8000"


def analyzed(name: str, tmp: Path) -> GroupAnalysis:
    """A scenario scraped over its whole length, its KV events written to a file and
    analyzed with it, as `kvoffload analyze FILE --events FILE.kvev` does."""
    sc = scenarios.get(name)
    sim = SimServer(sc, kv_events=True)
    window = Window(None)
    path = tmp / f"{name}.kvev"
    seqs: dict[int, int] = {}
    with path.open("wb") as out:
        writer = EventFileWriter(out)
        t = 0.0
        while t <= sc.duration_s:
            sim.advance_to(t)
            for rank, ts, events in sim.drain_kv_events():
                seq = seqs.get(rank, 0)
                seqs[rank] = seq + 1
                writer.write(RawMessage(rank, seq, ts, b"kv", encode_batch(ts, events, rank)))
            body = parse_text(sim.render(), wanted, WANTED_FAMILIES)
            window.update(extract(body, sc.start_epoch + t, INSTANCE))
            t += sc.scrape_interval_s
    events = {INSTANCE: load_event_file(str(path))}
    (group,) = analyze_groups(window, Settings(), events=events)
    return group


@pytest.mark.slow
def test_one_off_questions_get_a_store_threshold_with_its_numbers(tmp_path: Path) -> None:
    g = analyzed("one-off-questions", tmp_path)
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
