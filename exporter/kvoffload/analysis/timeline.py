"""Tier segments: each engine's settled TTFT per stretch of one CPU tier, kept as scrapes come.

Why its own module: the window feeds it every scrape and the before/after A/B (`beforeafter`)
reads it; neither then imports the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvoffload.ingest.catalog import Extract

GroupKey = tuple[str, str]
_KEYS = ("ttft_sum", "ttft_count", "prompt_tokens", "prefix_queries", "prefix_hits", "e2e_sum")
BLOCK_SECONDS = 5.0  # intervals pooled into blocks this long: neighbours are not independent
SETTLE_SECONDS = 10.0  # the first seconds after a start: compile and warm-up, not the tier
MAX_GROUPS = 1024  # a target renaming its models every scrape cannot grow it without end
MAX_BLOCKS = 2048  # per segment; beyond, blocks merge in pairs (memory bounded)


@dataclass
class Segment:
    """One stretch of one tier: its settled totals and TTFT (sum, count) in time blocks."""

    tier: str  # "off", or the kv_offloading_size in GiB as vLLM's label gives it
    start: float
    end: float
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_KEYS, 0.0))
    blocks: list[list[float]] = field(default_factory=list)
    block_seconds: float = BLOCK_SECONDS

    def add(self, t: float, inc: dict[str, float]) -> None:
        self.end = t
        since = t - self.start - SETTLE_SECONDS
        if since < 0:
            return
        for k in _KEYS:
            self.totals[k] += inc[k]
        idx = int(since // self.block_seconds)
        while idx >= MAX_BLOCKS:  # a long run: blocks twice as long, memory bounded
            self.blocks = [
                [sum(b[0] for b in pair), sum(b[1] for b in pair)]
                for pair in (self.blocks[k : k + 2] for k in range(0, len(self.blocks), 2))
            ]
            self.block_seconds *= 2
            idx = int(since // self.block_seconds)
        while len(self.blocks) <= idx:
            self.blocks.append([0.0, 0.0])
        self.blocks[idx][0] += inc["ttft_sum"]
        self.blocks[idx][1] += inc["ttft_count"]

    def settled_seconds(self) -> float:
        return max(self.end - self.start - SETTLE_SECONDS, 0.0)

    def mean_and_se(self) -> tuple[float, float] | None:
        """Mean TTFT (Σsum/Σcount) and its standard error over blocks (a ratio estimator)."""
        blocks = [b for b in self.blocks if b[1] > 0]
        total = sum(c for _, c in blocks)
        if total <= 0 or len(blocks) < 3:
            return None
        mean = sum(s for s, _ in blocks) / total
        if not math.isfinite(mean):
            return None  # a target's absurd counters: no mean to compare
        n = len(blocks)
        # products, not **: a float power raises on overflow where a product gives inf
        var = sum((s - mean * c) * (s - mean * c) for s, c in blocks) / (total * total)
        var *= n / (n - 1)
        return (mean, math.sqrt(var)) if math.isfinite(var) else None


def _tiers(ex: Extract) -> dict[str, str]:
    """Each instance's tier in this scrape, in one pass over its cache configs. Uses vLLM's
    cache_config_info kv_offloading_size where given, else the kv_offload families."""
    sizes: dict[str, set[str]] = {}
    for (instance, _engine), labels in ex.cache_config.items():
        size = labels.get("kv_offloading_size", "")
        if size:
            sizes.setdefault(instance, set()).add(size)
    tiers = {}
    for instance, given in sizes.items():
        on = sorted(v for v in given if v not in ("None", "0", "0.0"))
        tiers[instance] = on[-1] if on else "off"
    return tiers


def _tier_of(tiers: dict[str, str], ex: Extract, instance: str) -> str:
    if instance in tiers:
        return tiers[instance]
    return "on" if ex.offload_families.get(instance) else "off"


class TierTimeline:
    """Each group's tier segments, built from the scrapes as they come (bounded)."""

    def __init__(self) -> None:
        self._last: dict[GroupKey, tuple[float, dict[str, float]]] = {}
        self._segments: dict[GroupKey, list[Segment]] = {}

    def observe(self, ex: Extract) -> None:
        totals: dict[GroupKey, dict[str, float]] = {}
        for (key, instance, model, _engine), value in ex.counters.items():
            if key in _KEYS and math.isfinite(value):
                sums = totals.setdefault((instance, model), dict.fromkeys(_KEYS, 0.0))
                sums[key] += value
        tiers = _tiers(ex) if totals else {}
        for group, now in totals.items():
            if group not in self._segments and len(self._segments) >= MAX_GROUPS:
                oldest = next(iter(self._segments))  # dicts keep order: first seen goes
                del self._segments[oldest]
                self._last.pop(oldest, None)
            tier = _tier_of(tiers, ex, group[0])
            segments = self._segments.setdefault(group, [])
            if not segments or segments[-1].tier != tier:
                segments.append(Segment(tier, ex.timestamp, ex.timestamp))
                del segments[:-2]  # the latest change is what is compared
            seg = segments[-1]
            last = self._last.get(group)
            self._last[group] = (ex.timestamp, now)
            if last is None or ex.timestamp <= last[0]:
                continue
            inc = {k: now[k] - last[1].get(k, 0.0) for k in _KEYS}
            if any(v < 0 for v in inc.values()):
                # A counter went back: vLLM restarted. A new segment starts at its restart
                # (its settling time counts from here).
                if seg.totals["ttft_count"] == 0 and not seg.blocks:
                    seg.start = ex.timestamp
                seg.end = ex.timestamp
                continue
            seg.add(ex.timestamp, inc)

    def segments(self, group: GroupKey) -> list[Segment]:
        return list(self._segments.get(group, []))
