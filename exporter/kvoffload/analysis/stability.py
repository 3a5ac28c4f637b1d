"""Stable advice: the published action and size change only when a new one has held.

Why: operators cannot act on advice that alternates every few seconds. The rules are in
docs/advisor.md ("Stable advice"); times are the data's own, so simulated time works too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from kvoffload.analysis.advisor import Recommendation

# The actions that leave the tier as it is: what a server is told while it is not yet judged.
_HOLD = {True: "keep", False: "leave_off"}


@dataclass(frozen=True)
class StabilityRules:
    """How long a new advice must hold, and how far a size must move, before it is published."""

    warmup_seconds: float = 120.0  # of data after a start or a tier change, not judged
    dwell_seconds: float = 180.0  # a new advice must hold this long (data time)
    size_margin_ratio: float = 0.25  # sizes within 25% (or one step) are the same advice
    size_margin_gib: float = 1.0


def _tier_signature(offloading: bool, capacity_bytes: float | None) -> tuple[bool, float]:
    """The configuration the advice is about: a change of it restarts the judgement."""
    size = capacity_bytes if capacity_bytes is not None and math.isfinite(capacity_bytes) else 0.0
    return (offloading, round(size / 2**28))  # quarter-GiB steps: label rounding is no change


@dataclass
class _Candidate:
    action: str
    size_gib: float | None
    since: float


@dataclass
class AdviceHolder:
    """One group's published advice, its pending challenger and the tier it judges."""

    rules: StabilityRules = field(default_factory=StabilityRules)
    published: Recommendation | None = None
    since: float | None = None  # data time the published action and size stand since
    pending: _Candidate | None = None
    tier: tuple[bool, float] | None = None
    tier_since: float | None = None

    def same(self, a: tuple[str, float | None], b: tuple[str, float | None]) -> bool:
        """One advice: the same action and, where both give a size, sizes within the margin."""
        if a[0] != b[0]:
            return False
        if a[1] is None or b[1] is None:
            return a[1] is None and b[1] is None
        margin = max(self.rules.size_margin_gib, self.rules.size_margin_ratio * max(a[1], b[1]))
        return abs(a[1] - b[1]) <= margin

    def update(
        self,
        fresh: Recommendation,
        now: float,
        offloading: bool,
        capacity_bytes: float | None,
    ) -> Recommendation:
        """What to publish at data time `now`, given the fresh judgement."""
        tier = _tier_signature(offloading, capacity_bytes)
        if tier != self.tier or self.tier_since is None or now < self.tier_since:
            self.tier, self.tier_since = tier, now
            self.published = self.since = self.pending = None
        judged_for = now - self.tier_since
        if fresh.insufficient_data:
            return _copy(fresh)  # it says so itself; nothing stands or waits
        if judged_for < self.rules.warmup_seconds:
            return self._warming(fresh, offloading, judged_for)
        key = (fresh.action, fresh.kv_offloading_size_gib)
        if self.published is None:
            return self._publish(fresh, now, "the first judgement after the warm-up")
        current = (self.published.action, self.published.kv_offloading_size_gib)
        if self.same(key, current):
            # The same advice: its figures and words refresh, its standing does not.
            self.pending = None
            return self._publish(fresh, self.since or now, None, keep_size=current[1])
        if self.published.within_noise and not fresh.within_noise:
            # The published advice was only what the noise allowed (nobody could tell yet): the
            # first judgement that clears it settles the question, which is no flap.
            self.pending = None
            return self._publish(fresh, now, "the first judgement that clears the noise")
        if fresh.within_noise:
            # Hysteresis: a judgement within the noise does not overturn a published advice;
            # only one whose range clears the threshold (or another cost) challenges it.
            self.pending = None
            return self._stands(fresh)
        if self.pending is None or not self.same(key, (self.pending.action, self.pending.size_gib)):
            self.pending = _Candidate(key[0], key[1], now)
        held = now - self.pending.since
        if held >= self.rules.dwell_seconds:
            return self._publish(fresh, now, f"held for {held:.0f} s")
        return self._hold(fresh, held)

    def _warming(
        self, fresh: Recommendation, offloading: bool, judged_for: float
    ) -> Recommendation:
        rest = max(self.rules.warmup_seconds - judged_for, 0.0)
        held = Recommendation(
            _HOLD[offloading],
            reasons=[
                f"not judged yet: {judged_for:.0f} s of data since a start or a change of the "
                f"tier; the advice comes after {rest:.0f} s more "
                f"(the fresh judgement, {_words(fresh)}, is in the trace)"
            ],
            warnings=fresh.warnings,
            evidence=fresh.evidence,
            insufficient_data=fresh.insufficient_data,
            decided_by="warmup",
        )
        held.trace = [*fresh.trace, _step("warmup", held, f"{judged_for:.0f} s of data")]
        return held

    def _publish(
        self,
        fresh: Recommendation,
        since: float,
        why: str | None,
        keep_size: float | None = None,
    ) -> Recommendation:
        out = _copy(fresh)
        if keep_size is not None:
            out.kv_offloading_size_gib = keep_size  # within the margin: the size stands
        if why is not None:
            out.trace.append(_step("stability", out, f"published: {why}"))
        self.published, self.since = out, since
        out.since = since
        return out

    def _stands(self, fresh: Recommendation) -> Recommendation:
        assert self.published is not None
        out = _copy(self.published)
        out.since = self.since
        out.reasons = [
            *out.reasons,
            f"the latest judgement ({_words(fresh)}) is within the noise: the advice stands",
        ]
        out.trace = [*fresh.trace, _step("stability", out, f"stands: {_words(fresh)} in noise")]
        return out

    def _hold(self, fresh: Recommendation, held: float) -> Recommendation:
        assert self.published is not None and self.since is not None
        out = _copy(self.published)
        out.since = self.since
        need = self.rules.dwell_seconds - held
        out.pending = {
            "action": fresh.action,
            "kv_offloading_size_gib": fresh.kv_offloading_size_gib,
            "since": self.pending.since if self.pending else None,
        }
        out.reasons = [
            *out.reasons,
            f"a new advice ({_words(fresh)}) has held for {held:.0f} s; it is published "
            f"once it holds {need:.0f} s more",
        ]
        out.trace = [*fresh.trace, _step("stability", out, f"kept: {_words(fresh)} pending")]
        return out


def _words(rec: Recommendation) -> str:
    size = rec.kv_offloading_size_gib
    return rec.action if size is None else f"{rec.action} {size:g} GiB"


def _step(stage: str, rec: Recommendation, why: str) -> dict[str, object]:
    size = rec.kv_offloading_size_gib
    return {"stage": stage, "action": rec.action, "size_gib": size, "why": why}


def _copy(rec: Recommendation) -> Recommendation:
    """A copy whose lists the holder may extend without touching the fresh judgement."""
    return replace(
        rec,
        reasons=list(rec.reasons),
        warnings=list(rec.warnings),
        evidence=dict(rec.evidence),
        trace=list(rec.trace),
    )
