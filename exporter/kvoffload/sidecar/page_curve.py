"""The status page's predicted hit ratio by CPU tier size (the KV events' curve), chart and table.

It is drawn on the server from GroupAnalysis.to_json (`curve`, `kv_events`, the advice's size).
So it shows without JavaScript, the current and advised sizes marked."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvoffload.sidecar.page_html import Html, fmt, gib, join, tag

Group = dict[str, Any]


@dataclass
class _Point:
    size: float
    ratio: float | None
    marks: list[str] = field(default_factory=list)


@dataclass
class CurveRow:
    lo: float
    hi: float
    ratio: float | None
    marks: list[str]
    label: str = ""


def _points(g: Group, current: float | None, advised: float | None) -> list[_Point]:
    """The curve's points with the current and advised sizes among them, each size once."""
    ev = g.get("kv_events") or {}
    pts = [_Point(p["cpu_gib"], p["predicted_offload_hit_ratio"]) for p in g["curve"]]
    if current is not None:
        pts.append(_Point(current, ev.get("predicted_offload_hit_ratio_current"), ["current"]))
    if advised is not None:
        pts.append(_Point(advised, g.get("predicted_offload_hit_ratio"), ["advised"]))
    pts.sort(key=lambda p: (p.size, -len(p.marks)))
    merged: list[_Point] = []
    for p in pts:
        prev = merged[-1] if merged else None
        if prev and (gib(prev.size) == gib(p.size) or abs(p.size - prev.size) <= 0.01 * p.size):
            # one size (the curve adds the current and GPU sizes, on or next to its own)
            if p.marks and not prev.marks:
                prev.size, prev.ratio = p.size, p.ratio if p.ratio is not None else prev.ratio
            prev.marks += [m for m in p.marks if m not in prev.marks]
            if prev.ratio is None:
                prev.ratio = p.ratio
            continue
        merged.append(_Point(p.size, p.ratio, list(p.marks)))
    return merged


def curve_rows(g: Group, current: float | None, advised: float | None) -> list[CurveRow]:
    """The table's rows: a run of sizes with the same hit ratio as one row ("16 GiB and up")."""
    largest = g["curve"][-1]["cpu_gib"] if g["curve"] else math.inf
    rows: list[CurveRow] = []
    for p in _points(g, current, advised):
        prev = rows[-1] if rows else None
        same = prev and fmt(prev.ratio, "pct") == fmt(p.ratio, "pct")
        if prev and same and not p.marks and not prev.marks:
            prev.hi = p.size
            continue
        rows.append(CurveRow(p.size, p.size, p.ratio, p.marks))
    for row in rows:
        if row.lo == row.hi:
            row.label = gib(row.lo)
        elif row.hi >= largest:
            row.label = f"{gib(row.lo)} and up"
        else:
            row.label = f"{gib(row.lo)} – {gib(row.hi)}"
    return rows


CW, CH, CL, CR, CT, CB = 640, 240, 46, 30, 14, 38  # the chart's size and margins


def _x_range(g: Group, pts: list[Group], current: float | None, advised: float | None):
    """log2 of the sizes shown: up to a little past where the curve stops rising."""
    ev = g.get("kv_events") or {}
    top = max(p["predicted_offload_hit_ratio"] for p in pts)
    flat = next(p["cpu_gib"] for p in pts if p["predicted_offload_hit_ratio"] >= top - 1e-9)
    want = max(
        flat * 4, (current or 0) * 2, (advised or 0) * 2, (ev.get("right_size_gib") or 0) * 2
    )
    x0 = math.log2(pts[0]["cpu_gib"])
    x1 = max(
        x0 + 1,
        min(math.log2(pts[-1]["cpu_gib"]), math.log2(want)),
        math.log2(max(current or 0, advised or 0, 1e-9)),
    )
    return x0, x1, top


def _axes(x0: float, x1: float, y_top: float, X, Y) -> Html:
    grid, axis = [], []
    step = 0.2 if y_top > 0.5 else 0.1
    for i in range(int(y_top / step + 1e-9) + 1):
        r = i * step
        grid.append(
            tag("line", {"x1": CL, "x2": CW - CR, "y1": f"{Y(r):.1f}", "y2": f"{Y(r):.1f}"})
        )
        axis.append(
            tag(
                "text",
                {"x": CL - 6, "y": f"{Y(r) + 4:.1f}", "text-anchor": "end"},
                f"{r * 100:.0f} %",
            )
        )
    every = 2 if x1 - x0 > 9 else 1
    for e in range(math.ceil(x0), math.floor(x1) + 1, every):
        x = f"{X(2.0**e):.1f}"
        grid.append(tag("line", {"x1": x, "x2": x, "y1": CT, "y2": CH - CB}))
        axis.append(tag("text", {"x": x, "y": CH - CB + 15, "text-anchor": "middle"}, gib(2.0**e)))
    axis.append(
        tag(
            "text",
            {"x": (CL + CW - CR) / 2, "y": CH - 4, "text-anchor": "middle"},
            "CPU tier per engine (log scale)",
        )
    )
    return join(tag("g", {"class": "grid"}, join(*grid)), tag("g", {"class": "axis"}, join(*axis)))


def _marks(marks: list[tuple[str, float, float | None]], X, Y, y_top: float) -> list[Html]:
    """The current and advised lines, each label on the side away from the other mark."""
    xs, room, out = [X(size) for _, size, _ in marks], 150, []
    for i, (name, size, ratio) in enumerate(marks):
        x = xs[i]
        other = xs[1 - i] if len(xs) == 2 else None
        left = x > (CL + CW - CR) / 2 if other is None else other >= x
        if left and x - CL < room:
            left = False
        if not left and CW - CR - x < room:
            left = True
        text = f"{name} {gib(size)}" + ("" if ratio is None else f" · {fmt(ratio, 'pct')}")
        kids = [
            tag("line", {"x1": f"{x:.1f}", "x2": f"{x:.1f}", "y1": CT, "y2": CH - CB}),
            tag(
                "text",
                {
                    "class": "mark-label",
                    "x": f"{x - 5 if left else x + 5:.1f}",
                    "y": CT + 12 + 14 * i,
                    "text-anchor": "end" if left else "start",
                },
                text,
            ),
        ]
        if ratio is not None:
            kids.append(
                tag("circle", {"cx": f"{x:.1f}", "cy": f"{Y(min(ratio, y_top)):.1f}", "r": 4.5})
            )
        out.append(tag("g", {"data-mark": name, "data-gib": repr(float(size))}, join(*kids)))
    return out


def curve_chart(g: Group, current: float | None, advised: float | None) -> Html | None:
    """The predicted hit ratio by tier size on a log axis; None with fewer than two sizes."""
    ev = g.get("kv_events") or {}
    pts = [p for p in g["curve"] if p["cpu_gib"] > 0]
    if len(pts) < 2:
        return None
    x0, x1, top = _x_range(g, pts, current, advised)
    y_top = min(1.0, max(0.1, math.ceil(top * 1.15 * 10) / 10))

    def X(v: float) -> float:
        return CL + (CW - CL - CR) * (math.log2(v) - x0) / (x1 - x0)

    def Y(r: float) -> float:
        return CT + (CH - CT - CB) * (1 - r / y_top)

    parts = [_axes(x0, x1, y_top, X, Y)]
    if (achievable := ev.get("achievable_hit_ratio")) is not None:
        a = f"{Y(min(achievable, y_top)):.1f}"
        parts.append(
            tag(
                "g",
                {"data-mark": "achievable"},
                join(
                    tag("line", {"x1": CL, "x2": CW - CR, "y1": a, "y2": a}),
                    tag(
                        "text",
                        {"x": CW - CR, "y": f"{float(a) - 4:.1f}", "text-anchor": "end"},
                        f"achievable {fmt(achievable, 'pct')}",
                    ),
                ),
            )
        )
    shown = [p for p in pts if math.log2(p["cpu_gib"]) <= x1 + 1e-9]
    coords = [(X(p["cpu_gib"]), Y(p["predicted_offload_hit_ratio"])) for p in shown]
    d = "".join(f"{'L' if i else 'M'}{x:.1f} {y:.1f}" for i, (x, y) in enumerate(coords))
    parts.append(tag("path", {"class": "curve", "d": d}))
    parts += [
        tag("circle", {"class": "point", "cx": f"{x:.1f}", "cy": f"{y:.1f}", "r": 2.5})
        for x, y in coords
    ]
    marks: list[tuple[str, float, float | None]] = []
    if current is not None:
        marks.append(("current", current, ev.get("predicted_offload_hit_ratio_current")))
    if advised is not None:
        marks.append(("advised", advised, g.get("predicted_offload_hit_ratio")))
    parts += _marks(marks, X, Y, y_top)
    return tag(
        "svg",
        {
            "class": "curve-chart",
            "id": "curve-chart",
            "viewBox": f"0 0 {CW} {CH}",
            "role": "img",
            "aria-label": "predicted offload hit ratio by CPU tier size",
        },
        join(*parts),
    )


def current_gib(g: Group) -> float | None:
    """The tier per engine now, in GiB; None with offloading off."""
    cap = g["figures"].get("cpu_capacity_bytes")
    if cap is None or not g.get("offloading"):
        return None
    return float(cap) / max(1, len(g.get("engines") or [])) / 2**30


def curve_block(g: Group) -> Html | None:
    """The curve's heading, its summary, a provisional warning, the chart and the table."""
    if not g.get("curve"):
        return None
    ev = g.get("kv_events") or {}
    current, advised = current_gib(g), g["recommendation"].get("kv_offloading_size_gib")
    body = [
        tag(
            "tr",
            {"class": "mark" if row.marks else None, "data-marks": " ".join(row.marks)},
            join(
                tag("td", {"class": "num"}, row.label),
                tag("td", {"class": "num"}, fmt(row.ratio, "pct")),
                tag("td", {"class": "muted"}, ", ".join(row.marks)),
            ),
        )
        for row in curve_rows(g, current, advised)
    ]
    right = ev.get("right_size_gib")
    size = "—" if right is None else f"{right:.2f} GiB"
    counts = (
        f"{ev.get('messages', 0):,} messages, {ev.get('lost_messages', 0):,} lost, "
        f"{ev.get('unseen_before_start') or 0:,} unseen before start"
    )
    achievable = fmt(ev.get("achievable_hit_ratio"), "pct")
    summary = f"achievable {achievable} · right size {size} per engine · {counts}"
    provisional = None
    if ev.get("provisional"):
        provisional = tag(
            "p",
            {"class": "warn", "id": "provisional"},
            "provisional: " + "; ".join(ev.get("provisional_reasons") or []),
        )
    head = tag(
        "thead",
        {},
        tag(
            "tr",
            {},
            join(
                tag("th", {}, "CPU tier per engine"),
                tag("th", {}, "predicted hit ratio"),
                tag("th", {}, ""),
            ),
        ),
    )
    return tag(
        "div",
        {"class": "curve-block"},
        join(
            tag("h3", {}, "Predicted offload hit ratio by CPU tier size (KV events)"),
            tag("p", {"class": "muted"}, summary),
            provisional,
            curve_chart(g, current, advised),
            tag("table", {"id": "curve"}, join(head, tag("tbody", {}, join(*body)))),
        ),
    )
