"""The advice, decided once: all evidence in one value, then one function picks.

`Evidence` holds what the advice may lean on, and `decide` picks the action, size and reasons.
Why: stronger evidence is consulted last, so no caller patches the advice (docs/advisor.md).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from kvoffload.analysis import knobs, tiering, verdict
from kvoffload.analysis.advice import (
    ACTIONS,
    Recommendation,
    decided,
    fmt,
    gib_text,
    replace_advice,
    round_size_gib,
)
from kvoffload.analysis.conditions import (
    GPU_MISSES_REUSE,
    GPU_PRESSURE,
    LOW_REUSE,
    OVERSIZED,
    REUSE_EVIDENCE,
    STORES_WITHOUT_LOADS,
    TOO_SMALL,
    Limits,
)
from kvoffload.analysis.signals import GIB
from kvoffload.analysis.verdict import Measured, TtftEvidence
from kvoffload.ingest.hostmemory import HostMemory, footprint_ratio
from kvoffload.thresholds import Thresholds

__all__ = [
    "ACTIONS",
    "GIB",
    "Counters",
    "CurveEvidence",
    "Evidence",
    "Measured",
    "Recommendation",
    "TtftEvidence",
    "advise",
    "decide",
    "memory_budget",
    "read_cgroup_memory_limit",
    "round_size_gib",
]


@dataclass(frozen=True)
class Counters:
    """The counter figures of one group and what they were taken over (sums over engines)."""

    figures: dict[str, float | None]
    offloading: bool
    window_seconds: float
    memory_limit_bytes: float | None = None
    lifetime: bool = False
    prompt_tokens: float = 0.0
    engines: int = 1
    requests: float | None = None
    host: HostMemory | None = None


@dataclass(frozen=True)
class CurveEvidence:
    """The KV-event miss-ratio curve: hit ratio at any size per engine, and what it reaches."""

    right_size_bytes: float | None  # the smallest tier reaching 95% of the achievable
    achievable: float
    hit_at: Callable[[float], float]
    current_bytes: float | None  # the tier now, per engine
    gpu_bytes: float | None  # the GPU KV cache, per engine


@dataclass(frozen=True)
class Evidence:
    """Everything one group's advice may lean on. `warnings` are about the data (anomalies, a
    provisional or sampled curve) and join any advice."""

    counters: Counters
    curve: CurveEvidence | None = None
    ttft: TtftEvidence | None = None
    whatif: knobs.WhatIfRows | None = None
    measured: tuple[Measured, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # reasons the evidence adds whatever is decided


def decide(ev: Evidence, t: Thresholds | None = None) -> Recommendation:
    """The advice from all the evidence, each rule in order of strength.

    Why: each rule confirms or revises the weaker rules' proposal, and the trace keeps every step.
    So the advice is explained end to end.
    """
    t = t or Thresholds()
    c = ev.counters
    rec = _by_counters(c, t)
    if ev.curve is not None and not rec.insufficient_data:
        below = ev.whatif.tiers.get("current") if ev.whatif is not None else None
        rec = _by_curve(
            rec, c, ev.curve, t, below if tiering.has_secondary_tier(c.figures) else None
        )
    if ev.ttft is not None:
        rec = verdict.judge_ttft(rec, c.offloading, ev.ttft, t)
    if ev.whatif is not None and ev.ttft is not None:
        rec = knobs.judge_knobs(rec, c.offloading, ev.whatif, ev.ttft.effect_with)
    for m in ev.measured:
        rec = verdict.judge_ab(rec, c.offloading, m.mean_ttft, m.effect, t, m.basis, m.seen)
    _add_secondary_tier(rec, c.figures, ev.ttft, ev.whatif)
    rec.reasons.extend(ev.notes)
    rec.warnings.extend(ev.warnings)
    return rec


def _add_secondary_tier(
    rec: Recommendation,
    figures: dict[str, float | None],
    ttft_ev: TtftEvidence | None,
    whatif: knobs.WhatIfRows | None,
) -> None:
    """Adds whether the tiers below the CPU pay, as reasons beside the CPU tier's advice.

    Why: a secondary tier is configured apart from --kv-offloading-size, so its verdict leaves the
    action alone.
    """
    if not tiering.has_secondary_tier(figures):
        return
    now = ttft_ev.now if ttft_ev is not None else None
    cost = now.parts.get("compute_seconds_per_token") if now is not None else None
    replayed = whatif.tiers.get("current") if whatif is not None else None
    tier = tiering.secondary_tier_verdict(
        figures, recompute_seconds_per_token=cost, replayed=replayed
    )
    rec.reasons.extend(f"secondary tier: {reason}" for reason in tier.reasons)
    rec.secondary_tier = {
        "pays": tier.pays,
        "tier_seconds_per_token": tier.tier_seconds_per_token,
        "recompute_seconds_per_token": tier.recompute_seconds_per_token,
    }


def advise(c: Counters, t: Thresholds | None = None) -> Recommendation:
    """The advice from the counters alone (decide with no other evidence)."""
    return decide(Evidence(c), t)


EVIDENCE_KEYS = (
    "offload_hit_ratio",
    "gpu_prefix_hit_ratio",
    "speedup",
    "reuse_ratio",
    "cpu_fill_seconds",
    "gpu_turnover_seconds",
    "cpu_capacity_tokens",
    "gpu_capacity_tokens",
    "allocation_failures_per_second",
    "gpu_kv_usage_ratio",
    "preemptions_per_second",
    "waiting_for_capacity",
    "cpu_fill_ratio_since_start",
    "store_rate_bytes_per_second",
)


def _by_counters(c: Counters, t: Thresholds) -> Recommendation:
    """Advice from the counters. `figures` are sums over engines; sizes are per engine, so byte
    figures are divided by `engines`."""
    figures, offloading, requests = c.figures, c.offloading, c.requests
    current = "keep" if offloading else "leave_off"
    too_short = c.window_seconds < t.min_window_seconds and not c.lifetime
    few = requests is not None and requests < t.min_requests
    if too_short or few or c.prompt_tokens < t.min_prompt_tokens:
        seen = f"{requests:.0f} requests, " if requests is not None else ""
        rec = Recommendation(
            current,
            reasons=[
                f"too little data to judge: {seen}{c.prompt_tokens:.0f} prompt tokens over "
                f"{c.window_seconds:.0f} s in the window (need ≥ {t.min_requests:.0f} requests, "
                f"≥ {t.min_prompt_tokens:.0f} tokens and ≥ {t.min_window_seconds:g} s)"
            ],
            insufficient_data=True,
        )
    else:
        per_engine = _per_engine(figures, max(c.engines, 1))
        rec = (
            _advise_on(per_engine, c.window_seconds, t)
            if offloading
            else _advise_off(per_engine, t)
        )
    rec.evidence = {k: figures.get(k) for k in EVIDENCE_KEYS}
    _memory_check(rec, figures, offloading, c.memory_limit_bytes, t, max(c.engines, 1), c.host)
    return decided(rec, "counters", rec.reasons[0] if rec.reasons else "")


_BYTE_TOTALS = ("gpu_capacity_bytes", "cpu_capacity_bytes")


def _per_engine(figures: dict[str, float | None], engines: int) -> dict[str, float | None]:
    out = dict(figures)
    for key in _BYTE_TOTALS:
        value = figures.get(key)
        out[key] = value / engines if value is not None else None
    return out


def _floor_bytes(figures: dict[str, float | None], t: Thresholds) -> float | None:
    gpu = figures.get("gpu_capacity_bytes")
    return gpu * t.gpu_floor_ratio if gpu else None


def _sized(
    need: float | None, figures: dict[str, float | None], t: Thresholds, what: str
) -> tuple[float | None, str]:
    floor = _floor_bytes(figures, t)
    candidates = [x for x in (need * (1 + t.size_headroom_ratio) if need else None, floor) if x]
    if not candidates:
        return None, "no size: KV bytes per token unknown (pass --kv-bytes-per-token)"
    size = round_size_gib(max(candidates))
    return size, (
        f"size {size:g} GiB = max({what} {gib_text(need)} + {t.size_headroom_ratio:.0%}, "
        f"{t.gpu_floor_ratio:g}× the GPU KV cache {gib_text(figures.get('gpu_capacity_bytes'))}), "
        "rounded up"
    )


def _advise_off(figures: dict[str, float | None], t: Thresholds) -> Recommendation:
    usage = figures.get("gpu_kv_usage_ratio") or 0.0
    preempt = figures.get("preemptions_per_second") or 0.0
    waiting = figures.get("waiting_for_capacity") or 0.0
    turnover = figures.get("gpu_turnover_seconds")
    hit = figures.get("gpu_prefix_hit_ratio")
    evidence = (
        f"GPU KV usage {fmt(usage)} (threshold {t.pressure_gpu_kv_usage:g}), preemptions "
        f"{fmt(preempt, '/s', 3)}, waiting for capacity {fmt(waiting)}, GPU turnover "
        f"{fmt(turnover, ' s', 0)} (reuse horizon {t.reuse_horizon_seconds:.0f} s), "
        f"GPU prefix hit ratio {fmt(hit)}"
    )
    # The conditions are conditions.ENABLE's parts: the alert KVOffloadRecommendEnable
    # renders the same definitions over the recording rules.
    if not GPU_PRESSURE.holds(figures, t):
        return Recommendation("leave_off", reasons=[f"no GPU KV pressure: {evidence}"])
    if not REUSE_EVIDENCE.holds(figures, t):
        return Recommendation(
            "leave_off",
            reasons=[
                f"GPU KV pressure but no prefix reuse to win (hit ratio under "
                f"{t.min_reuse_evidence_ratio:g}): {evidence}"
            ],
        )
    if not GPU_MISSES_REUSE.holds(figures, t):
        return Recommendation(
            "leave_off",
            reasons=[
                f"the GPU prefix cache already serves most reuse (hit ratio ≥ "
                f"{t.low_gpu_prefix_hit_ratio:g}): {evidence}"
            ],
        )
    # Counters cannot see reuse distances: start at twice the GPU KV cache (a CPU tier must
    # exceed it to add hits) and let the figures, or KV events, size it from there.
    gpu = figures.get("gpu_capacity_bytes")
    size, why = _sized(2 * gpu if gpu else None, figures, t, "twice the GPU KV cache")
    return Recommendation(
        "enable",
        size,
        [
            f"the GPU prefix cache keeps losing reusable prefixes: {evidence}",
            why + "; a start: watch the offload hit ratio as it grows, or enable KV events for "
            "an exact size",
        ],
    )


def _advise_on(figures: dict[str, float | None], window: float, t: Thresholds) -> Recommendation:
    speed = figures.get("speedup")
    reuse = figures.get("reuse_ratio")
    fill = figures.get("cpu_fill_seconds")
    cpu = figures.get("cpu_capacity_tokens")
    gpu = figures.get("gpu_capacity_tokens")
    failures = figures.get("allocation_failures_per_second") or 0.0
    hit = figures.get("offload_hit_ratio")
    turnover = figures.get("gpu_turnover_seconds")
    filled = figures.get("cpu_fill_ratio_since_start")
    # The conditions the alerts render too (conditions.py); the window is this analysis's.
    limits = Limits(t, window_seconds=window)

    if LOW_REUSE.holds(figures, t) and turnover is not None and turnover > t.reuse_horizon_seconds:
        return Recommendation(
            "disable",
            reasons=[
                f"the GPU KV cache holds the working set: prefixes survive {turnover:.0f} s on the "
                f"GPU (> {t.reuse_horizon_seconds:.0f} s reuse horizon), GPU prefix hit ratio "
                f"{fmt(figures.get('gpu_prefix_hit_ratio'))}, and the CPU tier is not read back "
                f"(reuse ratio {fmt(reuse, '', 3)} < {t.low_reuse_ratio:g})"
            ],
        )
    if TOO_SMALL.holds(figures, t):
        # Reuse lost to capacity cannot be measured from counters: double the tier (at least
        # past the GPU floor) and judge again; KV events give the exact curve.
        current = figures.get("cpu_capacity_bytes")
        size, why = _sized(2 * current if current else None, figures, t, "twice the tier")
        tiered = tiering.has_secondary_tier(figures)
        return Recommendation(
            "grow",
            size,
            [
                f"CPU tier too small to add hits: {fmt(cpu, '', 0)} tokens vs GPU "
                f"{fmt(gpu, '', 0)} tokens (it must exceed the GPU KV cache), allocation failures "
                f"{fmt(failures, '/s', 3)}, offload hit ratio {fmt(hit)}"
                + (" (with the tier below's hits, which pass through it)" if tiered else ""),
                why,
            ],
        )
    if STORES_WITHOUT_LOADS.holds(figures, limits):
        return Recommendation(
            "store_threshold",
            reasons=[
                f"stores without loads: reuse ratio {fmt(reuse, '', 3)} < {t.low_reuse_ratio:g} "
                f"over {window:.0f} s, longer than the fill time {fmt(fill, ' s', 0)}: set "
                '"store_threshold": 2 in kv_connector_extra_config (stores a prefix on its '
                "second computation), or disable offloading"
            ],
        )
    if filled is not None and fill is not None and OVERSIZED.holds(figures, t):
        capacity = figures.get("cpu_capacity_bytes")
        stored = filled * capacity if capacity else None
        # Never full: everything ever stored still fits, so that (plus headroom) is enough.
        size, why = _sized(stored, figures, t, "everything stored since start")
        if size is not None and capacity and size * GIB < capacity:
            return Recommendation(
                "shrink",
                size,
                [
                    f"the CPU tier has never been full ({filled:.0%} of it stored since start) and "
                    f"would take {fill / 3600:.1f} h to fill at the current store rate "
                    f"(> {t.oversized_fill_seconds / 3600:.0f} h): its pinned memory is idle",
                    why,
                ],
            )
    return Recommendation(
        "keep",
        reasons=[
            f"offloading pays: offload hit ratio {fmt(hit)}, speedup {fmt(speed)}x, reuse ratio "
            f"{fmt(reuse)}, CPU tier {fmt(cpu, '', 0)} tokens vs GPU {fmt(gpu, '', 0)}"
        ],
    )


def curve_size_gib(c: Counters, curve: CurveEvidence, t: Thresholds) -> tuple[float, list[str]]:
    """The curve's size per engine (95% of the achievable hit ratio, at least the GPU floor), capped
    by the memory budget. Returns it with the cap's warning where it bit."""
    assert curve.right_size_bytes is not None
    floor = curve.gpu_bytes * t.gpu_floor_ratio if curve.gpu_bytes else 0.0
    size = round_size_gib(max(curve.right_size_bytes, floor))
    warnings: list[str] = []
    tier_now = c.figures.get("cpu_capacity_bytes") if c.offloading else None
    budget = memory_budget(c.memory_limit_bytes, c.host, tier_now)
    if budget is not None:
        ceiling = budget.tier_ceiling(t.memory_headroom_ratio) / max(c.engines, 1)
        if size * GIB > ceiling:
            size = max(0.25, math.floor(ceiling / GIB / 0.25) * 0.25)
            warnings.append(
                f"capped at {size:g} GiB per engine by the memory limit "
                f"{budget.limit_bytes / GIB:.2f} GiB: {budget.words()}, "
                f"{t.memory_headroom_ratio:.0%} headroom"
            )
    return size, warnings


def _by_curve(
    rec: Recommendation,
    c: Counters,
    curve: CurveEvidence,
    t: Thresholds,
    below: knobs.TierRow | None = None,
) -> Recommendation:
    """enable/grow/shrink/keep from the KV-event miss-ratio curve, sizes per engine. Whether the
    tier pays is the TTFT rule's question; `below`: the tier under it, replayed, where one runs."""
    achievable, current_bytes = curve.achievable, curve.current_bytes
    curve_note = (
        f"the KV-event curve decided: achievable offload hit ratio "
        f"{achievable:.3f}, 95% of it from {gib_text(curve.right_size_bytes)} per engine"
    )
    if achievable < t.low_reuse_ratio or curve.right_size_bytes is None:
        if rec.action in ("store_threshold", "disable", "leave_off"):
            rec.reasons.append(
                f"the KV-event curve agrees: achievable offload hit ratio "
                f"{achievable:.3f} < {t.low_reuse_ratio:g}"
            )
            return decided(rec, "curve", "no reuse a CPU tier could serve")
        new = replace_advice(
            rec,
            "disable" if c.offloading else "leave_off",
            [
                f"the KV-event curve shows no reuse a CPU tier could serve: achievable offload "
                f"hit ratio {achievable:.3f} < {t.low_reuse_ratio:g}"
            ],
        )
        return decided(new, "curve", "no reuse a CPU tier could serve")
    size, warnings = curve_size_gib(c, curve, t)
    sized = (
        f"--kv-offloading-size {size:g} (per engine): predicted offload hit ratio "
        f"{curve.hit_at(size * GIB):.3f}"
    )
    if not c.offloading:
        action = "enable"
    elif current_bytes is None:
        action = "keep"
    else:
        at_current = curve.hit_at(current_bytes)
        if at_current < 0.95 * achievable - 0.02 and size * GIB > current_bytes:
            action = "grow"
        elif current_bytes > 1.5 * size * GIB:
            action = "shrink"
        else:
            action = "keep"
        curve_note += f"; the current {gib_text(current_bytes)} gives {at_current:.3f}"
        if below is not None:
            curve_note += (
                f" alone, {below.hit_ratio:.3f} with the tier below ({below.tier_hit_ratio:.3f} "
                "from it: a larger CPU tier would serve those hits from pinned memory instead)"
            )
    new = Recommendation(
        action,
        None if action == "keep" else size,
        [curve_note, sized] if action != "keep" else [curve_note],
        warnings,
        rec.evidence,
    )
    new.trace = rec.trace
    return decided(new, "curve", curve_note)


@dataclass(frozen=True)
class MemoryBudget:
    """What the container's memory limit leaves the pinned tier. Holds the limit, what the rest
    cannot give back, and host bytes per tier byte."""

    limit_bytes: float
    other_bytes: float  # unreclaimable memory besides the tier (anon + shmem less the tier)
    ratio: float  # host bytes per configured tier byte (ingest.hostmemory.footprint_ratio)
    basis: str  # "measured" or "bound"

    def fits(self, tier_bytes: float, headroom: float) -> bool:
        return self.other_bytes + tier_bytes * self.ratio <= self.limit_bytes / (1 + headroom)

    def tier_ceiling(self, headroom: float) -> float:
        """The largest tier (configured bytes, all engines) that fits."""
        return max(self.limit_bytes / (1 + headroom) - self.other_bytes, 0.0) / self.ratio

    def words(self) -> str:
        how = "measured" if self.basis == "measured" else "at most, until the sidecar measures it"
        held = self.other_bytes / GIB
        rest = f" + {held:.2f} GiB the rest of vLLM holds" if self.other_bytes else ""
        return f"a tier takes {self.ratio:.2f}x its size in host memory ({how}){rest}"


def memory_budget(
    limit: float | None, host: HostMemory | None, tier_bytes: float | None
) -> MemoryBudget | None:
    """The budget from `--memory-limit` (else the cgroup's limit), or None without a limit.
    `tier_bytes`: the tier configured now (None when off)."""
    cgroup = host.cgroup if host is not None else None
    if limit is None and cgroup is not None:
        limit = cgroup.limit_bytes
    if not limit:
        return None
    ratio, basis = footprint_ratio(host, tier_bytes)
    other = 0.0
    if cgroup is not None and "anon" in cgroup.stat:
        held = cgroup.stat["anon"] + cgroup.stat.get("shmem", 0.0)
        other = max(held - (tier_bytes or 0.0) * ratio, 0.0)
    return MemoryBudget(limit, other, ratio, basis)


def _memory_check(
    rec: Recommendation,
    figures: dict[str, float | None],
    offloading: bool,
    limit: float | None,
    t: Thresholds,
    engines: int = 1,
    host: HostMemory | None = None,
) -> None:
    """Checks the engines' summed tiers against the limit, since each engine pins its own."""
    tier_now = figures.get("cpu_capacity_bytes") if offloading else None
    budget = memory_budget(limit, host, tier_now)
    if budget is None:
        return
    if rec.kv_offloading_size_gib:
        size: float | None = rec.kv_offloading_size_gib * GIB * engines
    else:
        size = tier_now
    if size and not budget.fits(size, t.memory_headroom_ratio):
        rec.warnings.append(
            f"pinned CPU tier {size / GIB:.2f} GiB ({engines} engine(s)): {budget.words()}; "
            f"with {t.memory_headroom_ratio:.0%} headroom that exceeds the memory limit "
            f"{budget.limit_bytes / GIB:.2f} GiB: risk of OOM (pinned memory cannot swap; "
            "kv_offloading_size is the total across TP ranks, per engine)"
        )


# Kubelet's pod cgroup: `pod<uid>` (cgroupfs driver) or `kubepods-<qos>-pod<uid>.slice` (systemd
# driver, the uid's dashes as underscores).
_POD_CGROUP = re.compile(r"pod[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_]")


def _memory_max(directory: str) -> float | None:
    try:
        with open(os.path.join(directory, "memory.max")) as fh:
            raw = fh.read().strip()
    except OSError:
        return None
    try:
        return None if raw == "max" else float(raw)
    except ValueError:
        return None


def read_cgroup_memory_limit(
    root: str = "/sys/fs/cgroup", self_cgroup: str = "/proc/self/cgroup"
) -> float | None:
    """vLLM's memory limit as the sidecar's cgroups (v2) show it, or None.

    It is the pod cgroup's `memory.max` less the sidecar's own, visible only without a cgroup
    namespace. Otherwise None, and the manifests pass `--memory-limit` (docs/exporter.md).
    """
    try:
        with open(self_cgroup) as fh:
            own = next((line.strip()[3:] for line in fh if line.startswith("0::")), "")
    except OSError:
        return None
    if own.strip("/") == "":
        return None
    own_dir = os.path.join(root, own.lstrip("/"))
    pod_dir = os.path.dirname(own_dir)
    if not _POD_CGROUP.search(os.path.basename(pod_dir)):
        return None
    pod = _memory_max(pod_dir)
    if pod is None:
        return None
    mine = _memory_max(own_dir)
    return pod - mine if mine is not None and mine < pod else pod
