"""Marginal costs from the variation between scrape intervals.

Totals cannot say what one more recomputed token costs, but the mix varies between scrapes. A
least-squares fit over intervals gives it, kept as running sums: any window's fit is a subtraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Δprefill_time_sum = a · Δfinished + c · Δcomputed_tokens, one row per scrape interval: c is the
# prefill time per computed prompt token, batching and stores included. Both sides are counted at
# request finish, so reload waits do not leak in; per-step overhead goes to a.
_X = ("prefill_time_count", "computed_tokens")
_Y = ("prefill_time_sum",)
_REQUESTS, _TOKENS = 0, 1
# Older vLLM has no computed-tokens histogram: the tokens recomputed by source stand in.
_TOKENS_FALLBACK = "src_local_compute"
# Running sums, so memory does not grow with the window. Layout: xx (upper triangle of XᵀX),
# xy (Xᵀy per response), yy per response, rows.
_PAIRS = tuple((i, j) for i in range(len(_X)) for j in range(i, len(_X)))
_XY = len(_PAIRS)
_YY = _XY + len(_X) * len(_Y)
FIT_SIZE = _YY + len(_Y) + 1


def add_interval(
    fit: tuple[float, ...], before: dict[str, float], after: dict[str, float]
) -> tuple[float, ...]:
    """The running sums with one more interval between two scrapes' adjusted totals. Intervals with
    no finished request are skipped."""
    x = [max(after.get(k, 0.0) - before.get(k, 0.0), 0.0) for k in _X]
    if "computed_tokens" not in after:
        x[_TOKENS] = max(after.get(_TOKENS_FALLBACK, 0.0) - before.get(_TOKENS_FALLBACK, 0.0), 0.0)
    if x[_REQUESTS] <= 0:
        return fit
    y = [max(after.get(k, 0.0) - before.get(k, 0.0), 0.0) for k in _Y]
    out = list(fit)
    for n, (i, j) in enumerate(_PAIRS):
        out[n] += x[i] * x[j]
    for r, yr in enumerate(y):
        for i, xi in enumerate(x):
            out[_XY + r * len(_X) + i] += xi * yr
        out[_YY + r] += yr * yr
    out[-1] += 1
    if not all(map(math.isfinite, out)):
        # Counters near the float range (1e308, +Inf): their squares overflow, and a sum
        # holding inf would poison every later window's fit. The interval is left out.
        return fit
    return tuple(out)


@dataclass(frozen=True)
class Coefficient:
    """One fitted coefficient and its standard error, from `intervals` scrape intervals."""

    value: float
    standard_error: float
    intervals: int

    def t(self) -> float:
        """The t-statistic: the value over its standard error (inf for an exact fit)."""
        if self.standard_error <= 0:
            return math.inf if self.value > 0 else 0.0
        return self.value / self.standard_error

    def shrunk(self, z: float = 3.0) -> float:
        """The estimate shrunk towards zero by its noise: value · t²/(t² + z²), negatives as zero.
        Why: zero is the conservative prior, never promising what the data does not show."""
        value = max(self.value, 0.0)
        se2 = self.standard_error**2
        return value**3 / (value * value + z * z * se2) if value > 0 else 0.0

    def bounds(self, z: float = 2.0) -> tuple[float, float]:
        return (
            max(self.value - z * self.standard_error, 0.0),
            max(self.value + z * self.standard_error, 0.0),
        )

    def to_json(self) -> dict[str, float | int]:
        return {
            "value": self.value,
            "standard_error": self.standard_error,
            "intervals": self.intervals,
        }


# Fewer intervals than this cannot separate a per-request from a per-token cost (two
# coefficients and at least two degrees of freedom left for their noise).
MIN_INTERVALS = 4


def _solve(a: list[list[float]], b: list[float]) -> tuple[list[float], list[list[float]]] | None:
    """x = A⁻¹b and A⁻¹ by Gauss-Jordan with partial pivoting; None when A is singular."""
    size = len(a)
    m = [row[:] + [1.0 if i == j else 0.0 for j in range(size)] + [b[i]] for i, row in enumerate(a)]
    scale = max(abs(a[i][i]) for i in range(size)) or 1.0
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) <= 1e-9 * scale:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        div = m[col][col]
        m[col] = [v / div for v in m[col]]
        for r in range(size):
            if r != col and m[r][col]:
                f = m[r][col]
                m[r] = [v - f * w for v, w in zip(m[r], m[col], strict=True)]
    return [m[i][-1] for i in range(size)], [m[i][size : 2 * size] for i in range(size)]


def _fit(
    fit: tuple[float, ...], response: int, columns: tuple[int, ...], wanted: int
) -> Coefficient | None:
    """The least-squares coefficient of column `wanted` for one response over `columns`."""
    if not all(map(math.isfinite, fit)):
        return None  # (a difference of two huge sums; add_interval keeps each finite)
    rows = int(fit[-1])
    if rows < MIN_INTERVALS:
        return None
    xx = {pair: fit[n] for n, (i, j) in enumerate(_PAIRS) for pair in ((i, j), (j, i))}
    xy = [fit[_XY + response * len(_X) + i] for i in range(len(_X))]
    yy = fit[_YY + response]
    for cols in (columns,):
        cols = tuple(c for c in cols if xx[(c, c)] > 0)
        if wanted not in cols or rows <= len(cols):
            return None
        solved = _solve([[xx[(i, j)] for j in cols] for i in cols], [xy[i] for i in cols])
        if solved is None:
            continue
        coef, inverse = solved
        # Residual sum of squares from the sums: yᵀy − 2bᵀXᵀy + bᵀXᵀXb.
        rss = (
            yy
            - 2 * sum(c * xy[i] for c, i in zip(coef, cols, strict=True))
            + sum(
                coef[p] * coef[q] * xx[(cols[p], cols[q])]
                for p in range(len(cols))
                for q in range(len(cols))
            )
        )
        sigma2 = max(rss, 0.0) / (rows - len(cols))
        k = cols.index(wanted)
        error = math.sqrt(sigma2 * max(inverse[k][k], 0.0))
        if not (math.isfinite(coef[k]) and math.isfinite(error)):
            return None  # sums this far apart overflow the solve: no coefficient
        return Coefficient(coef[k], error, rows)
    return None


def marginal_recompute_cost(fit: tuple[float, ...]) -> Coefficient | None:
    """c: seconds of prefill time per computed prompt token. None with too few intervals or no
    variation in the mix."""
    return _fit(fit, 0, (_REQUESTS, _TOKENS), _TOKENS)
