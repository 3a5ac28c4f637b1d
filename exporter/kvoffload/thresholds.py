"""The advisor's thresholds: one dataclass that the advisor and the rules' config both read.

Why: a module below `analysis/` and `mixin/` lets both agree on defaults without importing each
other (docs/advisor.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    """Defaults documented in docs/advisor.md; each is a key of the --thresholds YAML file."""

    # Enough data is counted in requests and tokens, not seconds: 400 requests in 15 s at 1 s
    # scrapes can be judged; the window only needs a few scrape intervals.
    min_window_seconds: float = 5.0
    min_requests: float = 100.0
    min_prompt_tokens: float = 20_000.0
    pressure_gpu_kv_usage: float = 0.8
    low_gpu_prefix_hit_ratio: float = 0.5
    min_reuse_evidence_ratio: float = 0.02
    low_reuse_ratio: float = 0.05
    oversized_fill_seconds: float = 86_400.0
    reuse_horizon_seconds: float = 600.0
    memory_headroom_ratio: float = 0.2
    size_headroom_ratio: float = 0.2
    gpu_floor_ratio: float = 1.25
    # Host-link rate assumed for a TTFT estimate before any load was measured (offloading
    # off): below what a PCIe Gen4 x16 link moves in practice, so savings are not oversold.
    assumed_load_bytes_per_second: float = 10e9
    # The TTFT verdict (kvoffload.analysis.ttft): a tier must save at least this much mean TTFT per
    # request, beyond its uncertainty, to be enabled, kept or grown.
    min_ttft_saving_seconds: float = 0.005
    min_ttft_saving_ratio: float = 0.05
    # Bytes stored per second of other requests' stall on an engine bound by launch overhead
    # (the TTFT model's one fitted constant: bench/ttft_accuracy.py fits it leaving each
    # configuration out; 3–8 GB/s score alike on the real sets, docs/advisor.md).
    store_critical_bytes_per_second: float = 4e9
    # A reloaded request alone waits its copy and one idle scheduling pass (vLLM 0.26.0 on an
    # H200, one client: 4.4–5.4 ms beyond the copy).
    idle_reload_step_seconds: float = 0.005
    # One short run's TTFT effect moves this much (SD) from run to run of the same
    # configuration (reference/vllm-0.26-h200-ttft-2/README.md): every effect's range has it.
    ttft_run_to_run_seconds: float = 0.0042
    # Store attempts per second finding no free CPU-tier slot above which the tier is too small.
    min_allocation_failures_per_second: float = 0.0
    # The KV-event curve sizes a tier only from a stream that has covered a steady state:
    # the GPU cache turned over this many times, and the share of first touches over the
    # whole stream at most this far above its share over the recent half (a cold start
    # inflates it; the curve's hit ratios are low by about that gap).
    min_gpu_turnovers: float = 2.0
    max_first_touch_gap_ratio: float = 0.05
