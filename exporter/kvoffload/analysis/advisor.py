"""Recommendations: enable, leave_off, keep, grow, shrink, store_threshold or disable.

Each decision comes with the figures and thresholds that made it (`reasons`), and a size
(`kv_offloading_size_gib`, what to pass to `--kv-offloading-size`) where one applies. When the
data is too thin the action stays the current state and a reason says why (docs/advisor.md).

Counters cannot show reuse distances; the decisions lean on what they do show:
- GPU turnover (GPU KV capacity ÷ rate of tokens written into it) says how long an idle prefix
  survives on the GPU: reuse slower than that is lost without a CPU tier, and a CPU tier is
  pointless when the GPU keeps blocks longer than the reuse horizon;
- stores vs loads (reuse ratio) over windows longer than the CPU tier's fill time;
- the tier's size against the GPU's (the CPU tier must exceed it to add hits) and
  bytes stored since start (under the tier's size, it has never been full).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

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
from kvoffload.analysis.ttft import Effect
from kvoffload.ingest.hostmemory import HostMemory, footprint_ratio
from kvoffload.thresholds import Thresholds

ACTIONS = ("enable", "leave_off", "keep", "grow", "shrink", "store_threshold", "disable")


@dataclass
class Recommendation:
    action: str
    kv_offloading_size_gib: float | None = None
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    evidence: dict[str, float | None] = field(default_factory=dict)
    # Predicted mean TTFT change per request if applied, relative to now (negative = faster);
    # None for keep / leave_off. Basis: measured | predicted | fleet.
    ttft_change_seconds: float | None = None
    ttft_change_basis: str | None = None
    ttft_change_range_seconds: list[float] | None = None
    # Set when the advice could not be judged (too little data): the verdict leaves it alone.
    insufficient_data: bool = False
    # Which rule decided (counters < curve < estimate < fleet / before_after, each able to
    # overrule the ones before it) and the steps that led there, with their evidence.
    decided_by: str = "counters"
    trace: list[dict[str, object]] = field(default_factory=list)
    # Set by the sidecar's stability rules (analysis.stability): the data time since which this
    # action and size stand, and a newer advice still waiting out its dwell time.
    since: float | None = None
    pending: dict[str, object] | None = None
    # The TTFT range straddles zero: this advice is what the other costs say, not a measured
    # effect, so it does not overturn a published one (the stability rules' hysteresis).
    within_noise: bool = False

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


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / GIB:.2f} GiB"


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


def advise(
    figures: dict[str, float | None],
    offloading: bool,
    window_seconds: float,
    memory_limit_bytes: float | None = None,
    t: Thresholds | None = None,
    lifetime: bool = False,
    prompt_tokens: float = 0.0,
    engines: int = 1,
    requests: float | None = None,
    host: HostMemory | None = None,
) -> Recommendation:
    """`figures` are sums over the group's engines; sizes are per engine (each DP engine
    gets its own --kv-offloading-size), so byte figures are divided by `engines` for them.
    `host`: the container's memory as read (ingest.hostmemory), for the OOM check."""
    t = t or Thresholds()
    current = "keep" if offloading else "leave_off"
    too_short = window_seconds < t.min_window_seconds and not lifetime
    few = requests is not None and requests < t.min_requests
    if too_short or few or prompt_tokens < t.min_prompt_tokens:
        seen = f"{requests:.0f} requests, " if requests is not None else ""
        rec = Recommendation(
            current,
            reasons=[
                f"too little data to judge: {seen}{prompt_tokens:.0f} prompt tokens over "
                f"{window_seconds:.0f} s in the window (need ≥ {t.min_requests:.0f} requests, "
                f"≥ {t.min_prompt_tokens:.0f} tokens and ≥ {t.min_window_seconds:g} s)"
            ],
            insufficient_data=True,
        )
    else:
        per_engine = _per_engine(figures, max(engines, 1))
        rec = (
            _advise_on(per_engine, window_seconds, t) if offloading else _advise_off(per_engine, t)
        )
    rec.evidence = {k: figures.get(k) for k in EVIDENCE_KEYS}
    _memory_check(rec, figures, offloading, memory_limit_bytes, t, max(engines, 1), host)
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
        f"size {size:g} GiB = max({what} {_gib(need)} + {t.size_headroom_ratio:.0%}, "
        f"{t.gpu_floor_ratio:g}× the GPU KV cache {_gib(figures.get('gpu_capacity_bytes'))}), "
        "rounded up"
    )


def _advise_off(figures: dict[str, float | None], t: Thresholds) -> Recommendation:
    usage = figures.get("gpu_kv_usage_ratio") or 0.0
    preempt = figures.get("preemptions_per_second") or 0.0
    waiting = figures.get("waiting_for_capacity") or 0.0
    turnover = figures.get("gpu_turnover_seconds")
    hit = figures.get("gpu_prefix_hit_ratio")
    evidence = (
        f"GPU KV usage {_fmt(usage)} (threshold {t.pressure_gpu_kv_usage:g}), preemptions "
        f"{_fmt(preempt, '/s', 3)}, waiting for capacity {_fmt(waiting)}, GPU turnover "
        f"{_fmt(turnover, ' s', 0)} (reuse horizon {t.reuse_horizon_seconds:.0f} s), "
        f"GPU prefix hit ratio {_fmt(hit)}"
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
                f"{_fmt(figures.get('gpu_prefix_hit_ratio'))}, and the CPU tier is not read back "
                f"(reuse ratio {_fmt(reuse, '', 3)} < {t.low_reuse_ratio:g})"
            ],
        )
    if TOO_SMALL.holds(figures, t):
        # Reuse lost to capacity cannot be measured from counters: double the tier (at least
        # past the GPU floor) and judge again; KV events give the exact curve.
        current = figures.get("cpu_capacity_bytes")
        size, why = _sized(2 * current if current else None, figures, t, "twice the tier")
        return Recommendation(
            "grow",
            size,
            [
                f"CPU tier too small to add hits: {_fmt(cpu, '', 0)} tokens vs GPU "
                f"{_fmt(gpu, '', 0)} tokens (it must exceed the GPU KV cache), allocation failures "
                f"{_fmt(failures, '/s', 3)}, offload hit ratio {_fmt(hit)}",
                why,
            ],
        )
    if STORES_WITHOUT_LOADS.holds(figures, limits):
        return Recommendation(
            "store_threshold",
            reasons=[
                f"stores without loads: reuse ratio {_fmt(reuse, '', 3)} < {t.low_reuse_ratio:g} "
                f"over {window:.0f} s, longer than the fill time {_fmt(fill, ' s', 0)}: set "
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
            f"offloading pays: offload hit ratio {_fmt(hit)}, speedup {_fmt(speed)}x, reuse ratio "
            f"{_fmt(reuse)}, CPU tier {_fmt(cpu, '', 0)} tokens vs GPU {_fmt(gpu, '', 0)}"
        ],
    )


def refine_with_curve(
    rec: Recommendation,
    figures: dict[str, float | None],
    offloading: bool,
    right_size_bytes: float | None,
    achievable: float,
    predicted_at: Callable[[float], float],
    current_bytes: float | None,
    gpu_bytes: float | None,
    memory_limit_bytes: float | None,
    t: Thresholds,
    engines: int = 1,
    host: HostMemory | None = None,
) -> Recommendation:
    """Re-decide enable/grow/shrink/keep from the exact miss-ratio curve (KV events); whether
    the tier pays at that size is judge_ttft's question.

    Sizes are per engine (each DP engine has its own tier): the smallest tier reaching 95% of
    the achievable hit ratio, never below the GPU floor, capped by the memory limit. Decisions
    the curve cannot judge (thin data, reloads slower than recompute) stand."""
    if rec.insufficient_data:
        return rec
    floor = gpu_bytes * t.gpu_floor_ratio if gpu_bytes else 0.0
    curve_note = (
        f"the KV-event curve decided: achievable offload hit ratio "
        f"{achievable:.3f}, 95% of it from {_gib(right_size_bytes)} per engine"
    )
    if achievable < t.low_reuse_ratio or right_size_bytes is None:
        if rec.action in ("store_threshold", "disable", "leave_off"):
            rec.reasons.append(
                f"the KV-event curve agrees: achievable offload hit ratio "
                f"{achievable:.3f} < {t.low_reuse_ratio:g}"
            )
            return decided(rec, "curve", "no reuse a CPU tier could serve")
        action = "disable" if offloading else "leave_off"
        new = Recommendation(
            action,
            reasons=[
                f"the KV-event curve shows no reuse a CPU tier could serve: achievable offload hit "
                f"ratio {achievable:.3f} < {t.low_reuse_ratio:g}"
            ],
        )
        new.evidence, new.trace = rec.evidence, rec.trace
        return decided(new, "curve", "no reuse a CPU tier could serve")
    size_bytes = max(right_size_bytes, floor)
    size = round_size_gib(size_bytes)
    warnings: list[str] = []
    tier_now = figures.get("cpu_capacity_bytes") if offloading else None
    budget = memory_budget(memory_limit_bytes, host, tier_now)
    if budget is not None:
        ceiling = budget.tier_ceiling(t.memory_headroom_ratio) / max(engines, 1)
        if size * GIB > ceiling:
            size = max(0.25, math.floor(ceiling / GIB / 0.25) * 0.25)
            warnings.append(
                f"capped at {size:g} GiB per engine by the memory limit "
                f"{budget.limit_bytes / GIB:.2f} GiB: {budget.words()}, "
                f"{t.memory_headroom_ratio:.0%} headroom"
            )
    predicted = predicted_at(size * GIB)
    sized = (
        f"--kv-offloading-size {size:g} (per engine): predicted offload hit ratio {predicted:.3f}"
    )
    if not offloading:
        action = "enable"
    elif current_bytes is None:
        action = "keep"
    else:
        at_current = predicted_at(current_bytes)
        if at_current < 0.95 * achievable - 0.02 and size * GIB > current_bytes:
            action = "grow"
        elif current_bytes > 1.5 * size * GIB:
            action = "shrink"
        else:
            action = "keep"
        curve_note += f"; the current {_gib(current_bytes)} gives {at_current:.3f}"
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
    """What the container's memory limit leaves the pinned tier: the limit, what the rest of
    the container cannot give back, and the host bytes a tier byte takes."""

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
    """The budget from `--memory-limit` (else the limit the cgroup shows) and the reading;
    None without a limit. `tier_bytes`: the tier configured now (None when off)."""
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
    """Every engine of the container pins its own tier: the total is what the limit sees."""
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

    The sidecar's own limit is not vLLM's (256 MiB in the example pod), so it is never the
    answer. Where the pod's cgroup is visible (the parent of the sidecar's own, with no cgroup
    namespace), its `memory.max` is the sum of its containers' limits: less the sidecar's own
    it is the vLLM container's, exactly in a pod of the two. In a cgroup namespace (the default
    for containers on cgroup v2) the sidecar sees only its own cgroup: None, and the manifests
    give `--memory-limit` (KVOFFLOAD_MEMORY_LIMIT from the Downward API) instead."""
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


def _ms(seconds: float) -> str:
    return f"{abs(seconds) * 1000:.0f} ms"


def _effect_words(effect: Effect) -> str:
    parts = effect.parts
    wait = _ms(parts["reload_wait_seconds"])
    recompute = (
        f"recomputing the {parts['reloaded_tokens_per_request']:.0f} reloaded tokens per request "
        f"would cost ~{_ms(parts['recompute_saved_seconds'])}"
        if parts.get("compute_seconds_per_token")
        else f"recomputing the {parts['reloaded_tokens_per_request']:.0f} reloaded tokens per "
        "request costs nothing this server can measure"
    )
    return (
        f"a reloaded request waits for the asynchronous load (~{wait} per request), the offload "
        f"path's stores stall others by ~{_ms(parts['store_seconds'])}, and {recompute}"
    )


def _range(effect: Effect, sign: float = 1.0) -> list[float]:
    low, high = sorted((sign * effect.low, sign * effect.high))
    return [low, high]


def decided(rec: Recommendation, stage: str, why: str) -> Recommendation:
    """Note in the trace that `stage` decided (or confirmed) the advice, and why."""
    rec.decided_by = stage
    rec.trace.append(
        {
            "stage": stage,
            "action": rec.action,
            "kv_offloading_size_gib": rec.kv_offloading_size_gib,
            "why": why,
        }
    )
    return rec


def _replace(rec: Recommendation, action: str, reasons: list[str], **kw: object) -> Recommendation:
    """A new advice that keeps the earlier one's warnings, evidence and trace."""
    new = Recommendation(action, reasons=reasons, warnings=rec.warnings, evidence=rec.evidence)
    new.trace = rec.trace
    for key, value in kw.items():
        setattr(new, key, value)
    return new


# What would settle an effect one server cannot tell from noise.
_SETTLE = (
    "one short run cannot tell an effect this small from run-to-run noise: a longer window "
    "narrows the range; a canary replica {other} (or a restart {other}, compared before and "
    "after) measures it"
)


def judge_ttft(
    rec: Recommendation,
    offloading: bool,
    mean_ttft: float | None,
    now: Effect | None,
    effect_at: Callable[[float], Effect | None] | None,
    t: Thresholds,
    hit_ratio_now: float | None = None,
    best_case_only: bool = False,
    current_bytes: float | None = None,
) -> Recommendation:
    """Re-decide by the TTFT the tier saves or costs (analysis.ttft), not by its hit ratio.

    now: the tier's effect on this server (offloading on). effect_at(size in bytes): the
    effect of a tier of that size against none, predicted. A change (enable, grow, disable
    for TTFT) is advised only when the effect's range clears the threshold, max(
    min_ttft_saving_seconds, min_ttft_saving_ratio × mean TTFT); an effect within its noise
    is said so, and the other costs decide. best_case_only: effect_at is the bound where every
    GPU-missed token reloads (no KV events): it can rule a tier out, not size its gain."""
    if rec.insufficient_data or mean_ttft is None:
        return rec
    floor = max(t.min_ttft_saving_seconds, t.min_ttft_saving_ratio * mean_ttft)

    def saves(effect: Effect) -> bool:
        return effect.high < 0 and -effect.seconds >= floor

    def costs(effect: Effect) -> bool:
        return effect.low > 0

    def note(effect: Effect) -> str:
        return (
            f"mean TTFT {_ms(effect.seconds)} {'worse' if effect.seconds > 0 else 'better'}"
            f" than recomputing (range {effect.low * 1000:+.0f} … "
            f"{effect.high * 1000:+.0f} ms; a change needs ≥ {_ms(floor)} saved beyond it)"
        )

    if not offloading:
        return _judge_off(rec, effect_at, best_case_only, saves, note)
    if now is None:
        return rec
    size = rec.kv_offloading_size_gib
    at_size = effect_at(size * GIB) if size is not None and effect_at is not None else None
    # Both sizes through the same model, so that its bias cancels in the difference.
    base = effect_at(current_bytes) if current_bytes and effect_at is not None else None

    def change_to(target: Effect) -> Effect:
        ref = base or now
        return Effect(
            target.seconds - ref.seconds, target.low - ref.low, target.high - ref.high, target.parts
        )

    def predicted(change: Effect) -> None:
        if not best_case_only:
            rec.ttft_change_seconds = change.seconds
            rec.ttft_change_basis = "predicted"
            rec.ttft_change_range_seconds = [change.low, change.high]

    hit = (
        f"{hit_ratio_now:.0%} of GPU-missed tokens reload from CPU, but "
        if hit_ratio_now is not None
        else ""
    )
    grow_pays = rec.action == "grow" and at_size is not None and saves(at_size)
    if costs(now) and not grow_pays:
        return decided(
            _replace(
                rec,
                "disable",
                [f"the CPU tier costs TTFT: {hit}{_effect_words(now)}: {note(now)}"],
                ttft_change_seconds=-now.seconds,
                ttft_change_basis="measured",
                ttft_change_range_seconds=_range(now, -1.0),
            ),
            "estimate",
            "the effect's range is a cost",
        )
    if grow_pays and at_size is not None and not saves(now):
        rec.reasons.append(
            f"too small to pay now ({note(now)}), but a {size:g} GiB tier is predicted to make "
            f"{note(at_size)}"
        )
        predicted(change_to(at_size))
        return decided(rec, "estimate", "the bigger tier's predicted range is a saving")
    if not saves(now):
        barely_reloads = hit_ratio_now is not None and hit_ratio_now < t.low_reuse_ratio
        if rec.action == "grow" and barely_reloads and at_size is not None and at_size.seconds < 0:
            # A tier that reloads almost nothing cannot show an effect; the bigger one leans
            # to a saving, so grow and judge again there.
            rec.reasons.append(
                f"too small to show an effect now ({note(now)}); a {size:g} GiB tier is "
                f"predicted to make {note(at_size)}"
            )
            predicted(change_to(at_size))
            return decided(rec, "estimate", "the bigger tier leans to a saving")
        return _judge_on_unmeasurable(rec, now, hit, note)
    rec.reasons.append(
        f"the CPU tier pays: it saves at least {_ms(-now.high)} per request ({note(now)}: "
        f"{_effect_words(now)}); the other requests it spares a convoy of recomputes do not "
        "show on this server, so the saving may be larger"
    )
    if rec.action == "disable":
        rec.action, rec.kv_offloading_size_gib = "keep", None
        return decided(rec, "estimate", "the effect's range is a saving")
    if rec.action in ("grow", "shrink") and at_size is not None and base is not None:
        change = change_to(at_size)
        if rec.action == "grow" and not best_case_only and not saves(change):
            rec.reasons.append(
                f"growing to {size:g} GiB would change mean TTFT by only "
                f"{change.seconds * 1000:+.0f} ms (range {change.low * 1000:+.0f} … "
                f"{change.high * 1000:+.0f}): keep the current size"
            )
            rec.action, rec.kv_offloading_size_gib = "keep", None
            return decided(rec, "estimate", "growing saves nothing beyond its range")
        predicted(change)
    return decided(rec, "estimate", "the effect's range is a saving")


def _judge_off(
    rec: Recommendation,
    effect_at: Callable[[float], Effect | None] | None,
    best_case_only: bool,
    saves: Callable[[Effect], bool],
    note: Callable[[Effect], str],
) -> Recommendation:
    """Offloading off: enable stands only where the predicted range is a saving."""
    size = rec.kv_offloading_size_gib
    if rec.action != "enable" or size is None or effect_at is None:
        return rec
    effect = effect_at(size * GIB)
    if effect is None:
        return rec
    if best_case_only:
        if saves(effect):
            rec.reasons.append(
                f"even at best (every GPU-missed token reloaded) the tier would make "
                f"{note(effect)}; the hit ratio at {size:g} GiB is unknown without KV "
                "events, so the saving is not predicted"
            )
            return decided(rec, "estimate", "the best case saves beyond its range")
        return decided(
            _replace(
                rec,
                "leave_off",
                [
                    f"even if every GPU-missed token reloaded from CPU, {_effect_words(effect)}: "
                    f"{note(effect)}"
                ],
            ),
            "estimate",
            "not even the best case saves beyond its range",
        )
    if saves(effect):
        rec.ttft_change_seconds = effect.seconds
        rec.ttft_change_basis = "predicted"
        rec.ttft_change_range_seconds = _range(effect)
        rec.reasons.append(
            f"a {size:g} GiB tier is predicted to make {note(effect)}: {_effect_words(effect)}"
        )
        return decided(rec, "estimate", "the predicted range is a saving")
    verdict = (
        f"a {size:g} GiB tier would hit, but {_effect_words(effect)}: predicted {note(effect)}"
    )
    if effect.high >= 0 and effect.seconds < 0:
        verdict += "; " + _SETTLE.format(other="with the tier")
    return decided(
        _replace(rec, "leave_off", [verdict], within_noise=effect.low < 0 < effect.high),
        "estimate",
        "the predicted range is no saving beyond the threshold",
    )


def _judge_on_unmeasurable(
    rec: Recommendation,
    now: Effect,
    hit: str,
    note: Callable[[Effect], str],
) -> Recommendation:
    """Offloading on, an effect within its noise: say so, and let the other costs decide."""
    rec.within_noise = True
    unmeasurable = (
        f"no measurable TTFT effect: {hit}{_effect_words(now)}: {note(now)}; "
        + _SETTLE.format(other="without the tier")
    )
    if rec.action in ("store_threshold", "shrink"):
        rec.reasons.append(unmeasurable)
        return decided(rec, "estimate", "no measurable effect: the cheaper tier stands")
    if now.seconds >= 0 or rec.action == "disable":
        # No saving to show for it, while its costs are certain: pinned memory that cannot
        # swap, and every prompt block copied over PCIe.
        return decided(
            _replace(
                rec,
                "disable",
                [
                    unmeasurable,
                    "its costs are certain (pinned host memory, every computed block copied "
                    "out): disable it, or keep it only where a canary shows a saving",
                ],
                ttft_change_seconds=-now.seconds,
                ttft_change_basis="measured",
                ttft_change_range_seconds=_range(now, -1.0),
                within_noise=True,
            ),
            "estimate",
            "no measurable effect, and no saving in the estimate",
        )
    rec.reasons.append(unmeasurable + f"; the estimate leans to a saving ({_ms(now.seconds)})")
    if rec.action == "grow":
        rec.action, rec.kv_offloading_size_gib = "keep", None
    return decided(rec, "estimate", "no measurable effect: what is there is kept")


def judge_fleet(
    rec: Recommendation, offloading: bool, mean_ttft: float, fleet: Effect, t: Thresholds
) -> Recommendation:
    """Re-decide from replicas of the same model with and without a tier (analysis.replicas)."""
    n = int(fleet.parts.get("replicas_compared", 0))
    seen = (
        f"{n} comparable replica(s) of this model {'without' if offloading else 'with'} a "
        f"tier answer in {fleet.parts['other_mean_ttft_seconds'] * 1000:.1f} ms on average "
        f"against {mean_ttft * 1000:.1f} ms here"
    )
    return judge_ab(rec, offloading, mean_ttft, fleet, t, "fleet", seen)


def judge_ab(
    rec: Recommendation,
    offloading: bool,
    mean_ttft: float,
    ab: Effect,
    t: Thresholds,
    basis: str,
    seen: str,
) -> Recommendation:
    """Re-decide from a measured A/B (basis "fleet": replicas with and without a tier;
    "before_after": this engine before and after its tier changed). Measured TTFT outranks
    the estimate; an A/B within its noise says so and leaves the estimate's advice."""
    floor = max(t.min_ttft_saving_seconds, t.min_ttft_saving_ratio * mean_ttft)
    note = (
        f"with a tier, mean TTFT is {_ms(ab.seconds)} "
        f"{'worse' if ab.seconds > 0 else 'better'} (range {ab.low * 1000:+.0f} … "
        f"{ab.high * 1000:+.0f} ms; a change needs ≥ {_ms(floor)} saved beyond it)"
    )
    pays = ab.high < 0 and -ab.seconds >= floor
    costs = ab.low > 0
    what = "the fleet" if basis == "fleet" else "this engine, before and after its tier changed,"
    if not pays and not costs:
        rec.reasons.insert(0, f"{what} cannot tell yet: {seen}: {note}")
        rec.trace.append({"stage": basis, "action": rec.action, "why": "within its noise"})
        return rec
    if offloading:
        if pays:
            rec.reasons.insert(0, f"{what} shows the tier pays: {seen}: {note}")
            if rec.action == "disable":
                rec.action, rec.kv_offloading_size_gib = "keep", None
                rec.ttft_change_seconds = rec.ttft_change_basis = None
                rec.ttft_change_range_seconds = None
            return decided(rec, basis, "the measured range is a saving")
        return decided(
            _replace(
                rec,
                "disable",
                [f"{what} shows the tier does not pay: {seen}: {note}"],
                ttft_change_seconds=-ab.seconds,
                ttft_change_basis=basis,
                ttft_change_range_seconds=[-ab.high, -ab.low],
            ),
            basis,
            "the measured range is a cost",
        )
    if costs:
        return decided(
            _replace(rec, "leave_off", [f"{what} shows a tier would not pay: {seen}: {note}"]),
            basis,
            "the measured range is a cost",
        )
    size = rec.kv_offloading_size_gib if rec.action == "enable" else None
    tier = ab.parts.get("tier_bytes_per_engine")
    if size is None and tier:
        size = round_size_gib(tier)
    reasons = [f"{what} shows a tier pays: {seen}: {note}"]
    return decided(
        _replace(
            rec,
            "enable",
            reasons + ([] if rec.action != "enable" else rec.reasons),
            kv_offloading_size_gib=size,
            ttft_change_seconds=ab.seconds,
            ttft_change_basis=basis,
            ttft_change_range_seconds=[ab.low, ab.high],
        ),
        basis,
        "the measured range is a saving",
    )
