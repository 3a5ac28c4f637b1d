"""The TTFT verdict: what the CPU tier does to mean time-to-first-token, now or at another size.

Hit ratio is not payoff. Measured on real vLLM 0.26.0 (H200, docs/advisor.md): a request whose
prefix is reloaded from CPU waits for the asynchronous load — it is scheduled again only about
one engine step later, and that wait lands in vLLM's queue time (0.02 ms → 10–17 ms per request)
— while the prefill it saves is worth tens of ms on an 8B model and a few ms on a 0.6B one. The
model, per request, with x = tokens reloaded from CPU:

    effect = L · W  +  store  −  x · β
    L      reloads per request (load jobs ÷ requests; predicted: x ÷ tokens per reload)
    W      the wait of one reload: measured as queue time ÷ reloads (all of the queue time is the
           tier's: without one vLLM queued 0.02 ms); predicted as one prefill
           step of this engine (its mean prefill time), plus the store cost, less the saving
    store  the offload path's cost on the critical path: bytes stored per request ÷
           `store_critical_bytes_per_second` (every computed block is copied out)
    β      the marginal TTFT of one recomputed token, fitted over scrape intervals
           (kvoffload.analysis.intervals): batching, queueing and step overhead included; shrunk by
           its noise and × κ = 1.5, local to global (a tier changes every request at once)

Negative = faster with the tier. Every estimate carries a range: β ± 2 standard errors with κ
from 1 to 2, the store term ± 50%, a predicted wait ± 30%.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvoffload.analysis.intervals import Coefficient, marginal_recompute_cost
from kvoffload.analysis.signals import Context, loaded_tokens

# β is fitted on local variation (one interval recomputes more than the next); a tier changes
# every request at once, and the engine's queueing feeds that back: on real vLLM the TTFT
# moved 1.0–1.8× as much per token between servers as within one (docs/advisor.md).
_GLOBAL_FACTOR = 1.5
_GLOBAL_RANGE = (1.0, 2.0)
# Ranges on the assumed parts of the model (docs/advisor.md).
_STORE_SPREAD = 0.5
_WAIT_SPREAD = 0.3
# A predicted wait is never below this share of a prefill step (a reload waits ≥ one step).
_MIN_WAIT_STEPS = 0.5


@dataclass(frozen=True)
class Observed:
    """What the window shows, per request (one TTFT observation each)."""

    requests: float
    mean_ttft: float
    mean_queue: float
    mean_prefill: float
    prompt_tokens: float
    computed_tokens: float  # prompt tokens recomputed on the GPU
    loaded_tokens: float  # prompt tokens reloaded from the CPU tier
    loads: float  # load jobs per request
    stored_bytes: float | None  # bytes copied to the CPU tier per request (offloading on)
    bytes_per_token: float | None
    waiting_for_capacity: float
    cost: Coefficient | None  # β: TTFT per recomputed token (kvoffload.analysis.intervals)

    @property
    def missed_tokens(self) -> float:
        """GPU-missed prompt tokens per request: recomputed or reloaded."""
        return self.computed_tokens + self.loaded_tokens


def observe(ctx: Context, bytes_per_token: float | None) -> Observed | None:
    """None when the window holds no finished request (nothing to judge by)."""
    n = ctx.inc("ttft_count")
    if n <= 0 or not ctx.has("ttft_sum"):
        return None
    queue_n = ctx.inc("queue_time_count") or n
    prefill_n = ctx.inc("prefill_time_count") or n
    on = ctx.static.offload_families
    return Observed(
        requests=n,
        mean_ttft=ctx.inc("ttft_sum") / n,
        mean_queue=ctx.inc("queue_time_sum") / queue_n,
        mean_prefill=ctx.inc("prefill_time_sum") / prefill_n,
        prompt_tokens=ctx.inc("prompt_tokens") / n,
        computed_tokens=ctx.inc("src_local_compute") / n,
        loaded_tokens=loaded_tokens(ctx) / n if on else 0.0,
        loads=ctx.inc("load_jobs") / n if on else 0.0,
        stored_bytes=ctx.inc("store_bytes") / n if on else None,
        bytes_per_token=bytes_per_token,
        waiting_for_capacity=ctx.delta.gauge_avg.get("waiting_capacity", 0.0),
        cost=marginal_recompute_cost(ctx.delta.fit),
    )


@dataclass
class Effect:
    """A TTFT change per request (seconds, negative = faster) with its range and parts."""

    seconds: float
    low: float
    high: float
    parts: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "range_seconds": [self.low, self.high],
            "parts": self.parts,
        }


def _beta(obs: Observed, fallback_rate: float | None) -> tuple[float, float, float] | None:
    """(point, low, high) of the marginal TTFT per recomputed token. Without a fit, one
    request's own recompute at the window's token rate, with a range of half to twice it."""
    if obs.cost is not None:
        low, high = obs.cost.bounds()
        return (obs.cost.shrunk() * _GLOBAL_FACTOR, low * _GLOBAL_RANGE[0], high * _GLOBAL_RANGE[1])
    if fallback_rate:
        per_token = 1.0 / fallback_rate
        return per_token, 0.5 * per_token, 2 * per_token
    return None


def _store_seconds(obs: Observed, stored_bytes: float | None, rate: float, beta: float) -> float:
    """The offload path copies every computed block out; that work sits on the critical path
    of an engine bound by per-step overhead (eager, small models: on real vLLM the prefill got
    8–12 ms slower with a tier while recomputing less) and hides behind compute on one bound
    by arithmetic. Weight: the share of the prefill time that recomputing the GPU-missed tokens
    does not explain."""
    if not stored_bytes or rate <= 0:
        return 0.0
    # Without a tier every GPU-missed token is recomputed: the share of the prefill that
    # recomputing them would explain.
    explained = beta * obs.missed_tokens / obs.mean_prefill if obs.mean_prefill > 0 else 0.0
    return stored_bytes / rate * min(max(1.0 - explained, 0.0), 1.0)


def _effect(
    reloads: float,
    wait: float,
    wait_spread: float,
    store: float,
    x: float,
    beta: tuple[float, float, float],
    loads: float,
) -> Effect:
    """effect = reloads · wait + store − x · β, and its range (module docstring)."""
    point, b_low, b_high = beta
    waited = reloads * wait
    return Effect(
        waited + store - x * point,
        waited * (1 - wait_spread) + store * (1 - _STORE_SPREAD) - x * b_high,
        waited * (1 + wait_spread) + store * (1 + _STORE_SPREAD) - x * b_low,
        {
            "reload_wait_seconds": waited,
            "store_seconds": store,
            "recompute_saved_seconds": x * point,
            "reloads_per_request": loads,
            "reloaded_tokens_per_request": x,
        },
    )


def effect_now(obs: Observed, store_rate: float, recompute_rate: float | None) -> Effect | None:
    """The tier's effect on this server now, from its own measurements (offloading on)."""
    beta = _beta(obs, recompute_rate)
    if beta is None:
        return None
    store = _store_seconds(obs, obs.stored_bytes, store_rate, beta[0])
    # Without a tier the queue was ~0 on real vLLM (0.02 ms); with one, every request's queue
    # time rose (not only the reloaded ones'), so all of it is the tier's.
    return _effect(1.0, obs.mean_queue, 0.0, store, obs.loaded_tokens, beta, obs.loads)


def predict(
    obs: Observed, reloaded_tokens: float, store_rate: float, recompute_rate: float | None
) -> Effect | None:
    """The effect per request of a tier that reloads `reloaded_tokens` per request, against no
    tier at all. With offloading on, the wait per reload and tokens per reload are this
    server's; with it off, a reload waits about one prefill step and brings a whole prompt."""
    beta = _beta(obs, recompute_rate)
    if beta is None:
        return None
    x = max(reloaded_tokens, 0.0)
    computed = max(obs.missed_tokens - x, 0.0)
    store = _store_seconds(
        obs, computed * obs.bytes_per_token if obs.bytes_per_token else None, store_rate, beta[0]
    )
    if obs.loads > 0 and obs.loaded_tokens > 0:
        # A tier that barely hits now reloads scraps; a bigger one brings whole prefixes.
        per_reload = max(obs.loaded_tokens / obs.loads, obs.missed_tokens)
        wait, wait_spread = obs.mean_queue / obs.loads, 0.0
    else:
        per_reload = max(obs.prompt_tokens, 1.0)
        wait = max(obs.mean_prefill + store - x * beta[0], _MIN_WAIT_STEPS * obs.mean_prefill)
        wait_spread = _WAIT_SPREAD
    reloads = x / per_reload
    return _effect(reloads, wait, wait_spread, store, x, beta, reloads)
