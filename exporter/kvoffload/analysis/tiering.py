"""Whether a secondary tier below the CPU tier pays, from a window's figures alone.

A secondary-tier hit goes through the CPU tier to the GPU. So it pays only where the CPU tier misses
what it finds and the reload beats recompute. The advisor decides what to do with the verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvoffload.analysis.knobs import TierRow

# Below this share of its lookups found, a secondary tier serves too little to be worth its
# cascades (every chunk stored into the CPU tier is also written below it).
MIN_HIT_RATIO = 0.05
# A CPU tier that finds this share of its lookups leaves the secondary tier nothing to serve.
PRIMARY_ALL_HITS = 0.99


@dataclass(frozen=True)
class TierVerdict:
    """pays: True, False, or None where the window cannot tell. reasons: one sentence each, with
    numbers."""

    pays: bool | None
    reasons: list[str] = field(default_factory=list)
    # Seconds per token by the secondary tier (read + CPU-to-GPU load) and by recompute.
    tier_seconds_per_token: float | None = None
    recompute_seconds_per_token: float | None = None


def has_secondary_tier(figures: Mapping[str, float | None]) -> bool:
    """Whether the window shows a tier below the CPU tier (its hits, or its lookups' delays).

    Why: vLLM 0.26.0 exports no per-tier hits, only the lookup delays of its tiering manager.
    """
    return (
        figures.get("tier_hit_ratio") is not None
        or figures.get("tier_lookup_wait_seconds") is not None
    )


def _per_token(gbps: float | None, bytes_per_token: float | None) -> float | None:
    """Seconds to move one token's KV at `gbps` GB/s (None when either is unknown or 0)."""
    if not gbps or not bytes_per_token or gbps <= 0 or bytes_per_token <= 0:
        return None
    return bytes_per_token / (gbps * 1e9)


def _speed(figures: Mapping[str, float | None]) -> tuple[float | None, float | None]:
    """(seconds per token through the secondary tier, seconds per token recomputed)."""
    per_token = figures.get("kv_bytes_per_token")
    read = _per_token(figures.get("tier_read_gbps"), per_token)
    load = _per_token(figures.get("load_gbps"), per_token)
    recompute_tps = figures.get("recompute_tokens_per_second")
    recompute = 1.0 / recompute_tps if recompute_tps and recompute_tps > 0 else None
    tier = read + load if read is not None and load is not None else None
    return tier, recompute


def _failures(figures: Mapping[str, float | None]) -> list[str]:
    """A sentence per kind of failed or dropped promotion seen in the window."""
    out = []
    dropped = figures.get("promotion_allocation_failures_per_second") or 0.0
    if dropped > 0:
        out.append(
            f"{dropped:.3g} promotions/s were dropped for want of a free CPU-tier slot: "
            "the CPU tier is too small to stage what the secondary tier finds"
        )
    failed = figures.get("tier_promotion_failures_per_second") or 0.0
    if failed > 0:
        out.append(f"{failed:.3g} promotion jobs/s failed (read errors below the CPU tier)")
    return out


def secondary_tier_verdict(
    figures: Mapping[str, float | None],
    min_hit_ratio: float = MIN_HIT_RATIO,
    recompute_seconds_per_token: float | None = None,
    replayed: TierRow | None = None,
) -> TierVerdict:
    """Whether the secondary tiers pay over the window of `figures` (signals.compute_figures).

    `recompute_seconds_per_token` overrides the prefill throughput's cost per token (e.g. the TTFT
    fit's); `replayed` is the KV-event replay of an fs tier, used where vLLM exports no tier hits.
    """
    hit = figures.get("tier_hit_ratio")
    tier_s, recompute_s = _speed(figures)
    if recompute_seconds_per_token is not None and recompute_seconds_per_token > 0:
        recompute_s = recompute_seconds_per_token
    if hit is None:
        return _by_replay(figures, replayed, recompute_s)
    reasons = _failures(figures)
    pays: bool | None = True
    primary = figures.get("primary_tier_hit_ratio")
    if primary is not None and primary >= PRIMARY_ALL_HITS:
        pays = False
        reasons.insert(
            0,
            f"the CPU tier finds {primary:.1%} of its lookups: it misses too little for a "
            "tier below it to serve",
        )
    if hit < min_hit_ratio:
        pays = False
        reasons.insert(
            0,
            f"the secondary tiers find {hit:.1%} of the chunks looked up there (under "
            f"{min_hit_ratio:.0%}): their cascades cost more than their hits return",
        )
    if tier_s is None or recompute_s is None:
        reasons.append(
            "no read bandwidth, load bandwidth or recompute rate in the window: "
            "cannot compare a promoted token with a recomputed one"
        )
        return TierVerdict(None if pays else pays, reasons, tier_s, recompute_s)
    if tier_s >= recompute_s:
        pays = False
        reasons.insert(
            0,
            f"a token through the secondary tier takes {tier_s * 1e6:.3g} µs (read, then "
            f"load to the GPU), recomputing it {recompute_s * 1e6:.3g} µs: recompute wins",
        )
    elif pays:
        reasons.insert(
            0,
            f"the secondary tiers find {hit:.1%} of the chunks the CPU tier missed, and a "
            f"token through them takes {tier_s * 1e6:.3g} µs against {recompute_s * 1e6:.3g} "
            "µs to recompute it",
        )
    return TierVerdict(pays, reasons, tier_s, recompute_s)


def _by_replay(
    figures: Mapping[str, float | None], replayed: TierRow | None, recompute_s: float | None
) -> TierVerdict:
    """The verdict without per-tier hits: the replay's tokens against the lookups' wait.

    Why: vLLM 0.26.0 exports the wait only, so the return comes from the KV events or nowhere.
    """
    wait = figures.get("tier_lookup_wait_seconds")
    per_token = figures.get("kv_bytes_per_token")
    load_s = _per_token(figures.get("load_gbps"), per_token)
    if replayed is None or wait is None or not per_token or load_s is None or not recompute_s:
        return TierVerdict(None, [_without_hits(figures)], None, recompute_s)
    tokens = replayed.tier_tokens_per_lookup
    found = (
        f"the KV-event replay finds {replayed.tier_hit_ratio:.1%} of the GPU-missed tokens "
        f"only in the tier below ({tokens:.3g} tokens a lookup)"
    )
    best = tokens * (recompute_s - load_s)  # what its tokens save if read in no time
    if best <= wait:
        return TierVerdict(
            False,
            [
                f"{found}: read in no time they would save {best * 1e3:.3g} ms a request, "
                f"less than the {wait * 1e3:.3g} ms its lookups make one wait"
            ],
            None,
            recompute_s,
        )
    # Read faster than this, the tier's tokens save more than its lookups cost.
    gbps = per_token / (recompute_s - load_s - wait / tokens) / 1e9
    return TierVerdict(
        None,
        [
            f"{found}, and its lookups make a request wait {wait * 1e3:.3g} ms: it pays only if "
            f"it reads above {gbps:.3g} GB/s; this vLLM exports no tier read speed, so compare "
            "a replica without it"
        ],
        None,
        recompute_s,
    )


def _without_hits(figures: Mapping[str, float | None]) -> str:
    """Why there is no verdict without per-tier hits, with the lookup wait where exported.

    The tiering spec of vLLM 0.26.0 exports lookup delays but no per-tier hits. So the wait shows
    cost, not return.
    """
    wait = figures.get("tier_lookup_wait_seconds")
    if wait is None:
        return "no secondary tier was looked up in the window"
    return (
        f"secondary-tier lookups make a request wait {wait * 1e3:.3g} ms on average (time to "
        "first token they add), but this vLLM exports no per-tier hits (0.26.0 has only the "
        "lookup delays): to tell whether the tier pays, compare a replica without it, or run a "
        "vLLM with the per-tier series"
    )
