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

ACTIONS = ("enable", "leave_off", "keep", "grow", "shrink", "store_threshold", "disable")


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
    # Bytes copied out per second of critical-path time on an overhead-bound engine
    # (calibrated on real vLLM 0.26.0, H200: docs/advisor.md).
    store_critical_bytes_per_second: float = 2.5e9
    # Store attempts per second finding no free CPU-tier slot above which the tier is too small.
    min_allocation_failures_per_second: float = 0.0
    # The KV-event curve sizes a tier only from a stream that has covered a steady state:
    # the GPU cache turned over this many times, and the share of first touches over the
    # whole stream at most this far above its share over the recent half (a cold start
    # inflates it; the curve's hit ratios are low by about that gap).
    min_gpu_turnovers: float = 2.0
    max_first_touch_gap_ratio: float = 0.05


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
) -> Recommendation:
    """`figures` are sums over the group's engines; sizes are per engine (each DP engine
    gets its own --kv-offloading-size), so byte figures are divided by `engines` for them."""
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
    _memory_check(rec, figures, offloading, memory_limit_bytes, t, max(engines, 1))
    return rec


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
            return rec
        action = "disable" if offloading else "leave_off"
        new = Recommendation(
            action,
            reasons=[
                f"the KV-event curve shows no reuse a CPU tier could serve: achievable offload hit "
                f"ratio {achievable:.3f} < {t.low_reuse_ratio:g}"
            ],
        )
        new.evidence = rec.evidence
        return new
    size_bytes = max(right_size_bytes, floor)
    size = round_size_gib(size_bytes)
    warnings: list[str] = []
    if memory_limit_bytes:
        ceiling = memory_limit_bytes / (1 + t.memory_headroom_ratio) / max(engines, 1)
        if size * GIB > ceiling:
            size = max(0.25, math.floor(ceiling / GIB / 0.25) * 0.25)
            warnings.append(
                f"capped at {size:g} GiB per engine by the memory limit "
                f"{memory_limit_bytes / GIB:.2f} GiB less "
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
    return new


def _memory_check(
    rec: Recommendation,
    figures: dict[str, float | None],
    offloading: bool,
    limit: float | None,
    t: Thresholds,
    engines: int = 1,
) -> None:
    """Every engine of the container pins its own tier: the total is what the limit sees."""
    if limit is None:
        return
    if rec.kv_offloading_size_gib:
        size: float | None = rec.kv_offloading_size_gib * GIB * engines
    else:
        size = figures.get("cpu_capacity_bytes") if offloading else None
    if size and size * (1 + t.memory_headroom_ratio) > limit:
        rec.warnings.append(
            f"pinned CPU tier {size / GIB:.2f} GiB ({engines} engine(s)) + "
            f"{t.memory_headroom_ratio:.0%} headroom exceeds the memory limit "
            f"{limit / GIB:.2f} GiB: risk of OOM (pinned memory cannot swap; "
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
    return (
        f"a reloaded request waits for the asynchronous load (~{wait}"
        f" per request), the offload path costs ~{_ms(parts['store_seconds'])}, and "
        f"recomputing the {parts['reloaded_tokens_per_request']:.0f} reloaded tokens per "
        f"request would cost ~{_ms(parts['recompute_saved_seconds'])}"
    )


def _range(effect: Effect, sign: float = 1.0) -> list[float]:
    low, high = sorted((sign * effect.low, sign * effect.high))
    return [low, high]


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
    effect of a tier of that size against none, predicted. enable / keep / grow stand only
    when the saving exceeds its uncertainty and max(min_ttft_saving_seconds,
    min_ttft_saving_ratio × mean TTFT); a tier that costs TTFT is disabled (or left off).
    best_case_only: effect_at is the bound where every GPU-missed token reloads (no KV
    events: the hit ratio at a size is unknown); it can rule a tier out, not size its gain."""
    if rec.insufficient_data or mean_ttft is None:
        return rec
    floor = max(t.min_ttft_saving_seconds, t.min_ttft_saving_ratio * mean_ttft)

    def pays(effect: Effect) -> bool:
        return effect.high < 0 and -effect.seconds >= floor

    def verdict_note(effect: Effect) -> str:
        return (
            f"mean TTFT {_ms(effect.seconds)} {'worse' if effect.seconds > 0 else 'better'}"
            f" than recomputing (range {effect.low * 1000:+.0f} … "
            f"{effect.high * 1000:+.0f} ms; needs ≥ {_ms(floor)} saved beyond it)"
        )

    if not offloading:
        size = rec.kv_offloading_size_gib
        if rec.action != "enable" or size is None or effect_at is None:
            return rec
        effect = effect_at(size * GIB)
        if effect is None:
            return rec
        if best_case_only and pays(effect):
            rec.reasons.append(
                f"even at best (every GPU-missed token reloaded) the tier would make "
                f"{verdict_note(effect)}; the hit ratio at {size:g} GiB is unknown without KV "
                "events, so the saving is not predicted"
            )
            return rec
        if best_case_only:
            return Recommendation(
                "leave_off",
                reasons=[
                    f"even if every GPU-missed token reloaded from CPU, {_effect_words(effect)}: "
                    f"{verdict_note(effect)}"
                ],
                warnings=rec.warnings,
                evidence=rec.evidence,
            )
        if pays(effect):
            rec.ttft_change_seconds = effect.seconds
            rec.ttft_change_basis = "predicted"
            rec.ttft_change_range_seconds = _range(effect)
            rec.reasons.append(
                f"a {size:g} GiB tier is predicted to make {verdict_note(effect)}:"
                f" {_effect_words(effect)}"
            )
            return rec
        new = Recommendation(
            "leave_off",
            reasons=[
                f"a {size:g} GiB tier would hit, but {_effect_words(effect)}: predicted "
                f"{verdict_note(effect)}"
            ],
            warnings=rec.warnings,
            evidence=rec.evidence,
        )
        return new

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
    if not pays(now):
        if rec.action == "grow" and at_size is not None and pays(at_size):
            rec.reasons.append(
                f"too small to pay now ({verdict_note(now)}), but a {size:g} GiB tier is "
                f"predicted to make {verdict_note(at_size)}"
            )
            predicted(change_to(at_size))
            return rec
        store = now.parts.get("store_seconds", 0.0)
        if rec.action == "store_threshold" and now.seconds < floor:
            # Stores without reloads: what the tier costs is its stores (PCIe traffic, pinned
            # memory, and ~store of TTFT); storing a prefix only when it comes back cuts them.
            rec.reasons.append(
                f"the stores cost ~{_ms(store)} of mean TTFT per request now ({verdict_note(now)})"
            )
            predicted(Effect(-store, -1.5 * store, -0.5 * store, {}))
            return rec
        why = "costs TTFT" if now.seconds > 0 else "saves too little to show"
        return Recommendation(
            "disable",
            reasons=[f"the CPU tier {why}: {hit}{_effect_words(now)}: {verdict_note(now)}"],
            warnings=rec.warnings,
            evidence=rec.evidence,
            ttft_change_seconds=-now.seconds,
            ttft_change_basis="measured",
            ttft_change_range_seconds=_range(now, -1.0),
        )
    rec.reasons.append(f"the CPU tier pays: {verdict_note(now)}: {_effect_words(now)}")
    if rec.action == "disable":
        rec.action, rec.kv_offloading_size_gib = "keep", None
        return rec
    if rec.action in ("grow", "shrink") and at_size is not None and base is not None:
        change = change_to(at_size)
        if (
            rec.action == "grow"
            and not best_case_only
            and not (change.high < 0 and -change.seconds >= floor)
        ):
            rec.reasons.append(
                f"growing to {size:g} GiB would change mean TTFT by only "
                f"{change.seconds * 1000:+.0f} ms (range {change.low * 1000:+.0f} … "
                f"{change.high * 1000:+.0f}): keep the current size"
            )
            rec.action, rec.kv_offloading_size_gib = "keep", None
            return rec
        predicted(change)
    return rec


def judge_fleet(
    rec: Recommendation, offloading: bool, mean_ttft: float, fleet: Effect, t: Thresholds
) -> Recommendation:
    """Re-decide from replicas of the same model with and without a tier (kvoffload.analysis.fleet):
    measured TTFT, not a model of it, so it outranks judge_ttft's estimate."""
    floor = max(t.min_ttft_saving_seconds, t.min_ttft_saving_ratio * mean_ttft)
    n = int(fleet.parts.get("replicas_compared", 0))
    seen = (
        f"{n} comparable replica(s) of this model {'without' if offloading else 'with'} a "
        f"tier answer in {fleet.parts['other_mean_ttft_seconds'] * 1000:.1f} ms on average "
        f"against {mean_ttft * 1000:.1f} ms here"
    )
    note = (
        f"with a tier, mean TTFT is {_ms(fleet.seconds)} "
        f"{'worse' if fleet.seconds > 0 else 'better'} (range {fleet.low * 1000:+.0f} … "
        f"{fleet.high * 1000:+.0f} ms; needs ≥ {_ms(floor)} saved beyond it)"
    )
    pays = fleet.high < 0 and -fleet.seconds >= floor
    if offloading:
        if pays:
            rec.reasons.insert(0, f"the fleet shows the tier pays: {seen}: {note}")
            if rec.action == "disable":
                rec.action, rec.kv_offloading_size_gib = "keep", None
                rec.ttft_change_seconds = rec.ttft_change_basis = None
                rec.ttft_change_range_seconds = None
            return rec
        return Recommendation(
            "disable",
            reasons=[f"the fleet shows the tier does not pay: {seen}: {note}"],
            warnings=rec.warnings,
            evidence=rec.evidence,
            ttft_change_seconds=-fleet.seconds,
            ttft_change_basis="fleet",
            ttft_change_range_seconds=[-fleet.high, -fleet.low],
        )
    if not pays:
        return Recommendation(
            "leave_off",
            reasons=[f"the fleet shows a tier would not pay: {seen}: {note}"],
            warnings=rec.warnings,
            evidence=rec.evidence,
        )
    size = rec.kv_offloading_size_gib if rec.action == "enable" else None
    tier = fleet.parts.get("tier_bytes_per_engine")
    if size is None and tier:
        size = round_size_gib(tier)
    return Recommendation(
        "enable",
        size,
        reasons=[f"the fleet shows a tier pays: {seen}: {note}"]
        + ([] if rec.action != "enable" else rec.reasons),
        warnings=rec.warnings,
        evidence=rec.evidence,
        ttft_change_seconds=fleet.seconds,
        ttft_change_basis="fleet",
        ttft_change_range_seconds=[fleet.low, fleet.high],
    )
