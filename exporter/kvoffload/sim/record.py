"""Write a scenario's /metrics as a recording (OpenMetrics, a timestamp on every sample).

The simulator is scraped on its virtual clock every `interval_s`, like Prometheus would, and
each body goes through kvoffload.recording.RecordingWriter (which adds instance/job labels).
"""

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
) -> int:
    """Scrape at t = 0, interval, 2·interval, … ≤ duration_s; returns the number of scrapes."""
    from kvoffload.recording import RecordingWriter  # the package's writer, shared with `record`

    if interval_s <= 0:
        raise ValueError("interval_s must be positive")
    sim = SimServer(scenario, seed=seed)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        writer = RecordingWriter(f, instance=instance, job=job)
        try:
            while True:
                t = n * interval_s
                if t > duration_s + 1e-9:
                    break
                sim.advance_to(t)
                writer.write_scrape(sim.render(), timestamp=sim.epoch + t)
                n += 1
        finally:
            writer.close()
    return n
