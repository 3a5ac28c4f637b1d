"""Marginal costs from the variation between scrape intervals.

Totals cannot say what one more recomputed token costs: `prefill_time_sum ÷ local_compute`
is dominated by per-step overhead on small models (15,262 tok/s on one real server, 2,380–6,834
on its offloading twins). Between scrapes the mix changes — some intervals recompute whole
documents, others hit the GPU cache — and the mean TTFT moves with it. A least-squares fit over
the intervals of a window,

    Δttft_sum = a · Δrequests + β · Δrecomputed_tokens      (one row per scrape interval)

gives β: the TTFT (summed over requests) that one more recomputed prompt token costs, with the
engine's batching, queueing and step overhead included — the marginal cost the verdict needs.

The fit is kept as running sums (XᵀX, Xᵀy, yᵀy, row count) in every window point, so any
window's fit is a subtraction of two points and memory does not grow with the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Row features: requests that got their first token, and prompt tokens computed on the GPU.
_X = ("ttft_count", "src_local_compute")
_Y = "ttft_sum"
# Layout of the running sums: xx (upper triangle of XᵀX), xy (Xᵀy), yy, rows.
_PAIRS = tuple((i, j) for i in range(len(_X)) for j in range(i, len(_X)))
FIT_SIZE = len(_PAIRS) + len(_X) + 2


def add_interval(fit: tuple[float, ...], before: dict[str, float], after: dict[str, float]
                 ) -> tuple[float, ...]:
    """The running sums with one more interval (between two scrapes' adjusted totals).
    Intervals with no finished request carry no information and are skipped."""
    x = [max(after.get(k, 0.0) - before.get(k, 0.0), 0.0) for k in _X]
    if x[0] <= 0:
        return fit
    y = max(after.get(_Y, 0.0) - before.get(_Y, 0.0), 0.0)
    out = list(fit)
    for n, (i, j) in enumerate(_PAIRS):
        out[n] += x[i] * x[j]
    base = len(_PAIRS)
    for i, xi in enumerate(x):
        out[base + i] += xi * y
    out[-2] += y * y
    out[-1] += 1
    return tuple(out)


@dataclass(frozen=True)
class MarginalCost:
    """β (seconds of TTFT, summed over requests, per recomputed prompt token) and its
    standard error, from `intervals` scrape intervals."""

    seconds_per_token: float
    standard_error: float
    intervals: int

    def shrunk(self, z: float = 3.0) -> float:
        """The estimate pulled towards zero as much as its noise warrants: β · t²/(t² + z²),
        t = β ÷ its standard error (a cost of zero is the conservative prior: it never
        promises a saving the data does not show; 7 intervals at t = 1.1 keep 12% of β,
        23 intervals at t = 4.8 keep 72%)."""
        beta = max(self.seconds_per_token, 0.0)
        se2 = self.standard_error**2
        return beta * beta * beta / (beta * beta + z * z * se2) if beta > 0 else 0.0

    def bounds(self, z: float = 2.0) -> tuple[float, float]:
        beta = self.seconds_per_token
        return max(beta - z * self.standard_error, 0.0), max(beta + z * self.standard_error, 0.0)

    def to_json(self) -> dict[str, float | int]:
        return {"seconds_per_token": self.seconds_per_token,
                "standard_error": self.standard_error, "intervals": self.intervals}


# Fewer intervals than this cannot separate a per-request from a per-token cost.
MIN_INTERVALS = 5


def marginal_recompute_cost(fit: tuple[float, ...]) -> MarginalCost | None:
    """Least squares of Δttft_sum on (Δrequests, Δrecomputed tokens); None when the window
    has too few intervals or no variation in the mix."""
    rows = int(fit[-1])
    if rows < MIN_INTERVALS:
        return None
    s_nn, s_nk, s_kk = fit[0], fit[1], fit[2]
    s_ny, s_ky = fit[3], fit[4]
    yy = fit[5]
    det = s_nn * s_kk - s_nk * s_nk
    if det <= 1e-9 * max(s_nn * s_kk, 1e-300):
        return None  # the recomputed share never changed: nothing to separate
    a = (s_kk * s_ny - s_nk * s_ky) / det
    beta = (s_nn * s_ky - s_nk * s_ny) / det
    # Residual sum of squares from the sums: yᵀy − 2bᵀXᵀy + bᵀXᵀXb.
    rss = yy - 2 * (a * s_ny + beta * s_ky) + (
        a * a * s_nn + 2 * a * beta * s_nk + beta * beta * s_kk)
    sigma2 = max(rss, 0.0) / (rows - 2)
    se = math.sqrt(sigma2 * s_nn / det)
    return MarginalCost(beta, se, rows)
