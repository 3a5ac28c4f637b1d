"""The simulator's scenarios as TTFT cases: each run with and without its tier on the same requests.

What: one `Case` (ttft_sets.Case) per scenario of the simulator's library with a tier worth
judging; its truth is the simulator's own mean TTFT with the tier − without (same seed, same
clients, the whole recording); recordings and the twin's KV events are written by
kvoffload.sim.write_recording into bench/.ttft-data/sim (git-ignored) and rebuilt when missing.
Why: #24 item 8, the simulator follows the verdict's model: the benchmark shows how the estimate
and the prediction fare on the simulator, beside the real sets, rather than a test asserting it.
"""

from __future__ import annotations

import json
from dataclasses import replace

from ttft_sets import CACHE, Case

from kvoffload.sim import scenarios
from kvoffload.sim.write_recording import record_scenario

SIM_CACHE = CACHE / "sim"
# scenario → the tier judged (GiB per engine); scrape interval as real ones would be
SIM_CASES: dict[str, float] = {
    "laptop-eviction": 0.5,
    "rag-hot-set-fits": 16.0,
    "buffer-too-small": 2.0,
    "no-reuse": 16.0,
    "gpu-plenty": 8.0,
    "recompute-wins": 8.0,
    "pressure-without-offloading": 12.0,
    "agent-sessions": 16.0,
    "h200-0.6b-eager-prefill-cpu2": 2.0,
    "h200-0.6b-eager-prefill-cpu4": 4.0,
    "h200-8b-graphs-cpu5": 5.0,
    "h200-8b-graphs-cpu10": 10.0,
    "h200-0.6b-eager-decode-cpu4": 4.0,
}


def _interval(duration_s: float) -> float:
    """Short calibration runs are scraped each second (as the real sets), the library's at 15 s."""
    return 1.0 if duration_s <= 120 else 15.0


def sim_case(name: str, gib: float) -> Case:
    base = scenarios.get(name)
    on, off = replace(base, cpu_gib=gib), replace(base, cpu_gib=None)
    folder = SIM_CACHE / name
    meta = folder / "truth.json"
    paths = {k: folder / f"{k}.om" for k in ("on", "off")}
    twin_events = folder / "off.kvev"
    if not meta.exists():
        folder.mkdir(parents=True, exist_ok=True)
        step = _interval(base.duration_s)
        truth_on: dict = {}
        truth_off: dict = {}
        # Endless: the clients keep coming for the whole window, as in the real recordings
        # (a run that ends early would leave idle scrapes that dilute the load).
        record_scenario(
            on, str(paths["on"]), base.duration_s, step, endless=True, ground_truth=truth_on
        )
        record_scenario(
            off,
            str(paths["off"]),
            base.duration_s,
            step,
            events_path=str(twin_events),
            endless=True,
            ground_truth=truth_off,
        )
        effect = truth_on["mean_ttft_s"] - truth_off["mean_ttft_s"]
        meta.write_text(json.dumps({"effect_ms": effect * 1000}))
    effect_ms = json.loads(meta.read_text())["effect_ms"]
    return Case(
        set="simulator",
        config=name,
        server=f"cpu{gib:g}g",
        twin="nooffload",
        model=base.model.name if hasattr(base.model, "name") else "sim",
        cpu_gib=gib,
        effect_ms=effect_ms,
        sigma_ms=0.0,  # the same requests on the same simulated engine: no sampling noise
        recording=paths["on"],
        events=None,
        twin_recording=paths["off"],
        twin_events=twin_events,
    )


def sim_cases() -> list[Case]:
    return [sim_case(name, gib) for name, gib in SIM_CASES.items()]
