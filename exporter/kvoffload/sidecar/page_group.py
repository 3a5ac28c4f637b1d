"""One engine group's card on the status page.

Verdict (badge, size, since when), TTFT effect, reasons, figures, trends and the KV events' curve.
Rendered on the server from GroupAnalysis.to_json and sidecar.history, so all of it is on the first
paint."""

from __future__ import annotations

from typing import Any

from kvoffload.sidecar.page_charts import advice_chart, advice_runs, trend_chart
from kvoffload.sidecar.page_curve import curve_block
from kvoffload.sidecar.page_html import Html, fmt, join, secs, signed_ms, tag, when

Group = dict[str, Any]

FIGURES = (
    ("offload_hit_ratio", "Offload hit ratio (of GPU-missed tokens)", "pct"),
    ("gpu_prefix_hit_ratio", "GPU prefix hit ratio", "pct"),
    ("load_gbps", "Load bandwidth per worker", "GB/s"),
    ("store_gbps", "Store bandwidth per worker", "GB/s"),
    ("speedup", "Reload vs recompute (throughput)", "x"),
    ("load_tokens_per_second", "Load speed", "tok/s"),
    ("recompute_tokens_per_second", "Recompute speed", "tok/s"),
    ("reuse_ratio", "Reuse ratio (loaded ÷ stored bytes)", "ratio"),
    ("wasted_bytes", "Stored, not loaded back (lower bound)", "bytes"),
    ("kv_bytes_per_token", "KV bytes per token", "bytes"),
    ("cpu_capacity_tokens", "CPU tier capacity", "tokens"),
    ("gpu_capacity_tokens", "GPU KV capacity", "tokens"),
    ("cpu_fill_seconds", "CPU tier fill time", "s"),
    ("mean_ttft_seconds", "Mean TTFT", "s"),
    ("gpu_kv_usage_ratio", "GPU KV usage (mean)", "pct"),
)
TRENDS = (
    ("offload_hit_ratio", "Offload hit ratio", "pct"),
    ("gpu_prefix_hit_ratio", "GPU prefix hit ratio", "pct"),
    ("load_gbps", "Load bandwidth", "GB/s"),
    ("store_gbps", "Store bandwidth", "GB/s"),
    ("mean_ttft_seconds", "Mean TTFT", "s"),
    ("gpu_kv_usage_ratio", "GPU KV usage", "pct"),
)


def badge(g: Group) -> Html:
    """The advice badge, or "target down" / "waiting for data" when there is no advice.

    Those two are not advice, so they never look like a green "keep"."""
    r = g["recommendation"]
    if g.get("stale"):
        title = "the target cannot be scraped: these figures and advice are its last ones"
        down = tag(
            "span",
            {"class": "action target-down", "id": "action", "data-state": "down", "title": title},
            "target down",
        )
        was = (
            None
            if r["insufficient_data"]
            else tag("span", {"class": "was"}, f"last advice: {r['action']}")
        )
        return join(down, was)
    if r["insufficient_data"]:
        return tag(
            "span",
            {
                "class": "action waiting",
                "id": "action",
                "data-state": "waiting",
                "title": "too little data to judge yet",
            },
            "waiting for data",
        )
    return tag(
        "span",
        {"class": f"action {r['action']}", "id": "action", "data-state": "advice"},
        r["action"],
    )


def standing(g: Group) -> Html | None:
    """Since when the advice stands (data time), and what waits out its dwell time."""
    r = g["recommendation"]
    if g.get("stale") or r["insufficient_data"]:
        return None
    if r.get("decided_by") == "warmup":
        return tag(
            "div",
            {"class": "muted", "id": "since"},
            "not judged yet (the first minutes after a start or a tier change)",
        )
    if r.get("since") is None:
        return None
    text = f"stands since {when(r['since'])}"
    if p := r.get("pending"):
        size = (
            ""
            if p.get("kv_offloading_size_gib") is None
            else f" {p['kv_offloading_size_gib']:g} GiB"
        )
        text += f" · {p['action']}{size} pending"
    return tag("div", {"class": "muted", "id": "since"}, text)


def _effect(v: float) -> Html:
    return tag("span", {"class": "cost" if v > 0 else "saving"}, signed_ms(v))


def _range(pair: list[float]) -> str:
    return f"{signed_ms(pair[0])} … {signed_ms(pair[1])}"


def _ttft_line(kind: str, lead: str, seconds: float, tail: str) -> Html:
    """One line of the TTFT block: its lead, the signed effect coloured, then its range."""
    return tag("p", {"class": "ttft", "data-ttft": kind}, join(lead, _effect(seconds), tail))


def ttft_block(g: Group) -> Html | None:
    """The verdict: what the tier does to mean time-to-first-token (negative = faster)."""
    t, r = g.get("ttft"), g["recommendation"]
    if not t:
        return None
    parts = [
        tag(
            "p",
            {"class": "ttft muted"},
            f"mean TTFT {secs(t['mean_ttft_seconds'])} over {round(t['requests']):,} requests "
            f"(queue {secs(t['mean_queue_seconds'])}, prefill {secs(t['mean_prefill_seconds'])})",
        )
    ]
    if now := t.get("now"):
        parts.append(
            _ttft_line(
                "now",
                "TTFT effect of the CPU tier now: ",
                now["seconds"],
                f" per request (range {_range(now['range_seconds'])}; negative = faster)",
            )
        )
    elif pred := t.get("predicted"):
        parts.append(
            _ttft_line(
                "predicted",
                f"A {pred['kv_offloading_size_gib']:g} GiB tier, predicted: ",
                pred["seconds"],
                f" per request (range {_range(pred['range_seconds'])})",
            )
        )
    if r.get("ttft_change_seconds") is not None:
        parts.append(
            _ttft_line(
                "change",
                "If applied: ",
                r["ttft_change_seconds"],
                f" per request ({r['ttft_change_basis']}, "
                f"range {_range(r['ttft_change_range_seconds'])})",
            )
        )
    return tag("div", {"id": "ttft"}, join(*parts))


def figures_table(g: Group) -> Html:
    """The figures; with KV events the exact bytes never loaded replace the lower bound."""
    ev = g.get("kv_events") or {}
    evicted = ev.get("never_loaded_evicted_bytes")
    exact = None if evicted is None else evicted + (ev.get("never_loaded_resident_bytes") or 0)
    rows = []
    for key, label, unit in FIGURES:
        value = g["figures"].get(key)
        if key == "wasted_bytes" and exact is not None:
            label, value = "Stored, never loaded back (exact, KV events)", exact
        rows.append(
            tag(
                "tr",
                {"data-figure": key},
                join(tag("td", {}, label), tag("td", {"class": "num"}, fmt(value, unit))),
            )
        )
    head = tag("thead", {}, tag("tr", {}, join(tag("th", {}, "figure"), tag("th", {}, "value"))))
    return tag("table", {"class": "figures"}, join(head, tag("tbody", {}, join(*rows))))


def _span(t: list[float]) -> str:
    return secs(t[-1] - t[0]) if len(t) > 1 else "0 s"


def _tile(name: str, label: str, chart: Html, now: str) -> Html:
    return tag(
        "div",
        {"class": "trend", "data-trend": name},
        join(tag("span", {"class": "label"}, label), tag("span", {"class": "now"}, now), chart),
    )


def _figure_tiles(g: Group, h: dict[str, Any]) -> list[Html]:
    t, figures, tiles = h["t"], h["figures"], []
    for name, label, unit in TRENDS:
        values = figures[name]
        chart = trend_chart(t, values, unit, label)
        if chart is None:
            continue
        known = [v for v in values if v is not None]
        now = (
            f"{fmt(known[-1], unit)}, then down"
            if g.get("stale")
            else fmt(g["figures"].get(name), unit)
        )
        tiles.append(_tile(name, label, chart, now))
    effect = figures["ttft_effect_seconds"]
    band = (figures["ttft_effect_low_seconds"], figures["ttft_effect_high_seconds"])
    label = "TTFT effect of the tier (range shaded)"
    if (chart := trend_chart(t, effect, "s", label, band)) is not None:
        known = [i for i, v in enumerate(effect) if v is not None]
        i = known[-1]
        now = f"{signed_ms(effect[i])} ({signed_ms(band[0][i])} … {signed_ms(band[1][i])})"
        tiles.append(
            _tile("ttft_effect", label, chart, now + (", then down" if g.get("stale") else ""))
        )
    return tiles


def _advice_trend(h: dict[str, Any]) -> Html | None:
    """The advice over the history, and since when each action stood (the latest runs)."""
    chart = advice_chart(h["t"], h["advice"])
    if chart is None:
        return None
    runs = advice_runs(h["t"], h["advice"])
    said = [
        f"{state} since {when(start)}"
        if i == len(runs) - 1
        else f"{state} {when(start)} – {when(end)}"
        for i, (start, end, state) in enumerate(runs)
    ][-4:]
    return tag(
        "div",
        {"class": "advice-trend", "id": "advice-trend"},
        join(
            tag("span", {"class": "label"}, "Advice over time"),
            chart,
            tag("ul", {"class": "runs"}, join(*(tag("li", {}, s) for s in said))),
        ),
    )


def trends_block(g: Group, h: dict[str, Any] | None, interval: object) -> Html:
    """The group's trends from the sidecar's history, or when they will appear."""
    tiles = _figure_tiles(g, h) if h else []
    if not tiles or h is None:
        return tag(
            "p",
            {"class": "muted", "id": "trends-empty"},
            f"Trends appear after a few scrapes (every {secs(interval)}).",
        )
    heading = f"Trends, last {_span(h['t'])} (from {when(h['t'][0])})"
    return tag(
        "div",
        {"class": "trends-block"},
        join(
            tag("h3", {}, heading), _advice_trend(h), tag("div", {"class": "trends"}, join(*tiles))
        ),
    )


def group_card(g: Group, h: dict[str, Any] | None, interval: object) -> Html:
    """The whole card of one (instance, model) group."""
    r, labels = g["recommendation"], g["labels"]
    size = None
    if (
        not g.get("stale")
        and not r["insufficient_data"]
        and r.get("kv_offloading_size_gib") is not None
    ):
        size = tag("strong", {}, f" → --kv-offloading-size {r['kv_offloading_size_gib']:g}")
    reasons = [tag("li", {}, x) for x in [*r["reasons"], *(r.get("warnings") or [])]]
    sub = (
        f"@ {labels['instance']} · offloading {'on' if g['offloading'] else 'off'} · "
        f"{secs(round(g['window_seconds']))} of data"
        + (" · STALE: target down" if g.get("stale") else "")
    )
    verdict = tag(
        "div",
        {"class": "verdict"},
        join(
            badge(g),
            size,
            standing(g),
            ttft_block(g),
            tag("ul", {"class": "reasons"}, join(*reasons)),
        ),
    )
    return tag(
        "section",
        {"class": "card group", "data-model": labels["model_name"]},
        join(
            tag("h2", {}, join(f"{labels['model_name']} ", tag("span", {"class": "muted"}, sub))),
            tag("div", {"class": "grid"}, join(verdict, figures_table(g))),
            trends_block(g, h, interval),
            tiers_block(g),
            curve_block(g),
            whatif_block(g),
        ),
    )


def _whatif_row(label: str, r: dict[str, Any]) -> Html:
    if r.get("omitted"):
        cells = [tag("td", {"class": "num", "colspan": "3"}, "omitted (tier over the budget)")]
    else:
        cells = [
            tag("td", {"class": "num"}, fmt(r.get("cpu_hit_ratio"), "pct")),
            tag("td", {"class": "num"}, fmt(r.get("stored_bytes"), "bytes")),
            tag("td", {"class": "num"}, fmt(r.get("stored_never_loaded_bytes"), "bytes")),
        ]
    return tag("tr", {}, join(tag("td", {}, label), *cells))


def whatif_block(g: Group) -> Html | None:
    """The knobs' what-ifs at the current size (KV events): store_threshold 1-4, LRU vs ARC.

    The advice quotes only a knob that pays; the table shows how far from paying the others are."""
    whatif = (g.get("kv_events") or {}).get("whatif")
    if not isinstance(whatif, dict):
        return None
    rows = [
        _whatif_row(f"store_threshold {r['store_threshold']}", r)
        for r in whatif.get("store_threshold") or []
        if r.get("size") == "current"
    ]
    rows += [
        _whatif_row(f"eviction_policy {r['policy']}", r)
        for r in whatif.get("eviction") or []
        if r.get("size") == "current" and r.get("policy") == "arc"
    ]
    rows += [
        _whatif_row("an fs tier below", r)
        for r in whatif.get("secondary_tier") or []
        if r.get("size") == "current"
    ]
    if not rows:
        return None
    head = tag(
        "thead",
        {},
        tag(
            "tr",
            {},
            join(
                *(
                    tag("th", {}, x)
                    for x in ("at the current size", "hit", "stored", "never loaded")
                )
            ),
        ),
    )
    return tag(
        "div",
        {"class": "whatif", "id": "whatif"},
        join(
            tag(
                "h3",
                {},
                "What-ifs: vLLM's store_threshold, eviction_policy and an fs tier on these lookups",
            ),
            tag("table", {"class": "figures"}, join(head, tag("tbody", {}, join(*rows)))),
            tag("p", {"class": "muted"}, str(whatif.get("basis") or "")),
        ),
    )


# The per-tier columns: figure key, heading, unit (fmt's).
_TIER_COLUMNS = (
    ("tier_hit_ratio", "hit", "pct"),
    ("tier_read_gbps", "read bandwidth", "GB/s"),
    ("tier_write_gbps", "write bandwidth", "GB/s"),
    ("tier_promotion_failures_per_second", "failed promotions", "/s"),
    ("tier_cascade_failures_per_second", "failed cascades", "/s"),
)


def tiers_block(g: Group) -> Html | None:
    """Each secondary tier apart (vLLM's per-tier series), one row a tier.

    Why: the figures table adds every tier, so a slow tier hides behind a fast one there.
    """
    tiers = g.get("tiers")
    if not isinstance(tiers, dict) or not tiers:
        return None
    rows = [
        tag(
            "tr",
            {"data-tier": tier},
            join(
                tag("td", {}, tier),
                *(
                    tag("td", {"class": "num"}, fmt(f.get(k), unit))
                    for k, _h, unit in _TIER_COLUMNS
                ),
            ),
        )
        for tier, f in tiers.items()
    ]
    heads = ("secondary tier", *(h for _k, h, _u in _TIER_COLUMNS))
    head = tag("thead", {}, tag("tr", {}, join(*(tag("th", {}, x) for x in heads))))
    return tag(
        "div",
        {"class": "tiers", "id": "tiers"},
        tag("table", {"class": "figures"}, join(head, tag("tbody", {}, join(*rows)))),
    )
