"""The advice's value and words: a Recommendation, the actions, the sizes an operator types.

Why: the deciding rules and the advice's readers share one shape and one way of writing numbers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from kvoffload.analysis.signals import GIB
from kvoffload.analysis.ttft import Effect

ACTIONS = ("enable", "leave_off", "keep", "grow", "shrink", "store_threshold", "disable")


@dataclass
class Recommendation:
    action: str
    kv_offloading_size_gib: float | None = None
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    evidence: dict[str, float | None] = field(default_factory=dict)
    # Predicted mean TTFT change per request if applied, relative to now (negative = faster);
    # None for keep / leave_off. Basis: measured | predicted | replicas | before_after.
    ttft_change_seconds: float | None = None
    ttft_change_basis: str | None = None
    ttft_change_range_seconds: list[float] | None = None
    # Set when the advice could not be judged (too little data): the verdict leaves it alone.
    insufficient_data: bool = False
    # Which rule decided (counters < curve < estimate < replicas / before_after, each able to
    # overrule the ones before it) and the steps that led there, with their evidence.
    decided_by: str = "counters"
    trace: list[dict[str, object]] = field(default_factory=list)
    # Set by the sidecar's stability rules (analysis.stability): the data time since which this
    # action and size stand, and a newer advice still waiting out its dwell time.
    since: float | None = None
    pending: dict[str, object] | None = None
    # The TTFT range straddles zero: this advice is what the other costs say, not a measured
    # effect, so it does not overturn a published one (the stability rules' hysteresis).
    within_noise: bool = False
    # What to put in --kv-transfer-config's kv_connector_extra_config (analysis.knobs):
    # store_threshold and eviction_policy where their what-ifs pay; None where neither does.
    kv_connector_extra_config: dict[str, object] | None = None
    # Whether the tiers below the CPU pay (analysis.tiering): pays (true, false or null where
    # the window cannot tell) and the seconds per token it compared; None without such a tier.
    secondary_tier: dict[str, object] | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def round_size_gib(size_bytes: float) -> float:
    """Round up to a step an operator would type: 0.25 GiB below 4, 1 below 32, else 4."""
    gib = size_bytes / GIB
    step = 0.25 if gib < 4 else 1.0 if gib < 32 else 4.0
    return max(step, math.ceil(gib / step - 1e-9) * step)


def fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}{unit}"


def gib_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value / GIB:.2f} GiB"


def ms_text(seconds: float) -> str:
    return f"{abs(seconds) * 1000:.0f} ms"


def effect_words(effect: Effect) -> str:
    parts = effect.parts
    wait = ms_text(parts["reload_wait_seconds"])
    recompute = (
        f"recomputing the {parts['reloaded_tokens_per_request']:.0f} reloaded tokens per request "
        f"would cost ~{ms_text(parts['recompute_saved_seconds'])}"
        if parts.get("compute_seconds_per_token")
        else f"recomputing the {parts['reloaded_tokens_per_request']:.0f} reloaded tokens per "
        "request costs nothing this server can measure"
    )
    return (
        f"a reloaded request waits for the asynchronous load (~{wait} per request), the offload "
        f"path's stores stall others by ~{ms_text(parts['store_seconds'])}, and {recompute}"
    )


def effect_range(effect: Effect, sign: float = 1.0) -> list[float]:
    low, high = sorted((sign * effect.low, sign * effect.high))
    return [low, high]


def decided(rec: Recommendation, stage: str, why: str) -> Recommendation:
    """Note in the trace that `stage` decided (or confirmed) the advice, and why."""
    rec.decided_by = stage
    rec.trace.append(
        {
            "stage": stage,
            "action": rec.action,
            "kv_offloading_size_gib": rec.kv_offloading_size_gib,
            "why": why,
        }
    )
    return rec


def replace_advice(
    rec: Recommendation, action: str, reasons: list[str], **kw: object
) -> Recommendation:
    """A new advice that keeps the earlier one's warnings, evidence and trace."""
    new = Recommendation(action, reasons=reasons, warnings=rec.warnings, evidence=rec.evidence)
    new.trace = rec.trace
    for key, value in kw.items():
        setattr(new, key, value)
    return new
