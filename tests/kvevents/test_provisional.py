"""The curve sizes a tier only from a stream that has covered a steady state: too short (the
GPU cache has not turned over), still warming up (first touches dominate the whole stream
but not its recent half) or partial (unseen, lost) — the advice says "provisional", the JSON
and /metrics flag it."""

import lzma
from pathlib import Path

from kvoffload.analysis.evidence import provisional_reasons
from kvoffload.kvevents.decode import STORED, Batch, Event
from kvoffload.kvevents.eventfile import read_event_file
from kvoffload.kvevents.state import TargetEvents
from kvoffload.thresholds import Thresholds

SETS = Path(__file__).parents[1] / "fixtures" / "vllm-0.26-h200-ttft"
T = Thresholds()


def _reasons(state: TargetEvents, gpu_blocks: float | None) -> list[str]:
    return provisional_reasons(state, gpu_blocks, T.min_gpu_turnovers, T.max_first_touch_gap_ratio)


def _passes(state: TargetEvents, passes: int, prefixes: int = 50, blocks: int = 4) -> None:
    """A fixed working set — `prefixes` prompts of `blocks` blocks — sent over and over,
    each prompt missing the GPU every time (its cache is smaller than the set)."""
    for _ in range(passes):
        for p in range(prefixes):
            hashes = tuple(1000 * p + b + 1 for b in range(blocks))
            state.ingest(Batch(0.0, 0, [Event(STORED, hashes, "GPU", 16)]))


def test_too_short_then_warming_up_then_steady():
    state = TargetEvents()
    _passes(state, 1)  # 200 first touches: the GPU cache (100 blocks) turned over twice
    assert state.first_touch_ratios() == (1.0, 1.0)
    (too_short,) = _reasons(state, 300.0)
    assert "fewer than 2 turnovers of the GPU cache" in too_short
    _passes(state, 2)
    (warming,) = _reasons(state, 100.0)
    assert "still warming up" in warming and "33% of GPU-missed blocks" in warming
    _passes(state, 40)  # the set's 200 first touches are 2% of 8,600 accesses
    whole, recent = state.first_touch_ratios()
    assert recent == 0.0 and whole < T.max_first_touch_gap_ratio
    assert _reasons(state, 100.0) == []


def test_a_stream_of_new_prompts_only_is_steady_not_warming():
    # No reuse at all: first touches are the steady state, the curve says so at once.
    state = TargetEvents()
    for p in range(2000):
        state.ingest(Batch(0.0, 0, [Event(STORED, (10 * p + 1, 10 * p + 2), "GPU", 16)]))
    assert state.first_touch_ratios() == (1.0, 1.0)
    assert _reasons(state, 100.0) == []


def test_the_real_captures_were_still_warming_up(tmp_path):
    """The H200 runs lasted 1–3 minutes of a document library being read for the first time:
    first touches of prompt blocks fell from 29% of the whole stream to 14% of its recent half
    (E-cpu4; decode blocks are no lookups)."""
    path = tmp_path / "E-cpu4.kvev"
    path.write_bytes(lzma.decompress((SETS / "E" / "E-cpu4.kvev.xz").read_bytes()))
    state = TargetEvents()
    for msg in read_event_file(str(path)):
        state.ingest_message(msg)
    whole, recent = state.first_touch_ratios()
    assert 0.25 < whole < 0.35 and 0.10 < recent < 0.20
    (reason,) = _reasons(state, 877.0)  # the 0.6B server's 877 GPU blocks
    assert "still warming up" in reason


def test_a_saved_state_keeps_its_checkpoints(tmp_path):
    from kvoffload.kvevents import persist

    state = TargetEvents()
    _passes(state, 3)
    path = tmp_path / "s.state"
    persist.save(state, "x:1", path)
    loaded = persist.load(path, "x:1", 1.0, None)
    assert loaded is not None
    assert loaded.events.first_touch_ratios() == state.first_touch_ratios()
    _passes(state, 40)
    _passes(loaded.events, 40)
    assert loaded.events.first_touch_ratios() == state.first_touch_ratios()
