"""Blocks a tier below the CPU reports stored (vLLM 0.26.0's fs tier with enable_kv_events:
BlockStored with medium "FS", tiering/fs/manager.py get_finished_jobs) are counted apart: they
are neither GPU-cached nor CPU-resident, and the count survives a saved state."""

from __future__ import annotations

from kvoffload.kvevents import persist
from kvoffload.kvevents.decode import STORED, Batch, Event
from kvoffload.kvevents.state import TargetEvents


def _stream() -> list[Batch]:
    gpu = Event(STORED, (1, 2, 3), "GPU", 16)
    cpu = Event(STORED, (1, 2, 3), "CPU")
    fs = Event(STORED, (1, 2, 3), "FS")
    return [
        Batch(0.0, 0, [gpu]),
        Batch(1.0, 0, [cpu, fs]),
        Batch(2.0, 0, [Event(STORED, (4,), "OBJ")]),
    ]


def test_fs_and_obj_stores_count_as_the_tier_below_and_nowhere_else(tmp_path) -> None:
    events = TargetEvents(1.0, None)
    for seq, batch in enumerate(_stream()):
        events.ingest(batch, seq, 0)
    assert events.tier_stored_blocks() == 4
    assert events.cpu_resident_blocks() == 3  # the FS copies did not add CPU residents
    (engine,) = events.engines.values()
    assert engine.cpu_stored_blocks == 3
    path = persist.state_path(tmp_path, "t:1")
    persist.save(events, "t:1", path)
    loaded = persist.load(path, "t:1", 1.0, None)
    assert loaded is not None and loaded.events.tier_stored_blocks() == 4


def test_the_simulated_fs_tier_reports_every_chunk_it_is_written() -> None:
    """Scenario `tiered`: every completed CPU store cascades to the fs tier, and its KV events
    (medium FS) count the same chunks as the CPU tier's own stores."""
    from kv_helpers import run_with_events

    _window, events, _truth = run_with_events("tiered")
    (engine,) = events.engines.values()
    assert engine.tier_stored_blocks == engine.cpu_stored_blocks > 0
    assert events.cpu_resident_blocks() <= engine.cpu_stored_blocks
