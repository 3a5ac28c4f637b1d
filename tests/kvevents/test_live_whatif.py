"""The live sidecar's what-ifs: TierSims fed each lookup as it arrives give, over the same
lookups, the rows of analyze --events' second pass over the file, count for count; and on the
simulator's one-off-questions scenario the live advice names store_threshold with them."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from kvoffload.analysis.analyze import Settings, analyze_groups
from kvoffload.analysis.window import Window
from kvoffload.ingest.catalog import WANTED_FAMILIES, extract, wanted
from kvoffload.ingest.parse import parse_text
from kvoffload.kvevents.eventfile import RawMessage, read_event_file
from kvoffload.kvevents.state import TargetEvents
from kvoffload.kvevents.whatif import LIVE_CONFIGS, LiveWhatIf, whatif_for_file
from kvoffload.sim import SimServer, scenarios
from kvoffload.sim.kv_events import encode_batch

SETS = Path(__file__).parents[1] / "fixtures" / "vllm-0.26-h200-ttft"
BYTES_PER_BLOCK = 2_359_296.0  # Qwen3-8B, 16 tokens a block (the captures')
INSTANCE = "sim:8000"


@pytest.mark.parametrize("name", ["E/E-cpu4", "B/B-cpu5"])
def test_live_rows_equal_the_file_replay_on_real_captures(tmp_path: Path, name: str) -> None:
    path = tmp_path / "events.kvev"
    path.write_bytes(lzma.decompress((SETS / f"{name}.kvev.xz").read_bytes()))
    capacity = 4.0 * 2**30
    state = TargetEvents()
    live = LiveWhatIf(state, int(capacity // BYTES_PER_BLOCK), since=0.0)
    for msg in read_event_file(str(path)):
        state.ingest_message(msg)
    got = live.rows(BYTES_PER_BLOCK, state.block_size, capacity)
    want = whatif_for_file(str(path), BYTES_PER_BLOCK, state.block_size, {"current": capacity})
    assert got is not None
    assert got.threshold_rows == want.threshold_rows
    assert got.eviction_rows == [r for r in want.eviction_rows if r["size"] == "current"]
    assert len(got.threshold_rows) + len(got.eviction_rows) == len(LIVE_CONFIGS) + 1
    assert got.tier_rows == want.tier_rows and got.tier_rows[0]["tier_hit_ratio"] is not None
    assert "live replay" in got.basis and "since 1970-01-01 00:00:00 UTC" in got.basis


@pytest.mark.slow
def test_the_live_advice_names_store_threshold_on_one_off_questions() -> None:
    """As the sidecar runs: scrape, take the KV events as they come, analyze now and then."""
    sc = scenarios.get("one-off-questions")
    sim = SimServer(sc, kv_events=True)
    window, state = Window(None), TargetEvents()
    seqs: dict[int, int] = {}
    group = None
    t = 0.0
    while t <= sc.duration_s:
        sim.advance_to(t)
        for rank, ts, events in sim.drain_kv_events():
            seqs[rank] = seqs.get(rank, -1) + 1
            state.ingest_message(
                RawMessage(rank, seqs[rank], ts, b"kv", encode_batch(ts, events, rank))
            )
        window.update(
            extract(parse_text(sim.render(), wanted, WANTED_FAMILIES), sc.start_epoch + t, INSTANCE)
        )
        if t % 60 < sc.scrape_interval_s or t + sc.scrape_interval_s > sc.duration_s:
            (group,) = analyze_groups(window, Settings(), events={INSTANCE: state})
        t += sc.scrape_interval_s  # fmt: skip
    assert group is not None
    whatif = group.kv_events["whatif"]  # type: ignore[index]
    assert "live replay" in whatif["basis"]
    rec = group.recommendation
    assert rec.action == "store_threshold" and rec.kv_connector_extra_config is not None
    assert any(r.startswith('set "store_threshold"') for r in rec.reasons)
