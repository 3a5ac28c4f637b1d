"""The store_threshold and eviction advice (analysis.knobs) from the what-if rows and the TTFT
model: named with its numbers where it saves bytes without losing TTFT, and never where it loses."""

from __future__ import annotations

from kvoffload.analysis import ttft
from kvoffload.analysis.advisor import (
    GIB,
    Counters,
    Evidence,
    Recommendation,
    TtftEvidence,
    decide,
)
from kvoffload.analysis.analyze import ttft_constants
from kvoffload.analysis.intervals import Coefficient
from kvoffload.analysis.knobs import WhatIfRows
from kvoffload.thresholds import Thresholds

from helpers import PAYING_FIGURES

# A paying tier on the counters, its hit ratio left to each case.
FIGURES = {k: v for k, v in PAYING_FIGURES.items() if k != "offload_hit_ratio"}


def observed(mean_queue: float = 0.004) -> ttft.Observed:
    """A tier-on server bound by per-step overhead (its stores stall others), 1,000 GPU-missed
    tokens per request of which half reload; `mean_queue`: the reload wait it measured."""
    return ttft.Observed(
        requests=2000.0, seconds=600.0, mean_ttft=0.1, mean_queue=mean_queue,
        mean_prefill=0.05, prompt_tokens=1500.0, computed_tokens=500.0, loaded_tokens=500.0,
        loads=1.0, load_seconds_per_job=0.002, bytes_per_token=16_384.0, capacity_queue=0.0,
        in_system=3.0, step_seconds=0.02, tokens_per_step=300.0,
        cost=Coefficient(40e-6, 1e-6, 60),
    )  # fmt: skip


def rows(thresholds: dict[int, tuple[float, float, float]], lru: float, arc: float) -> dict:
    """What-if JSON (kvevents.whatif) at the current 4 GiB: per N (hit, stored GiB, never
    reloaded GiB), and the LRU and ARC hit ratios."""

    def row(hit: float, stored: float, never: float) -> dict[str, object]:
        return {"cpu_gib": 4.0, "omitted": False, "cpu_hit_ratio": hit,
                "stored_bytes": stored * GIB, "stored_never_loaded_bytes": never * GIB}  # fmt: skip

    return {
        "store_threshold": [
            {"size": "current", "store_threshold": n, **row(*v)} for n, v in thresholds.items()
        ],
        "eviction": [
            {"policy": p, "size": "current", **row(h, 10.0, 5.0)}
            for p, h in (("lru", lru), ("arc", arc))
        ],
    }


def advice(whatif: dict, obs: ttft.Observed | None = None) -> Recommendation:
    """The advice on the counters, the TTFT model over `obs` and the what-if rows."""
    obs = obs or observed()
    k = ttft_constants(Thresholds())

    def effect_with(hit_ratio: float, stored_share: float) -> ttft.Effect | None:
        return ttft.predict(obs, hit_ratio * obs.missed_tokens, k, stored_share)

    now = ttft.effect_now(obs, k)
    evidence = TtftEvidence(0.1, now, lambda size: now, 0.5, effect_with=effect_with)
    counters = Counters(FIGURES, True, 3600, prompt_tokens=1e6)
    return decide(Evidence(counters, ttft=evidence, whatif=WhatIfRows.from_json(whatif)))


def test_a_threshold_that_keeps_the_hits_is_advised_with_its_numbers() -> None:
    # One-off prompts beside a hot set: N = 2 stores a third of the bytes, keeps almost every hit.
    rec = advice(
        rows(
            {1: (0.5, 30.0, 20.0), 2: (0.49, 10.0, 0.5), 3: (0.3, 8.0, 0.2), 4: (0.2, 7.0, 0.1)},
            0.5,
            0.5,
        )
    )
    assert rec.action == "store_threshold"
    assert rec.kv_connector_extra_config == {"store_threshold": 2}
    (why,) = [r for r in rec.reasons if "store_threshold" in r]
    assert "stores 10.00 GiB instead of 30.00 GiB (67% less" in why
    assert "hit ratio 0.500 → 0.490" in why and "never reloaded 20.00 → 0.50 GiB" in why
    assert rec.decided_by == "knobs"


def test_a_threshold_that_loses_the_hits_is_not_advised() -> None:
    # vLLM sights only up to the first absent block: long prefixes take many requests to store.
    rec = advice(rows({1: (0.9, 30.0, 2.0), 2: (0.1, 3.0, 0.1)}, 0.9, 0.9))
    assert rec.action == "keep" and rec.kv_connector_extra_config is None
    assert not any("store_threshold" in r for r in rec.reasons)


def test_arc_is_advised_only_where_it_wins_by_the_margin() -> None:
    rec = advice(rows({1: (0.4, 30.0, 20.0)}, 0.40, 0.47))
    assert rec.action == "keep"
    assert rec.kv_connector_extra_config == {"eviction_policy": "arc"}
    assert any("ARC's hit ratio 0.470 beats LRU's 0.400" in r for r in rec.reasons)
    assert advice(rows({1: (0.4, 30.0, 20.0)}, 0.40, 0.41)).kv_connector_extra_config is None


def test_arc_that_would_cost_ttft_is_not_advised() -> None:
    # Where a reload waits longer than its recompute saves, more hits cost TTFT: no ARC.
    rec = advice(rows({1: (0.4, 30.0, 20.0)}, 0.40, 0.47), observed(mean_queue=0.2))
    assert rec.action == "disable" and rec.kv_connector_extra_config is None
    assert not any("arc" in r for r in rec.reasons)
