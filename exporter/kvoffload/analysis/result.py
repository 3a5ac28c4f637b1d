"""The typed analysis of one (instance, model_name) group: what `analysis` produces and every output
consumes.

Its `to_json()` is the contract of `analyze --json` and `/api/v1/status` (docs/metrics.md). Code
reads the typed fields, never untyped dicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvoffload.analysis.advisor import Evidence, Recommendation

if TYPE_CHECKING:
    from kvoffload.analysis.beforeafter import BeforeAfter
    from kvoffload.analysis.intervals import Coefficient
    from kvoffload.analysis.ttft import Effect

JsonObject = dict[str, object]
# The one figure the TTFT model fills (analyze.py), not signals.compute_figures: the tier's
# effect now, also exported with its range as kvoffload_offload_ttft_effect_seconds.
TTFT_EFFECT_FIGURE = "offload_ttft_effect_seconds"


@dataclass
class TtftVerdict:
    """The TTFT the group measured and the tier's effect on it (kvoffload.analysis.ttft)."""

    mean_ttft_seconds: float
    mean_queue_seconds: float
    mean_prefill_seconds: float
    requests: float
    prompt_tokens_per_request: float
    marginal_recompute_seconds_per_token: Coefficient | None
    now: Effect | None  # the tier's effect now (offloading on)
    predicted: Effect | None  # a tier at `predicted_size_gib` (the recommended size)
    predicted_size_gib: float | None = None
    replicas: Effect | None = None  # replicas with vs without a tier (kvoffload.analysis.replicas)
    before_after: BeforeAfter | None = None  # this engine across a tier change (beforeafter)

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "mean_ttft_seconds": self.mean_ttft_seconds,
            "mean_queue_seconds": self.mean_queue_seconds,
            "mean_prefill_seconds": self.mean_prefill_seconds,
            "requests": self.requests,
            "prompt_tokens_per_request": self.prompt_tokens_per_request,
            "marginal_recompute_seconds_per_token": (
                dict(cost.to_json())
                if (cost := self.marginal_recompute_seconds_per_token) is not None
                else None
            ),
            "now": self.now.to_json() if self.now is not None else None,
            "predicted": (
                {"kv_offloading_size_gib": self.predicted_size_gib, **self.predicted.to_json()}
                if self.predicted is not None
                else None
            ),
        }
        if self.replicas is not None:
            out["replicas"] = self.replicas.to_json()
        if self.before_after is not None:
            out["before_after"] = self.before_after.to_json()
        return out


@dataclass(frozen=True)
class ReuseHistogram:
    """GPU-missed prompt tokens by LRU reuse distance in bytes, cumulative.

    The bucket at `le` counts what a tier of that size per engine would serve (`le` = inf: all).
    Its `sum_bytes` is Σ distance × tokens.
    """

    buckets: tuple[tuple[float, float], ...]
    sum_bytes: float


@dataclass
class GroupAnalysis:
    instance: str
    model_name: str
    offloading: bool
    window_seconds: float
    naming: str | None
    engines: list[str]
    figures: dict[str, float | None]
    recommendation: Recommendation
    ttft: TtftVerdict | None = None
    # With KV events: the exact figures (EventEvidence's JSON), the curve, the predicted hit
    # ratio at the advised (else current) size and the reuse-distance histogram.
    kv_events: JsonObject | None = None
    curve: list[dict[str, float]] | None = None
    predicted_offload_hit_ratio: float | None = None
    reuse_histogram: ReuseHistogram | None = None
    # Set by the sidecar: figures of a target it cannot read any more describe the past.
    stale: bool | None = None
    # Each secondary tier's figures by tier label (signals.per_tier_figures); None without tiers.
    tiers: dict[str, dict[str, float | None]] | None = None
    # Everything the advice was decided from (analysis.advisor.decide); not in the JSON.
    evidence: Evidence | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.instance, self.model_name)

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "labels": {"model_name": self.model_name, "instance": self.instance},
            "offloading": self.offloading,
            "window_seconds": self.window_seconds,
            "naming": self.naming,
            "engines": self.engines,
            "figures": self.figures,
            "recommendation": self.recommendation.to_json(),
        }
        if self.kv_events is not None:
            out["kv_events"] = self.kv_events
            if self.curve is not None:
                out["curve"] = self.curve
                out["predicted_offload_hit_ratio"] = self.predicted_offload_hit_ratio
        if self.ttft is not None:
            out["ttft"] = self.ttft.to_json()
        if self.stale is not None:
            out["stale"] = self.stale
        if self.tiers:
            out["tiers"] = self.tiers
        return out
