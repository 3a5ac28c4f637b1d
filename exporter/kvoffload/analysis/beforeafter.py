"""Before/after: one engine's TTFT before and after its CPU tier changed, at matched load.

Why: a restart with another `--kv-offloading-size` is an A/B on the server that matters. It
outranks any estimate (basis "before_after"; docs/advisor.md "Before and after").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvoffload.analysis.ttft import Effect
from kvoffload.ingest.catalog import Extract

GroupKey = tuple[str, str]
_KEYS = ("ttft_sum", "ttft_count", "prompt_tokens", "prefix_queries", "prefix_hits", "e2e_sum")
BLOCK_SECONDS = 5.0  # intervals pooled into blocks this long: neighbours are not independent
SETTLE_SECONDS = 10.0  # the first seconds after a start: compile and warm-up, not the tier
MIN_REQUESTS = 200  # a side with fewer cannot give a mean worth comparing
MIN_SECONDS = 60.0
MAX_GROUPS = 1024  # a target renaming its models every scrape cannot grow it without end
MAX_BLOCKS = 2048  # per segment; beyond, blocks merge in pairs (memory bounded)
RUN_TO_RUN_SECONDS = 0.0042  # the same configuration run twice: its effect moved ~4.2 ms
MATCH_RATIO = 0.25  # request rate and prompt tokens per request within 25%
MATCH_HIT_RATIO = 0.10  # GPU prefix-cache hit ratio within 0.10


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


@dataclass(frozen=True)
class BeforeAfter:
    """The latest tier change of one engine, measured."""

    before: str
    after: str
    effect: Effect  # mean TTFT with the tier − without (seconds; negative: the tier helps)
    matched: bool
    mismatch: list[str]
    requests: tuple[int, int]  # (without the tier, with it)
    seconds: tuple[float, float]
    mean_ttft_without_seconds: float
    tier_gib: float | None

    def to_json(self) -> dict[str, object]:
        return {
            "before": self.before,
            "after": self.after,
            **self.effect.to_json(),
            "matched": self.matched,
            "mismatch": self.mismatch,
            "requests_without_with": list(self.requests),
            "seconds_without_with": list(self.seconds),
        }

    def seen(self) -> str:
        return (
            f"{self.requests[0]:,} requests over {self.seconds[0]:.0f} s without the tier and "
            f"{self.requests[1]:,} over {self.seconds[1]:.0f} s with it ({self.before} → "
            f"{self.after}), at matched load"
        )


def _load(seg: Segment) -> dict[str, float | None]:
    tot, secs = seg.totals, seg.settled_seconds()
    n = tot["ttft_count"]
    return {
        "requests per second": n / secs if secs > 0 else None,
        # Little's law: what closed-loop clients hold constant while the rate follows latency
        "requests in the system": tot["e2e_sum"] / secs if secs > 0 else None,
        "prompt tokens per request": tot["prompt_tokens"] / n if n > 0 else None,
        "GPU prefix-cache hit ratio": (
            tot["prefix_hits"] / tot["prefix_queries"] if tot["prefix_queries"] > 0 else None
        ),
    }


def before_after(segments: list[Segment]) -> BeforeAfter | None:
    """The latest change between no tier and a tier, either way. None if no change was seen or one
    side is too short."""
    if len(segments) < 2:
        return None
    a, b = segments[-2], segments[-1]
    if (a.tier == "off") == (b.tier == "off"):
        return None  # a size change: both sides have a tier (not judged here yet)
    off, on = (a, b) if a.tier == "off" else (b, a)
    stats = []
    for seg in (off, on):
        mse = seg.mean_and_se()
        n = int(seg.totals["ttft_count"])
        if mse is None or n < MIN_REQUESTS or seg.settled_seconds() < MIN_SECONDS:
            return None
        stats.append((mse, n))
    (m_off, se_off), n_off = stats[0]
    (m_on, se_on), n_on = stats[1]
    if not all(math.isfinite(v) for v in (m_off, se_off, m_on, se_on)):
        return None  # sums a target's absurd counters overflowed: nothing to compare
    sigma = math.sqrt(se_off * se_off + se_on * se_on + RUN_TO_RUN_SECONDS * RUN_TO_RUN_SECONDS)
    diff = m_on - m_off
    lo_off, lo_on = _load(off), _load(on)
    mismatch: list[str] = []
    differs: dict[str, str] = {}
    for what, x in lo_off.items():
        y = lo_on[what]
        if x is None or y is None:
            continue
        if not (math.isfinite(x) and math.isfinite(y)):
            differs[what] = f"{what} not a finite number"
            continue
        if what.startswith("GPU"):
            if abs(x - y) > MATCH_HIT_RATIO:
                differs[what] = f"{what} {x:.2f} without vs {y:.2f} with"
        elif max(x, y) > 0 and abs(x - y) / max(x, y) > MATCH_RATIO:
            differs[what] = f"{what} {x:.3g} without vs {y:.3g} with"
    # The load matched if the clients did: an open loop keeps the rate, a closed loop the
    # requests in the system (its rate then follows the latency the tier changes).
    rate, held = (
        differs.pop("requests per second", None),
        differs.pop("requests in the system", None),
    )
    if rate and held:
        mismatch += [rate, held]
    mismatch += differs.values()
    try:
        gib: float | None = float(on.tier)  # the target's label: checked like any input
    except ValueError:
        gib = None
    if gib is not None and not (math.isfinite(gib) and 0 < gib < 2**20):
        gib = None
    parts = {"mean_ttft_without_seconds": m_off, "mean_ttft_with_seconds": m_on}
    if gib is not None:
        parts["tier_bytes_per_engine"] = gib * 2**30
    return BeforeAfter(
        a.tier if a.tier == "off" else f"{a.tier} GiB",
        b.tier if b.tier == "off" else f"{b.tier} GiB",
        Effect(diff, diff - 2 * sigma, diff + 2 * sigma, parts),
        not mismatch,
        mismatch,
        (n_off, n_on),
        (off.settled_seconds(), on.settled_seconds()),
        m_off,
        gib,
    )
