"""Write a scenario's /metrics as a recording (OpenMetrics, a timestamp on every sample).

Tests and demos analyze a known scenario offline without waiting for it in real time.
The KV events a subscriber would have received can go to a raw event file beside it."""

from __future__ import annotations

from .config import Scenario
from .simulator import SimServer


def record_scenario(
    scenario: Scenario,
    path: str,
    duration_s: float,
    interval_s: float = 15.0,
    seed: int = 0,
    instance: str = "sim:8000",
    job: str = "vllm",
    events_path: str | None = None,
    endless: bool | None = None,
    ground_truth: dict | None = None,
) -> int:
    """Scrape at t = 0, interval, 2·interval, … ≤ duration_s; returns the number of scrapes.

    `events_path` gets the KV events too; `ground_truth`, a dict, the truth at the last scrape."""
    from kvoffload.recording.openmetrics import (
        RecordingWriter,  # the package's writer, shared with `record`
    )

    if interval_s <= 0:
        raise ValueError("interval_s must be positive")
    sim = SimServer(
        scenario,
        seed=seed,
        kv_events=events_path is not None,
        # Endless past the scenario's length, so a long recording does not record an idle server.
        endless=duration_s > scenario.duration_s if endless is None else endless,
    )
    events = _EventSink(events_path) if events_path is not None else None
    n = 0
    try:
        with open(path, "w", encoding="utf-8") as f:
            writer = RecordingWriter(f, instance=instance, job=job)
            try:
                while True:
                    t = n * interval_s
                    if t > duration_s + 1e-9:
                        break
                    sim.advance_to(t)
                    writer.write_scrape(sim.render(), timestamp=sim.wall_time(t))
                    if events is not None:
                        events.write(sim)
                    n += 1
            finally:
                writer.close()
    finally:
        if events is not None:
            events.close()
    if ground_truth is not None:
        ground_truth.update(sim.ground_truth(include_requests=False))
    return n


class _EventSink:
    """Writes drained batches as the raw messages a subscriber of every DP rank received."""

    # kvevents.eventfile messages: one per batch, per-rank sequences from 0 (again after a
    # restart), virtual receive times, empty topic.

    def __init__(self, path: str) -> None:
        from kvoffload.kvevents.eventfile import open_writer

        self._fh, self._writer = open_writer(path)
        self._seq: dict[int, int] = {}

    def write(self, sim: SimServer) -> None:
        from kvoffload.kvevents.eventfile import RawMessage

        from .kv_events import encode_batch, is_restart_batch

        for rank, ts, events in sim.drain_kv_events():
            seq = 0 if is_restart_batch(events) else self._seq.get(rank, 0)
            self._writer.write(RawMessage(rank, seq, ts, b"", encode_batch(ts, events, rank)))
            self._seq[rank] = seq + 1

    def close(self) -> None:
        self._fh.close()


def record_restarts(
    scenarios: list[Scenario],
    path: str,
    duration_s: float,
    interval_s: float = 15.0,
    gap_s: float = 60.0,
    seed: int = 0,
    instance: str = "sim:8000",
    job: str = "vllm",
) -> int:
    """One recording of one target restarted into each scenario in turn; returns the scrape count.

    It makes a before/after A/B (no tier, then a tier): counters restart after `gap_s` unscraped."""
    from kvoffload.recording.openmetrics import RecordingWriter

    if interval_s <= 0 or not scenarios:
        raise ValueError("interval_s must be positive and scenarios not empty")
    n = 0
    epoch = scenarios[0].start_epoch  # each server starts later on one calendar
    with open(path, "w", encoding="utf-8") as f:
        writer = RecordingWriter(f, instance=instance, job=job)
        try:
            for scenario in scenarios:
                sim = SimServer(
                    scenario, seed=seed, endless=duration_s > scenario.duration_s, epoch=epoch
                )
                k = 0
                while k * interval_s <= duration_s + 1e-9:
                    t = k * interval_s
                    sim.advance_to(t)
                    writer.write_scrape(sim.render(), timestamp=sim.wall_time(t))
                    k += 1
                    n += 1
                epoch += duration_s + gap_s
        finally:
            writer.close()
    return n
