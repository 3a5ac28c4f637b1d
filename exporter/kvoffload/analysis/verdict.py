"""The TTFT rules: the advice judged by what the tier does to time-to-first-token.

Why: hit ratio is not payoff, so the estimate (analysis.ttft) and measured A/Bs outrank the
counters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvoffload.analysis.advice import (
    Recommendation,
    decided,
    effect_range,
    effect_words,
    ms_text,
    replace_advice,
    round_size_gib,
)
from kvoffload.analysis.signals import GIB
from kvoffload.analysis.ttft import Effect
from kvoffload.thresholds import Thresholds


@dataclass(frozen=True)
class TtftEvidence:
    """The TTFT model's evidence (analysis.ttft): the effect now and at any size against none.

    `effect_with(hit ratio, stored share)`: the knobs' what-ifs. `best_case_only`: no KV events,
    so `effect_at` is the bound where every GPU-missed token reloads.
    """

    mean_ttft: float
    now: Effect | None
    effect_at: Callable[[float], Effect | None] | None
    hit_ratio_now: float | None = None
    best_case_only: bool = False
    current_bytes: float | None = None
    effect_with: Callable[[float, float], Effect | None] | None = None
    tier_below: bool = False  # a secondary tier: its hits also reload through the CPU tier


@dataclass(frozen=True)
class Measured:
    """A measured A/B of the tier: basis "replicas" or "before_after" (a tier change)."""

    effect: Effect
    mean_ttft: float
    basis: str
    seen: str

    @classmethod
    def replicas(cls, effect: Effect, offloading: bool, mean_ttft: float) -> Measured:
        """The replicas' A/B (analysis.replicas), with the words that say what was compared."""
        n = int(effect.parts.get("replicas_compared", 0))
        seen = (
            f"{n} comparable replica(s) of this model {'without' if offloading else 'with'} a "
            f"tier answer in {effect.parts['other_mean_ttft_seconds'] * 1000:.1f} ms on average "
            f"against {mean_ttft * 1000:.1f} ms here"
        )
        return cls(effect, mean_ttft, "replicas", seen)


# What would settle an effect one server cannot tell from noise.
_SETTLE = (
    "one short run cannot tell an effect this small from run-to-run noise: a longer window "
    "narrows the range; a canary replica {other} (or a restart {other}, compared before and "
    "after) measures it"
)


@dataclass(frozen=True)
class _Bar:
    """The saving a change must clear (floor, in seconds), and the words that set an effect by it.

    Why: every TTFT rule asks the same questions of an effect and says the answer the same way.
    """

    floor: float

    def saves(self, effect: Effect) -> bool:
        """Whether the effect's whole range is a saving at least the floor."""
        return effect.high < 0 and -effect.seconds >= self.floor

    @staticmethod
    def costs(effect: Effect) -> bool:
        """Whether the effect's whole range is a cost."""
        return effect.low > 0

    def note(self, effect: Effect) -> str:
        """The effect, its range and the floor, in words for a reason."""
        return (
            f"mean TTFT {ms_text(effect.seconds)} {'worse' if effect.seconds > 0 else 'better'}"
            f" than recomputing (range {effect.low * 1000:+.0f} … "
            f"{effect.high * 1000:+.0f} ms; a change needs ≥ {ms_text(self.floor)} saved beyond it)"
        )


@dataclass(frozen=True)
class _TierOn:
    """Offloading on: the effect now, at the advised size, and the model's own at the current size.

    Why: a size change is priced as the difference of two predictions, so the model's bias cancels.
    """

    now: Effect
    size: float | None
    at_size: Effect | None
    base: Effect | None
    hit_ratio: float | None
    best_case_only: bool
    bar: _Bar
    tier_below: bool = False

    @classmethod
    def of(cls, rec: Recommendation, ev: TtftEvidence, now: Effect, bar: _Bar) -> _TierOn:
        """The effects a running tier is judged by, from the evidence and the advised size."""
        size, effect_at = rec.kv_offloading_size_gib, ev.effect_at
        at_size = effect_at(size * GIB) if size is not None and effect_at is not None else None
        # Both sizes through the same model, so that its bias cancels in the difference.
        base = effect_at(ev.current_bytes) if ev.current_bytes and effect_at is not None else None
        return cls(
            now, size, at_size, base, ev.hit_ratio_now, ev.best_case_only, bar, ev.tier_below
        )

    @property
    def name(self) -> str:
        """What offloading is here: the CPU tier, or the CPU tier with a tier below it."""
        return "the CPU tier with the tier below" if self.tier_below else "the CPU tier"

    @property
    def hit(self) -> str:
        """The share of GPU-missed tokens the tier reloads, as the opening of a reason."""
        if self.hit_ratio is None:
            return ""
        if self.tier_below:
            return (
                f"{self.hit_ratio:.0%} of GPU-missed tokens reload through the CPU tier (from "
                "it or the tier below), but "
            )
        return f"{self.hit_ratio:.0%} of GPU-missed tokens reload from CPU, but "

    def change_to(self, target: Effect) -> Effect:
        """The change from the current tier to one with the target's effect."""
        ref = self.base or self.now
        return Effect(
            target.seconds - ref.seconds, target.low - ref.low, target.high - ref.high, target.parts
        )

    def predict(self, rec: Recommendation, change: Effect) -> None:
        """Set the advice's predicted TTFT change, unless only the best case is known."""
        if not self.best_case_only:
            rec.ttft_change_seconds = change.seconds
            rec.ttft_change_basis = "predicted"
            rec.ttft_change_range_seconds = [change.low, change.high]


def judge_ttft(
    rec: Recommendation, offloading: bool, ev: TtftEvidence, t: Thresholds
) -> Recommendation:
    """Re-decides by the TTFT the tier saves or costs (analysis.ttft), not by its hit ratio.

    `now`: the tier's effect here (offloading on). `effect_at(size in bytes)`: a sized tier's
    predicted effect against none. A change is advised only when the effect's range clears
    max(min_ttft_saving_seconds, min_ttft_saving_ratio × mean TTFT). `best_case_only`: `effect_at`
    can rule a tier out, not size its gain.
    """
    if rec.insufficient_data:
        return rec
    bar = _Bar(max(t.min_ttft_saving_seconds, t.min_ttft_saving_ratio * ev.mean_ttft))
    if not offloading:
        return _judge_off(rec, ev.effect_at, ev.best_case_only, bar.saves, bar.note)
    if ev.now is None:
        return rec
    tier = _TierOn.of(rec, ev, ev.now, bar)
    now, at_size, size = tier.now, tier.at_size, tier.size
    grow_pays = rec.action == "grow" and at_size is not None and bar.saves(at_size)
    if bar.costs(now) and not grow_pays:
        return decided(
            replace_advice(
                rec,
                "disable",
                [f"{tier.name} costs TTFT: {tier.hit}{effect_words(now)}: {bar.note(now)}"],
                ttft_change_seconds=-now.seconds,
                ttft_change_basis="measured",
                ttft_change_range_seconds=effect_range(now, -1.0),
            ),
            "estimate",
            "the effect's range is a cost",
        )
    if grow_pays and at_size is not None and not bar.saves(now):
        rec.reasons.append(
            f"too small to pay now ({bar.note(now)}), but a {size:g} GiB tier is predicted to "
            f"make {bar.note(at_size)}"
        )
        tier.predict(rec, tier.change_to(at_size))
        return decided(rec, "estimate", "the bigger tier's predicted range is a saving")
    if not bar.saves(now):
        return _judge_on_no_saving(rec, tier, t)
    return _judge_on_saving(rec, tier)


def _judge_on_no_saving(rec: Recommendation, tier: _TierOn, t: Thresholds) -> Recommendation:
    """Offloading on, no saving beyond the floor: grow a tier too small to show one, else judge it
    unmeasurable."""
    now, at_size = tier.now, tier.at_size
    barely_reloads = tier.hit_ratio is not None and tier.hit_ratio < t.low_reuse_ratio
    if rec.action == "grow" and barely_reloads and at_size is not None and at_size.seconds < 0:
        # A tier that reloads almost nothing cannot show an effect; the bigger one leans
        # to a saving, so grow and judge again there.
        rec.reasons.append(
            f"too small to show an effect now ({tier.bar.note(now)}); a {tier.size:g} GiB tier "
            f"is predicted to make {tier.bar.note(at_size)}"
        )
        tier.predict(rec, tier.change_to(at_size))
        return decided(rec, "estimate", "the bigger tier leans to a saving")
    return _judge_on_unmeasurable(rec, now, tier.hit, tier.bar.note)


def _judge_on_saving(rec: Recommendation, tier: _TierOn) -> Recommendation:
    """Offloading on, a saving beyond the floor: keep the tier and price a size change.

    Why: growing must again save beyond the range to be advised.
    """
    now, at_size, bar = tier.now, tier.at_size, tier.bar
    rec.reasons.append(
        f"{tier.name} pays: it saves at least {ms_text(-now.high)} per request "
        f"({bar.note(now)}: {effect_words(now)}); the other requests it spares a convoy of "
        "recomputes do not show on this server, so the saving may be larger"
    )
    if rec.action == "disable":
        rec.action, rec.kv_offloading_size_gib = "keep", None
        return decided(rec, "estimate", "the effect's range is a saving")
    if rec.action in ("grow", "shrink") and at_size is not None and tier.base is not None:
        change = tier.change_to(at_size)
        if rec.action == "grow" and not tier.best_case_only and not bar.saves(change):
            rec.reasons.append(
                f"growing to {tier.size:g} GiB would change mean TTFT by only "
                f"{change.seconds * 1000:+.0f} ms (range {change.low * 1000:+.0f} … "
                f"{change.high * 1000:+.0f}): keep the current size"
            )
            rec.action, rec.kv_offloading_size_gib = "keep", None
            return decided(rec, "estimate", "growing saves nothing beyond its range")
        tier.predict(rec, change)
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
            replace_advice(
                rec,
                "leave_off",
                [
                    f"even if every GPU-missed token reloaded from CPU, {effect_words(effect)}: "
                    f"{note(effect)}"
                ],
            ),
            "estimate",
            "not even the best case saves beyond its range",
        )
    if saves(effect):
        rec.ttft_change_seconds = effect.seconds
        rec.ttft_change_basis = "predicted"
        rec.ttft_change_range_seconds = effect_range(effect)
        rec.reasons.append(
            f"a {size:g} GiB tier is predicted to make {note(effect)}: {effect_words(effect)}"
        )
        return decided(rec, "estimate", "the predicted range is a saving")
    verdict = f"a {size:g} GiB tier would hit, but {effect_words(effect)}: predicted {note(effect)}"
    if effect.high >= 0 and effect.seconds < 0:
        verdict += "; " + _SETTLE.format(other="with the tier")
    return decided(
        replace_advice(rec, "leave_off", [verdict], within_noise=effect.low < 0 < effect.high),
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
        f"no measurable TTFT effect: {hit}{effect_words(now)}: {note(now)}; "
        + _SETTLE.format(other="without the tier")
    )
    if rec.action in ("store_threshold", "shrink"):
        rec.reasons.append(unmeasurable)
        return decided(rec, "estimate", "no measurable effect: the cheaper tier stands")
    if now.seconds >= 0 or rec.action == "disable":
        # No saving to show for it, while its costs are certain: pinned memory that cannot
        # swap, and every prompt block copied over PCIe.
        return decided(
            replace_advice(
                rec,
                "disable",
                [
                    unmeasurable,
                    "its costs are certain (pinned host memory, every computed block copied "
                    "out): disable it, or keep it only where a canary shows a saving",
                ],
                ttft_change_seconds=-now.seconds,
                ttft_change_basis="measured",
                ttft_change_range_seconds=effect_range(now, -1.0),
                within_noise=True,
            ),
            "estimate",
            "no measurable effect, and no saving in the estimate",
        )
    rec.reasons.append(unmeasurable + f"; the estimate leans to a saving ({ms_text(now.seconds)})")
    if rec.action == "grow":
        rec.action, rec.kv_offloading_size_gib = "keep", None
    return decided(rec, "estimate", "no measurable effect: what is there is kept")


def judge_ab(
    rec: Recommendation,
    offloading: bool,
    mean_ttft: float,
    ab: Effect,
    t: Thresholds,
    basis: str,
    seen: str,
) -> Recommendation:
    """Re-decides from a measured A/B (basis "replicas" or "before_after"), which outranks the
    estimate. An A/B within its noise says so and keeps the estimate's advice."""
    floor = max(t.min_ttft_saving_seconds, t.min_ttft_saving_ratio * mean_ttft)
    note = (
        f"with a tier, mean TTFT is {ms_text(ab.seconds)} "
        f"{'worse' if ab.seconds > 0 else 'better'} (range {ab.low * 1000:+.0f} … "
        f"{ab.high * 1000:+.0f} ms; a change needs ≥ {ms_text(floor)} saved beyond it)"
    )
    pays = ab.high < 0 and -ab.seconds >= floor
    costs = ab.low > 0
    what = (
        "the replicas' A/B"
        if basis == "replicas"
        else "this engine, before and after its tier changed,"
    )
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
            replace_advice(
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
            replace_advice(
                rec, "leave_off", [f"{what} shows a tier would not pay: {seen}: {note}"]
            ),
            basis,
            "the measured range is a cost",
        )
    size = rec.kv_offloading_size_gib if rec.action == "enable" else None
    tier = ab.parts.get("tier_bytes_per_engine")
    if size is None and tier:
        size = round_size_gib(tier)
    reasons = [f"{what} shows a tier pays: {seen}: {note}"]
    return decided(
        replace_advice(
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
