"""The TTFT verdict: what the CPU tier does to mean time-to-first-token, now or at another size.

Why: hit ratio is not payoff, since a CPU hit waits for its copy in the queue. The effect per
request is W + store − x · c_compute, each term with a range; docs/advisor.md derives it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvoffload.analysis.context import Context
from kvoffload.analysis.intervals import Coefficient, marginal_recompute_cost
from kvoffload.analysis.signals import loaded_tokens

# Terms: W the reload wait (measured as queue time less capacity queueing, else predicted); c the
# prefill time per computed token (analysis.intervals); store the offload path's stall of others
# on launch-bound engines, c_compute = c − store on a tier-on server. Negative = faster.
# A fitted cost counts only at this t-statistic (else c is 0); it is shrunk by its noise with z.
MIN_COST_T = 2.0
_SHRINK_Z = 2.0
# An engine whose step, when it never idles, costs as much as this many computed tokens is bound
# by per-step launch overhead, not by its tokens (eager 0.6B on an H200: ~580; CUDA graphs,
# 0.6B to 32B: 40–250).
_LAUNCH_BOUND_TOKENS = 400.0
# Spreads of the assumed parts (one standard deviation, as a share of the part).
_STORE_SD = 0.25
_WAIT_SD = 0.15


@dataclass(frozen=True)
class Constants:
    """The model's few constants (thresholds.Thresholds carries them; docs/advisor.md)."""

    store_critical_bytes_per_second: float
    idle_reload_step_seconds: float
    run_to_run_seconds: float
    assumed_load_bytes_per_second: float


@dataclass(frozen=True)
class Observed:
    """What the window shows, per request (one TTFT observation each)."""

    requests: float
    seconds: float
    mean_ttft: float
    mean_queue: float
    mean_prefill: float
    prompt_tokens: float
    computed_tokens: float  # prompt tokens computed on the GPU
    loaded_tokens: float  # prompt tokens reloaded from the CPU tier
    loads: float  # load jobs per request
    load_seconds_per_job: float | None  # the copy, measured
    bytes_per_token: float | None
    capacity_queue: float  # seconds per request waiting for KV capacity (Little's law)
    in_system: float  # mean requests in the engine (Little's law: rate × mean e2e)
    step_seconds: float | None  # one engine step, where the engine never idled
    tokens_per_step: float | None
    cost: Coefficient | None  # c: prefill time per computed token (analysis.intervals)

    @property
    def missed_tokens(self) -> float:
        """GPU-missed prompt tokens per request: computed or reloaded."""
        return self.computed_tokens + self.loaded_tokens

    @property
    def tier_on(self) -> bool:
        return self.loads > 0 and self.loaded_tokens > 0

    @property
    def cost_measured(self) -> bool:
        cost = self.cost
        return cost is not None and cost.t() >= MIN_COST_T

    @property
    def overlap(self) -> float:
        """How often another request is in flight: 0 alone, 1 with at least one more."""
        return min(max(self.in_system - 1.0, 0.0), 1.0)

    @property
    def launch_bound(self) -> bool:
        if self.cost is None:
            return False  # too few intervals to tell
        if not self.cost_measured:
            return True  # recompute costs nothing measurable: per-step overhead dominates
        if self.step_seconds is None:
            return False
        return self.step_seconds >= _LAUNCH_BOUND_TOKENS * self.cost.value


# The gauges the model reads, an absent one as 0 (older vLLM): one that was there but not
# believed in the window (catalog ranges) leaves the model nothing to judge by.
_GAUGES_READ = frozenset({"running", "waiting_capacity"})


def observe(ctx: Context, bytes_per_token: float | None) -> Observed | None:
    """The window's per-request figures. None without a finished request, with a gauge not believed
    in the window, or with a non-finite figure."""
    obs = _observe(ctx, bytes_per_token)
    if obs is None:
        return None
    numbers = [v for v in vars(obs).values() if isinstance(v, float | int)]
    return obs if all(map(math.isfinite, numbers)) else None


def _observe(ctx: Context, bytes_per_token: float | None) -> Observed | None:
    n = ctx.inc("ttft_count")
    if n <= 0 or not ctx.has("ttft_sum") or ctx.delta.unknown & _GAUGES_READ:
        return None
    queue_n = ctx.inc("queue_time_count") or n
    prefill_n = ctx.inc("prefill_time_count") or n
    seconds = ctx.delta.seconds
    on = ctx.static.offload_families
    rate = n / seconds if seconds > 0 else 0.0
    gauges = ctx.delta.gauge_avg
    mean_ttft = ctx.inc("ttft_sum") / n
    e2e_n = ctx.inc("e2e_count")
    mean_e2e = ctx.inc("e2e_sum") / e2e_n if e2e_n > 0 else mean_ttft
    computed_n = ctx.inc("computed_count")
    computed = (
        ctx.inc("computed_tokens") / computed_n
        if computed_n > 0
        else ctx.inc("src_local_compute") / n
    )
    steps = ctx.inc("steps")
    busy = gauges.get("running", 0.0) >= 1.0 and steps > 0 and seconds > 0
    jobs = ctx.inc("load_jobs") if on else 0.0
    return Observed(
        requests=n,
        seconds=seconds,
        mean_ttft=mean_ttft,
        mean_queue=ctx.inc("queue_time_sum") / queue_n,
        mean_prefill=ctx.inc("prefill_time_sum") / prefill_n,
        prompt_tokens=ctx.inc("prompt_tokens") / n,
        computed_tokens=computed,
        loaded_tokens=loaded_tokens(ctx) / n if on else 0.0,
        loads=jobs / n,
        load_seconds_per_job=ctx.inc("load_time") / jobs if jobs > 0 else None,
        bytes_per_token=bytes_per_token,
        capacity_queue=gauges.get("waiting_capacity", 0.0) / rate if rate > 0 else 0.0,
        in_system=rate * mean_e2e,
        step_seconds=seconds / steps if busy else None,
        tokens_per_step=ctx.inc("step_tokens") / steps if steps > 0 else None,
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


@dataclass(frozen=True)
class _Costs:
    compute: float  # c_compute: seconds per recomputed token
    compute_sd: float
    store: float  # seconds of others' stall per stored token


def _costs(obs: Observed, k: Constants) -> _Costs:
    """The per-token costs: the fit, split into compute and store (module docstring)."""
    cost = obs.cost
    store = 0.0
    if obs.launch_bound and obs.bytes_per_token and k.store_critical_bytes_per_second > 0:
        store = obs.bytes_per_token / k.store_critical_bytes_per_second * obs.overlap
    if cost is None:
        # Too few intervals: the cost is somewhere between nothing and all of the prefill
        # time spent on its tokens; the middle, with that whole span as its range.
        ceiling = obs.mean_prefill / obs.computed_tokens if obs.computed_tokens > 0 else 0.0
        return _Costs(ceiling / 2, ceiling / 4, store)
    if not obs.cost_measured:
        return _Costs(0.0, cost.standard_error, store)
    c = cost.shrunk(_SHRINK_Z)
    if obs.tier_on:
        # Every computed block was stored: the fit holds the store too (at most all of it).
        store = min(store, c)
        c -= store
    return _Costs(c, cost.standard_error, store)


def _combine(point: float, sds: dict[str, float], parts: dict[str, float]) -> Effect | None:
    """The effect, or None when a part is not finite. Why: no effect is better than a NaN one."""
    sigma = math.sqrt(sum(v * v for v in sds.values()))
    parts = {**parts, **{f"sd_{name}_seconds": v for name, v in sds.items()}}
    effect = Effect(point, point - 2 * sigma, point + 2 * sigma, parts)
    if not all(map(math.isfinite, (effect.low, effect.high, *parts.values()))):
        return None
    return effect


def effect_now(obs: Observed, k: Constants) -> Effect | None:
    """The tier's effect on this server now, from its own measurements (offloading on)."""
    return predict(obs, obs.loaded_tokens, k)


def predict(
    obs: Observed, reloaded_tokens: float, k: Constants, stored_share: float = 1.0
) -> Effect | None:
    """The effect per request of a tier reloading `reloaded_tokens` per request, against no tier.

    On a tier-on server the wait is its own, else predicted (docs/advisor.md). `stored_share` is
    the share of computed blocks stored. None on overflow.
    """
    x = max(reloaded_tokens, 0.0)
    costs = _costs(obs, k)
    computed_after = max(obs.missed_tokens - x, 0.0)
    saved = x * costs.compute
    store = computed_after * costs.store * stored_share
    bpt = obs.bytes_per_token or 0.0
    if obs.tier_on:
        per_reload = max(obs.loaded_tokens / obs.loads, 1.0)
        wait = max(obs.mean_queue - obs.capacity_queue, 0.0) / obs.loads
        wait_sd = 0.0  # measured: its noise is the run-to-run spread
        if x > obs.loaded_tokens:
            # A tier that barely hits reloads scraps; the tokens a bigger one adds come as
            # whole prefixes.
            extra = (x - obs.loaded_tokens) / max(per_reload, obs.missed_tokens)
            per_reload = x / (obs.loads + extra)
    else:
        per_reload = max(obs.prompt_tokens, 1.0)
        copy = per_reload * bpt / k.assumed_load_bytes_per_second
        prefill_after = max(obs.mean_prefill - saved + store, copy)
        o = obs.overlap
        wait = (1 - o) * (copy + k.idle_reload_step_seconds) + o * prefill_after
        wait_sd = _WAIT_SD
    reloads = x / per_reload
    waited = reloads * wait
    point = waited + store - saved
    sds = {
        "recompute": x * costs.compute_sd,
        "store": _STORE_SD * store,
        "wait": wait_sd * waited,
        "run_to_run": k.run_to_run_seconds,
    }
    parts = {
        "reload_wait_seconds": waited,
        "store_seconds": store,
        "recompute_saved_seconds": saved,
        "reloads_per_request": reloads,
        "reloaded_tokens_per_request": x,
        "compute_seconds_per_token": costs.compute,
        "store_seconds_per_token": costs.store,
        "capacity_queue_seconds": obs.capacity_queue,
        "cost_measured": 1.0 if obs.cost_measured else 0.0,
    }
    return _combine(point, sds, parts)
