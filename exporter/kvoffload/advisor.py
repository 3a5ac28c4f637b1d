"""Recommendations: enable, leave_off, keep, grow, shrink, store_threshold or disable.

Each decision comes with the figures and thresholds that made it (`reasons`), and a size
(`kv_offloading_size_gib`, what to pass to `--kv-offloading-size`) where one applies. When the
data is too thin the action stays the current state and a reason says why (DESIGN.md §6).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from kvoffload.signals import GIB

ACTIONS = ("enable", "leave_off", "keep", "grow", "shrink", "store_threshold", "disable")


@dataclass(frozen=True)
class Thresholds:
    """Defaults documented in docs/advisor.md; every one is a CLI flag / YAML key."""

    min_window_seconds: float = 60.0
    min_prompt_tokens: float = 20_000.0
    pressure_gpu_kv_usage: float = 0.8
    low_gpu_prefix_hit_ratio: float = 0.5
    min_reuse_evidence_ratio: float = 0.02
    min_speedup: float = 1.2
    low_reuse_ratio: float = 0.05
    oversized_fill_seconds: float = 86_400.0
    reuse_horizon_seconds: float = 600.0
    memory_headroom_ratio: float = 0.2


@dataclass
class Recommendation:
    action: str
    kv_offloading_size_gib: float | None = None
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def round_size_gib(size_bytes: float) -> float:
    """Round up to a step an operator would type: 0.25 GiB below 4, 1 below 32, else 4."""
    gib = size_bytes / GIB
    step = 0.25 if gib < 4 else 1.0 if gib < 32 else 4.0
    return max(step, math.ceil(gib / step - 1e-9) * step)


def _fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}{unit}"


def advise(
    figures: dict[str, float | None],
    offloading: bool,
    window_seconds: float,
    memory_limit_bytes: float | None = None,
    t: Thresholds | None = None,
    lifetime: bool = False,
    prompt_tokens: float = 0.0,
) -> Recommendation:
    t = t or Thresholds()
    current = "keep" if offloading else "leave_off"
    too_short = window_seconds < t.min_window_seconds and not lifetime
    if too_short or prompt_tokens < t.min_prompt_tokens:
        return Recommendation(
            current,
            reasons=[
                f"too little data to judge: {window_seconds:.0f} s and {prompt_tokens:.0f} "
                f"prompt tokens in the window (need ≥ {t.min_window_seconds:.0f} s and "
                f"≥ {t.min_prompt_tokens:.0f} tokens)"
            ],
        )
    rec = _advise_on(figures, t) if offloading else _advise_off(figures, t)
    _memory_check(rec, figures, offloading, memory_limit_bytes, t)
    return rec


def _gpu_floor_bytes(figures: dict[str, float | None]) -> float | None:
    return figures.get("gpu_capacity_bytes")


def _size_for_horizon(figures: dict[str, float | None], t: Thresholds) -> float | None:
    """Bytes needed to keep what is stored for one reuse horizon, never below 2× GPU KV."""
    rate = figures.get("store_rate_bytes_per_second")
    if rate is None:
        # Offloading off: every newly computed full prompt block would be stored.
        per_token = figures.get("kv_bytes_per_token")
        tokens = figures.get("prompt_tokens_per_second")
        share = figures.get("prompt_share_local_compute")
        if per_token and tokens and share is not None:
            rate = per_token * tokens * share
    gpu = _gpu_floor_bytes(figures)
    candidates = [x for x in (rate * t.reuse_horizon_seconds if rate else None,
                              2 * gpu if gpu else None) if x]
    return max(candidates) if candidates else None


def _advise_off(figures: dict[str, float | None], t: Thresholds) -> Recommendation:
    usage = figures.get("gpu_kv_usage_ratio") or 0.0
    preempt = figures.get("preemptions_per_second") or 0.0
    waiting = figures.get("waiting_for_capacity") or 0.0
    hit = figures.get("gpu_prefix_hit_ratio")
    pressure = usage >= t.pressure_gpu_kv_usage or preempt > 0 or waiting > 0
    evidence = (
        f"GPU KV usage {_fmt(usage)} (threshold {t.pressure_gpu_kv_usage}), "
        f"preemptions {_fmt(preempt, '/s', 3)}, waiting for capacity {_fmt(waiting)}, "
        f"GPU prefix hit ratio {_fmt(hit)}"
    )
    if not pressure:
        return Recommendation("leave_off", reasons=[f"no GPU KV pressure: {evidence}"])
    if hit is None or hit < t.min_reuse_evidence_ratio:
        return Recommendation(
            "leave_off", reasons=[f"GPU KV pressure but no prefix reuse to win: {evidence}"]
        )
    if hit >= t.low_gpu_prefix_hit_ratio:
        return Recommendation(
            "leave_off",
            reasons=[f"the GPU prefix cache already serves most reuse: {evidence}"],
        )
    size = _size_for_horizon(figures, t)
    reasons = [f"GPU KV pressure with prefixes being lost: {evidence}"]
    if size is None:
        reasons.append("no start size: KV bytes per token unknown (pass --kv-bytes-per-token)")
        return Recommendation("enable", reasons=reasons)
    reasons.append(
        f"start size: store rate × {t.reuse_horizon_seconds:.0f} s reuse horizon, "
        "at least 2× the GPU KV cache"
    )
    return Recommendation("enable", round_size_gib(size), reasons)


def _advise_on(figures: dict[str, float | None], t: Thresholds) -> Recommendation:
    speed = figures.get("speedup")
    reuse = figures.get("reuse_ratio")
    fill = figures.get("cpu_fill_seconds")
    cpu = figures.get("cpu_capacity_tokens")
    gpu = figures.get("gpu_capacity_tokens")
    failures = figures.get("allocation_failures_per_second") or 0.0
    hit = figures.get("offload_hit_ratio")
    window = figures.get("_window_seconds") or 0.0

    if speed is not None and speed < t.min_speedup:
        return Recommendation(
            "disable",
            reasons=[f"reloads are barely faster than recompute: speedup {_fmt(speed)}x "
                     f"< {t.min_speedup}x"],
        )
    if reuse is not None and reuse < t.low_reuse_ratio and (fill is None or window >= fill):
        return Recommendation(
            "store_threshold",
            reasons=[
                f"stores without loads: reuse ratio {_fmt(reuse, '', 3)} < {t.low_reuse_ratio} "
                f"over {window:.0f} s (fill time {_fmt(fill, ' s', 0)}); set "
                "store_threshold: 2 in kv_connector_extra_config, or disable offloading"
            ],
        )
    if (cpu is not None and gpu is not None and cpu <= gpu) or failures > 0:
        size = _size_for_horizon(figures, t)
        reasons = [
            f"CPU tier too small: {_fmt(cpu, ' tokens', 0)} vs GPU {_fmt(gpu, ' tokens', 0)}, "
            f"allocation failures {_fmt(failures, '/s', 3)}, offload hit ratio {_fmt(hit)}"
        ]
        return Recommendation("grow", round_size_gib(size) if size else None, reasons)
    if fill is not None and fill > t.oversized_fill_seconds:
        size = _size_for_horizon(figures, t)
        return Recommendation(
            "shrink",
            round_size_gib(size) if size else None,
            [f"the CPU tier would take {fill / 3600:.1f} h to fill at the current store rate "
             f"(> {t.oversized_fill_seconds / 3600:.0f} h): pinned memory is idle"],
        )
    return Recommendation(
        "keep",
        reasons=[f"offloading pays: offload hit ratio {_fmt(hit)}, speedup {_fmt(speed)}x, "
                 f"reuse ratio {_fmt(reuse)}"],
    )


def _memory_check(
    rec: Recommendation,
    figures: dict[str, float | None],
    offloading: bool,
    limit: float | None,
    t: Thresholds,
) -> None:
    if limit is None:
        return
    size = rec.kv_offloading_size_gib * GIB if rec.kv_offloading_size_gib else (
        figures.get("cpu_capacity_bytes") if offloading else None
    )
    if size and size * (1 + t.memory_headroom_ratio) > limit:
        rec.warnings.append(
            f"pinned CPU tier {size / GIB:.2f} GiB + {t.memory_headroom_ratio:.0%} headroom "
            f"exceeds the memory limit {limit / GIB:.2f} GiB: risk of OOM (pinned memory "
            "cannot swap)"
        )


def read_cgroup_memory_limit(path: str = "/sys/fs/cgroup/memory.max") -> float | None:
    """The container's memory limit (cgroup v2), or None when unlimited or unreadable."""
    try:
        with open(path) as fh:
            raw = fh.read().strip()
    except OSError:
        return None
    if raw == "max":
        return None
    try:
        return float(raw)
    except ValueError:
        return None
