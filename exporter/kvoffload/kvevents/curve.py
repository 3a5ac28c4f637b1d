"""The miss-ratio curve: predicted offload hit ratio at every CPU-tier size, and the right size.

Its denominator is the counter-based ratio's, so the two compare (docs/sizing.md §3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvoffload.kvevents.state import TargetEvents

GIB = 2**30
MIB = 2**20
# 64 MiB … 1 TiB on a log2 scale: the histogram's fixed bucket bounds.
LOG_BOUNDS_BYTES = tuple(64 * MIB * 2**i for i in range(15))


@dataclass(frozen=True)
class CurvePoint:
    cpu_bytes: float
    predicted_offload_hit_ratio: float

    def to_json(self) -> dict[str, float]:
        return {
            "cpu_gib": self.cpu_bytes / GIB,
            "predicted_offload_hit_ratio": self.predicted_offload_hit_ratio,
        }


@dataclass(frozen=True)
class Curve:
    points: list[CurvePoint]
    achievable_hit_ratio: float
    right_size_bytes: float | None
    missed_tokens: float
    bytes_per_block: float

    def at(self, cpu_bytes: float, events: TargetEvents) -> float:
        return events.hit_tokens(cpu_bytes, self.bytes_per_block) / self.missed_tokens


def build_curve(
    events: TargetEvents,
    bytes_per_block: float,
    missed_tokens: float | None = None,
    extra_sizes: tuple[float, ...] = (),
    target_share: float = 0.95,
) -> Curve | None:
    """The curve, or None when nothing was missed yet or the block size in bytes is unknown.

    `missed_tokens`: the counters' GPU-missed prompt tokens over the same period, the events' full
    blocks without it. Why: the counters include each prompt's partial last block, never an event.
    """
    # Hit ratio at size C: GPU-missed tokens with reuse distance under C ÷ all GPU-missed tokens.
    # The right size: the smallest tier reaching target_share of the unbounded tier's ratio (the
    # simulator oracle's definition).
    from_events = events.missed_tokens_from_events()
    denominator = missed_tokens if missed_tokens and missed_tokens >= from_events else from_events
    if not denominator or not 0 < bytes_per_block < math.inf or not events.block_size:
        return None
    sizes = sorted(set(LOG_BOUNDS_BYTES) | {s for s in extra_sizes if s and s > 0})
    points = [CurvePoint(s, events.hit_tokens(s, bytes_per_block) / denominator) for s in sizes]
    achievable = events.achievable_tokens() / denominator
    ratios = [achievable, denominator, *(p.predicted_offload_hit_ratio for p in points)]
    if not all(map(math.isfinite, ratios)):
        # Counts near the float range (a state file's histogram, sizes from absurd figures)
        # overflow the sums: no curve rather than NaN ratios.
        return None
    right = (
        _smallest_size_reaching(events, bytes_per_block, target_share * achievable * denominator)
        if achievable > 0
        else None
    )
    return Curve(points, achievable, right, denominator, bytes_per_block)


def _smallest_size_reaching(
    events: TargetEvents, bytes_per_block: float, tokens: float
) -> float | None:
    """Binary search over whole blocks: hits grow monotonically with the size."""
    lo, hi = 1, 1
    limit = 1 << 40
    while events.hit_tokens(hi * bytes_per_block, bytes_per_block) < tokens:
        hi *= 2
        if hi > limit:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if events.hit_tokens(mid * bytes_per_block, bytes_per_block) >= tokens:
            hi = mid
        else:
            lo = mid + 1
    return lo * bytes_per_block
