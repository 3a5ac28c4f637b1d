"""The sizing oracle: rerun a scenario at several CPU tier sizes and see what each would give.

This is the ground truth an advisor's `--kv-offloading-size` recommendation is judged against.
Runs are independent and deterministic (same seed → same traffic at every size).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .config import Scenario
from .simulator import SimServer

TARGET_SHARE = 0.95  # "right size" = smallest size reaching 95% of the achievable hit ratio


def run_point(
    scenario: Scenario, cpu_gib: float, seed: int = 0, keep_restart: bool = False
) -> dict[str, Any]:
    """One full run at a CPU tier of `cpu_gib` GiB per engine (0 = offloading off).

    The restart is dropped unless keep_restart. With it both halves count, as a prediction from the
    restarted run's events should be judged."""
    s = replace(
        scenario,
        cpu_gib=cpu_gib if cpu_gib > 0 else None,
        restart_at_s=scenario.restart_at_s if keep_restart else None,
    )
    sim = SimServer(s, seed=seed)
    sim.run()
    gt = sim.ground_truth(include_requests=False)
    return {
        "cpu_gib": cpu_gib,
        "hit_ratio": gt["true_offload_hit_ratio"] or 0.0,
        "mean_ttft_s": gt["mean_ttft_s"],
        "stored_bytes": gt["stored_bytes"],
        "loaded_bytes": gt["loaded_bytes"],
        "never_reloaded_bytes": gt["never_reloaded_bytes"],
    }


def sweep(
    scenario: Scenario, sizes_gib: list[float], seed: int = 0, keep_restart: bool = False
) -> dict[str, Any]:
    """Hit ratio and mean TTFT at each size, and the smallest size worth having.

    The advisor's sizing is checked against it; the restart is dropped unless keep_restart."""
    # right_size_gib stays None when no size gets a hit (offloading only costs);
    # best_ttft_gib may be 0, offloading off.
    points = [run_point(scenario, size, seed, keep_restart) for size in sorted(sizes_gib)]
    best = max((p["hit_ratio"] for p in points), default=0.0)
    right: float | None = None
    if best > 0:
        for p in points:
            if p["hit_ratio"] >= TARGET_SHARE * best:
                right = p["cpu_gib"]
                break
    timed = [p for p in points if p["mean_ttft_s"] is not None]
    best_ttft = min(timed, key=lambda p: p["mean_ttft_s"])["cpu_gib"] if timed else None
    return {
        "scenario": scenario.name,
        "current_gib": scenario.cpu_gib,
        "points": points,
        "achievable_hit_ratio": best,
        "right_size_gib": right,
        "best_ttft_gib": best_ttft,
    }
