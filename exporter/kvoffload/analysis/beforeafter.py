"""Before/after: one engine's TTFT before and after its CPU tier changed, at matched load.

Why: a restart with another `--kv-offloading-size` is an A/B on the server that matters. It
outranks any estimate (basis "before_after"; docs/advisor.md "Before and after").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvoffload.analysis.timeline import Segment
from kvoffload.analysis.ttft import Effect

MIN_REQUESTS = 200  # a side with fewer cannot give a mean worth comparing
MIN_SECONDS = 60.0
RUN_TO_RUN_SECONDS = 0.0042  # the same configuration run twice: its effect moved ~4.2 ms
MATCH_RATIO = 0.25  # request rate and prompt tokens per request within 25%
MATCH_HIT_RATIO = 0.10  # GPU prefix-cache hit ratio within 0.10


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
