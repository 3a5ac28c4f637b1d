"""The CPU tier's two knobs, store_threshold and eviction, advised from their exact what-ifs.

Why: the TTFT model prices stores and lost hits alike. So a knob is advised only where the hits
it gives up were not worth their stores (docs/advisor.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvoffload.analysis.advice import Recommendation, decided
from kvoffload.analysis.signals import GIB
from kvoffload.analysis.ttft import Effect

# A threshold is worth its words only where it cuts the bytes stored by at least this share.
MIN_STORE_SAVING = 0.25
# ARC is advised where its hit ratio beats LRU's by at least this much at the size in question.
ARC_MARGIN = 0.02
# Actions that leave a tier running, where its knobs matter.
_WITH_A_TIER = ("keep", "grow", "shrink", "enable", "store_threshold")


@dataclass(frozen=True)
class Row:
    """One simulated tier: its hit ratio over the GPU-missed tokens and what it stored."""

    hit_ratio: float
    stored_bytes: float
    never_loaded_bytes: float


@dataclass(frozen=True)
class SizeRows:
    """The what-ifs at one tier size (per engine): per store_threshold N (LRU), and LRU/ARC."""

    cpu_gib: float
    thresholds: dict[int, Row]
    lru: Row | None
    arc: Row | None


@dataclass(frozen=True)
class TierRow:
    """A write-through tier below the CPU tier, replayed: hits with it and its share of them."""

    hit_ratio: float
    tier_hit_ratio: float
    tier_tokens_per_lookup: float
    written_bytes: float


@dataclass(frozen=True)
class WhatIfRows:
    """The what-if rows of one group by size name ("current", "advised")."""

    sizes: dict[str, SizeRows]
    tiers: dict[str, TierRow] = field(default_factory=dict)

    @classmethod
    def from_json(cls, whatif: object) -> WhatIfRows | None:
        """Typed rows from kvevents.whatif.WhatIf.to_json(); None when no row is usable."""
        if not isinstance(whatif, dict):
            return None
        sizes: dict[str, SizeRows] = {}
        for name in ("current", "advised"):
            thresholds = {
                int(str(r["store_threshold"])): row
                for r in _rows(whatif, "store_threshold")
                if r.get("size") == name and (row := _row(r)) is not None
            }
            policies = {
                str(r["policy"]): row
                for r in _rows(whatif, "eviction")
                if r.get("size") == name and (row := _row(r)) is not None
            }
            gib = next(
                (
                    float(str(r["cpu_gib"]))
                    for r in _rows(whatif, "store_threshold")
                    if r.get("size") == name
                ),
                None,
            )
            if gib is not None and (thresholds or policies):
                sizes[name] = SizeRows(gib, thresholds, policies.get("lru"), policies.get("arc"))
        tiers = {
            str(r["size"]): tier
            for r in _rows(whatif, "secondary_tier")
            if (tier := _tier_row(r)) is not None
        }
        return cls(sizes, tiers) if sizes or tiers else None

    def at(self, rec: Recommendation, offloading: bool) -> tuple[str, SizeRows] | None:
        """The rows at the size the advice leaves the tier: the advised size if the what-if ran
        there, else the current one."""
        size = rec.kv_offloading_size_gib
        advised = self.sizes.get("advised")
        if size is not None and advised is not None and abs(advised.cpu_gib - size) < 1e-6:
            return "advised", advised
        current = self.sizes.get("current")
        if size is None and offloading and current is not None:
            return "current", current
        return None


def _rows(whatif: dict[object, object], kind: str) -> list[dict[str, object]]:
    rows = whatif.get(kind)
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _row(r: dict[str, object]) -> Row | None:
    hit, stored, never = (
        r.get("cpu_hit_ratio"),
        r.get("stored_bytes"),
        r.get("stored_never_loaded_bytes"),
    )
    if r.get("omitted") or not all(isinstance(v, float | int) for v in (hit, stored, never)):
        return None
    return Row(float(str(hit)), float(str(stored)), float(str(never)))


def _tier_row(r: dict[str, object]) -> TierRow | None:
    names = ("cpu_hit_ratio", "tier_hit_ratio", "tier_tokens_per_lookup", "tier_written_bytes")
    values = [r.get(n) for n in names]
    if r.get("omitted") or not all(isinstance(v, float | int) for v in values):
        return None
    return TierRow(*(float(str(v)) for v in values))


EffectWith = Callable[[float, float], Effect | None]


def judge_knobs(
    rec: Recommendation,
    offloading: bool,
    rows: WhatIfRows,
    effect_with: EffectWith | None,
) -> Recommendation:
    """Adds store_threshold and eviction_policy where their what-ifs pay at the size the advice
    leaves. The action becomes store_threshold where it was keep."""
    if rec.insufficient_data or effect_with is None or rec.action not in _WITH_A_TIER:
        return rec
    picked = rows.at(rec, offloading)
    if picked is None:
        return rec
    name, at = picked
    config: dict[str, object] = {}
    threshold = _best_threshold(at, effect_with)
    if threshold is not None:
        n, row, change = threshold
        base = at.thresholds[1]
        config["store_threshold"] = n
        rec.reasons.append(
            f'set "store_threshold": {n} in kv_connector_extra_config: at the {name} size '
            f"({at.cpu_gib:.2f} GiB) it stores {row.stored_bytes / GIB:.2f} GiB instead of "
            f"{base.stored_bytes / GIB:.2f} GiB ({1 - row.stored_bytes / base.stored_bytes:.0%} "
            f"less over PCIe; never reloaded {base.never_loaded_bytes / GIB:.2f} → "
            f"{row.never_loaded_bytes / GIB:.2f} GiB), hit ratio {base.hit_ratio:.3f} → "
            f"{row.hit_ratio:.3f}, mean TTFT {_change_words(change)} (exact what-if over the "
            "KV events, priced by the TTFT model)"
        )
        if rec.action == "keep":
            rec.action = "store_threshold"
    arc = _arc_pays(at, effect_with)
    if arc is not None:
        config["eviction_policy"] = "arc"
        assert at.lru is not None and at.arc is not None
        rec.reasons.append(
            f'set "eviction_policy": "arc" in kv_connector_extra_config: at the {name} size '
            f"({at.cpu_gib:.2f} GiB) ARC's hit ratio {at.arc.hit_ratio:.3f} beats LRU's "
            f"{at.lru.hit_ratio:.3f} (by ≥ {ARC_MARGIN:g}), mean TTFT {_change_words(arc)}"
        )
    if not config:
        return rec
    rec.kv_connector_extra_config = config
    return decided(rec, "knobs", ", ".join(f"{k}: {v}" for k, v in config.items()))


def _change(effect_with: EffectWith, row: Row, base: Row) -> Effect | None:
    """The TTFT change of `row`'s tier against `base`'s, through one model so its bias cancels."""
    share = row.stored_bytes / base.stored_bytes if base.stored_bytes > 0 else 1.0
    after, before = effect_with(row.hit_ratio, share), effect_with(base.hit_ratio, 1.0)
    if after is None or before is None:
        return None
    return Effect(
        after.seconds - before.seconds,
        after.low - before.low,
        after.high - before.high,
        after.parts,
    )


def _best_threshold(at: SizeRows, effect_with: EffectWith) -> tuple[int, Row, Effect] | None:
    """The threshold with the best modelled TTFT among those cutting stored bytes by
    MIN_STORE_SAVING and losing no TTFT. Ties go to fewer bytes stored."""
    base = at.thresholds.get(1)
    if base is None or base.stored_bytes <= 0:
        return None
    best: tuple[int, Row, Effect] | None = None
    for n in sorted(at.thresholds):
        row = at.thresholds[n]
        if n == 1 or row.stored_bytes > (1 - MIN_STORE_SAVING) * base.stored_bytes:
            continue
        change = _change(effect_with, row, base)
        if change is None or change.seconds > 0:
            continue
        rank = (change.seconds, row.stored_bytes)
        if best is None or rank < (best[2].seconds, best[1].stored_bytes):
            best = (n, row, change)
    return best


def _arc_pays(at: SizeRows, effect_with: EffectWith) -> Effect | None:
    """ARC's TTFT change against LRU where it wins by ARC_MARGIN and loses no TTFT."""
    if at.lru is None or at.arc is None or at.arc.hit_ratio < at.lru.hit_ratio + ARC_MARGIN:
        return None
    change = _change(effect_with, at.arc, at.lru)
    return change if change is not None and change.seconds <= 0 else None


def _change_words(change: Effect) -> str:
    return (
        f"{change.seconds * 1000:+.1f} ms (range {change.low * 1000:+.1f} … "
        f"{change.high * 1000:+.1f} ms)"
    )
