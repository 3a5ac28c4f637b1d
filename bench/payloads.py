"""Realistic vLLM 0.33 /metrics bodies for the benchmarks, built with the simulator."""

from __future__ import annotations

from dataclasses import replace

from kvoffload.sim import SimServer, scenarios


def _scenario(kind: str):
    base = scenarios.get("laptop-eviction")
    if kind == "1-engine":
        return base
    if kind == "8-engines":
        return replace(base, dp=8)
    if kind == "large":
        # 8 engines, --kv-cache-metrics residency histograms, three models in one process.
        extra = tuple(replace(base, served_model_name=f"model-{i}", dp=8) for i in (2, 3))
        return replace(base, dp=8, kv_cache_metrics=True, extra_models=extra)
    raise KeyError(kind)


PAYLOADS = ("1-engine", "8-engines", "large")


def bodies(kind: str, count: int, step_s: float = 15.0, warmup_s: float = 120.0) -> list[bytes]:
    """`count` successive scrapes, `step_s` virtual seconds apart, after a warm-up."""
    sim = SimServer(_scenario(kind))
    out = []
    for i in range(count):
        sim.advance_to(warmup_s + i * step_s)
        out.append(sim.render())
    return out


def epoch(kind: str) -> float:
    return _scenario(kind).start_epoch
