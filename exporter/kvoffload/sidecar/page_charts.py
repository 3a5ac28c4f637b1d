"""Inline-SVG trend charts for the status page: figures, the TTFT effect's band, the advice's runs.

They are drawn on the server from sidecar.history, so they show without JavaScript.
A gap (a target down) breaks the line."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvoffload.sidecar.page_html import Html, clock, fmt, join, tag

W, H, L, R, T, B = 300, 112, 62, 10, 8, 22  # size and margins of a trend chart


def _scale(values: Sequence[float], unit: str) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    # A span too small to matter is drawn flat-ish, not stretched to the full height.
    least = 0.02 if unit == "pct" else max(0.02 * max(abs(lo), abs(hi)), 1e-9)
    if hi - lo < least:
        mid = (hi + lo) / 2
        lo, hi = mid - least / 2, mid + least / 2
    if unit == "pct":
        lo, hi = max(0.0, lo), min(1.0, hi) if hi - max(0.0, lo) >= least else hi
    return lo, hi


def _path(xs: Sequence[float], ys: Sequence[float | None], y: Callable[[float], float]) -> str:
    d, pen = [], False
    for x, v in zip(xs, ys, strict=True):
        if v is None:
            pen = False
            continue
        d.append(f"{'L' if pen else 'M'}{x:.1f} {y(v):.1f}")
        pen = True
    return "".join(d)


def _band(
    xs: Sequence[float],
    lows: Sequence[float | None],
    highs: Sequence[float | None],
    y: Callable[[float], float],
) -> list[Html]:
    """The range between `lows` and `highs` as polygons, one per unbroken run."""
    runs: list[list[tuple[float, float, float]]] = [[]]
    for x, lo, hi in zip(xs, lows, highs, strict=True):
        if lo is None or hi is None:
            runs.append([])
        else:
            runs[-1].append((x, y(lo), y(hi)))
    out = []
    for run in runs:
        if len(run) < 2:
            continue
        pts = [f"{x:.1f},{yh:.1f}" for x, _, yh in run] + [
            f"{x:.1f},{yl:.1f}" for x, yl, _ in reversed(run)
        ]
        out.append(tag("polygon", {"class": "band", "points": " ".join(pts)}))
    return out


def _time_axis(t0: float, t1: float, x: Callable[[float], float], bottom: float) -> list[Html]:
    ticks = [t0, (t0 + t1) / 2, t1] if t1 - t0 >= 60 else [t0, t1]
    anchors = ["start", "middle", "end"] if len(ticks) == 3 else ["start", "end"]
    return [
        tag("text", {"x": f"{x(t):.1f}", "y": bottom + 15, "text-anchor": a}, clock(t))
        for t, a in zip(ticks, anchors, strict=True)
    ]


def _value_axis(lo: float, hi: float, unit: str, zero: bool, y: Callable[[float], float]):
    """Grid lines and labels at the low, middle and high values.

    The middle is zero (an effect's "no effect") where `zero` asks for it and the range spans it."""
    grid, axis = [], []
    middle = 0.0 if zero and lo < 0 < hi else (lo + hi) / 2
    for v in (lo, middle, hi):
        at = f"{y(v):.1f}"
        cls = "zero" if zero and v == 0.0 else None
        grid.append(tag("line", {"class": cls, "x1": L, "x2": W - R, "y1": at, "y2": at}))
        axis.append(
            tag("text", {"x": L - 4, "y": f"{y(v) + 4:.1f}", "text-anchor": "end"}, fmt(v, unit))
        )
    return grid, axis


def trend_chart(
    t: Sequence[float],
    values: Sequence[float | None],
    unit: str,
    label: str,
    band: tuple[Sequence[float | None], Sequence[float | None]] | None = None,
) -> Html | None:
    """A figure over time with its value axis (low, middle, high) and time axis (UTC).

    `band`: a range (lows, highs) drawn behind it. None with fewer than two known values."""
    known = [v for v in values if v is not None]
    if len(known) < 2 or len(t) < 2:
        return None
    every = list(known)
    if band:  # its range, and zero (no effect), in view
        every += [v for side in band for v in side if v is not None] + [0.0]
    lo, hi = _scale(every, unit)
    t0, span = t[0], (t[-1] - t[0]) or 1.0

    def x(s: float) -> float:
        return L + (W - L - R) * (s - t0) / span

    def y(v: float) -> float:
        return T + (H - T - B) * (1 - (v - lo) / (hi - lo))

    xs = [x(s) for s in t]
    grid, axis = _value_axis(lo, hi, unit, band is not None, y)
    parts: list[Html] = [
        tag("title", {}, f"{label}: {fmt(min(known), unit)} … {fmt(max(known), unit)}"),
        tag("g", {"class": "grid"}, join(*grid)),
        tag("g", {"class": "axis"}, join(*axis, *_time_axis(t0, t[-1], x, H - B))),
    ]
    if band:
        parts += _band(xs, band[0], band[1], y)
    parts.append(tag("path", {"class": "line", "d": _path(xs, values, y)}))
    last = next((i for i in range(len(values) - 1, -1, -1) if values[i] is not None), None)
    if last is not None and (end := values[last]) is not None:
        parts.append(tag("circle", {"cx": f"{xs[last]:.1f}", "cy": f"{y(end):.1f}", "r": 2.5}))
    attrs = {"class": "trend-chart", "viewBox": f"0 0 {W} {H}", "role": "img", "aria-label": label}
    return tag("svg", attrs, join(*parts))


def advice_runs(t: Sequence[float], advice: Sequence[str]) -> list[tuple[float, float, str]]:
    """The advice as runs (start, end, state).

    Each run lasts from its state's first sample to the next state's first (the last to the last
    sample)."""
    runs: list[tuple[float, float, str]] = []
    for i, (s, state) in enumerate(zip(t, advice, strict=True)):
        end = t[i + 1] if i + 1 < len(t) else s
        if runs and runs[-1][2] == state:
            runs[-1] = (runs[-1][0], end, state)
        else:
            runs.append((s, end, state))
    return runs


def advice_chart(t: Sequence[float], advice: Sequence[str]) -> Html | None:
    """The advice over time: a coloured bar per run of one action (or down / waiting).

    Bars are labelled where wide enough, on a time axis. None with fewer than two samples."""
    if len(t) < 2:
        return None
    width, height, left, right, bar = 620, 52, 8, 8, 24
    t0, t1 = t[0], t[-1]
    span = (t1 - t0) or 1.0

    def x(s: float) -> float:
        return left + (width - left - right) * (s - t0) / span

    bars = []
    for start, end, state in advice_runs(t, advice):
        x0, x1 = x(start), max(x(end), x(start) + 1)
        bars.append(
            tag(
                "rect",
                {
                    "class": f"run {state}",
                    "data-state": state,
                    "x": f"{x0:.1f}",
                    "y": 4,
                    "width": f"{x1 - x0:.1f}",
                    "height": bar,
                },
            )
        )
        if x1 - x0 >= 8 * len(state) + 8:
            bars.append(
                tag(
                    "text",
                    {
                        "class": "run-label",
                        "x": f"{(x0 + x1) / 2:.1f}",
                        "y": 4 + bar / 2 + 4,
                        "text-anchor": "middle",
                    },
                    state,
                )
            )
    axis = tag("g", {"class": "axis"}, join(*_time_axis(t0, t1, x, 4 + bar - 6)))
    return tag(
        "svg",
        {
            "class": "advice-chart",
            "id": "advice-chart",
            "viewBox": f"0 0 {width} {height}",
            "role": "img",
            "aria-label": "advice over time",
        },
        join(*bars, axis),
    )
