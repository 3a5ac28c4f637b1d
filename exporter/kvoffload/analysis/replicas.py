"""Replicas A/B: replicas of one model with and without a CPU tier, compared directly.

Why: where such replicas see comparable load, their measured TTFT difference outranks the
estimate (`ttft_change_basis` = "replicas").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvoffload.analysis.ttft import Effect

if TYPE_CHECKING:
    from kvoffload.analysis.result import GroupAnalysis

# Comparable: prompt tokens per request within 25% and request rates within 1.5× of the other
# pool; the same engine kind is assumed.
_PROMPT_SPREAD = 0.25
_RATE_SPREAD = 1.5
# The A/B's range: the spread of the replicas' means, never under 20% of the difference nor
# 2 ms (one replica a side gives no spread to measure).
_MIN_REL_RANGE = 0.2
_MIN_RANGE_SECONDS = 0.002


@dataclass(frozen=True)
class Replica:
    key: tuple[str, str]  # (instance, model_name)
    offloading: bool
    mean_ttft: float
    requests: float
    rate: float  # requests per second
    prompt_tokens: float  # per request
    tier_bytes: float | None  # CPU tier per engine (offloading on)


def replica(group: GroupAnalysis) -> Replica | None:
    verdict = group.ttft
    window = group.window_seconds
    if verdict is None or window <= 0 or group.recommendation.insufficient_data or group.stale:
        return None
    capacity = group.figures.get("cpu_capacity_bytes")
    engines = max(len(group.engines), 1)
    return Replica(
        group.key,
        group.offloading,
        verdict.mean_ttft_seconds,
        verdict.requests,
        verdict.requests / window,
        verdict.prompt_tokens_per_request,
        capacity / engines if capacity else None,
    )


def _pool_mean(pool: list[Replica]) -> tuple[float, float]:
    """Request-weighted mean TTFT of a pool, and the standard error across its replicas."""
    n = sum(r.requests for r in pool)
    mean = sum(r.mean_ttft * r.requests for r in pool) / n
    if len(pool) < 2:
        return mean, 0.0
    var = sum((r.mean_ttft - mean) ** 2 for r in pool) / (len(pool) - 1)
    return mean, math.sqrt(var / len(pool))


def _comparable(one: Replica, pool: list[Replica]) -> list[Replica]:
    return [
        r
        for r in pool
        if abs(r.prompt_tokens - one.prompt_tokens) <= _PROMPT_SPREAD * one.prompt_tokens
        and 1 / _RATE_SPREAD <= r.rate / one.rate <= _RATE_SPREAD
    ]


def replica_effects(groups: list[GroupAnalysis]) -> dict[tuple[str, str], Effect]:
    """Per replica: the mean TTFT change per request a tier causes (negative = faster). Compared
    against comparable replicas on the other side."""
    replicas = [r for r in (replica(g) for g in groups) if r is not None]
    # Each side of each model, in the replicas' order: the replicas of one model are not compared
    # replica by replica against every other (1,000 replicas would be a million checks).
    sides: dict[tuple[str, bool], list[Replica]] = {}
    for r in replicas:
        sides.setdefault((r.key[1], r.offloading), []).append(r)
    out: dict[tuple[str, str], Effect] = {}
    for one in replicas:
        others = _comparable(one, sides.get((one.key[1], not one.offloading), []))
        if not others:
            continue
        other, spread = _pool_mean(others)
        seconds = one.mean_ttft - other if one.offloading else other - one.mean_ttft
        half = max(2 * spread, _MIN_REL_RANGE * abs(seconds), _MIN_RANGE_SECONDS)
        parts = {"replicas_compared": float(len(others)), "other_mean_ttft_seconds": other}
        tiers = sorted(r.tier_bytes for r in others if r.tier_bytes)
        if tiers:  # what the replicas with a tier run (per engine): a size to enable with
            parts["tier_bytes_per_engine"] = tiers[len(tiers) // 2]
        out[one.key] = Effect(seconds, seconds - half, seconds + half, parts)
    return out
