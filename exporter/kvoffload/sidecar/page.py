"""The sidecar's status page, rendered whole on the server from the status JSON and the history.

With JavaScript off, or in a headless screenshot, it still shows everything; nothing is judged here.
Its small script (web/index.html) only swaps in a fresh body every 5 s (GET /?part=body)."""

from __future__ import annotations

import importlib.resources
from functools import cache
from typing import Any

from kvoffload.sidecar.history import Trends
from kvoffload.sidecar.page_group import group_card
from kvoffload.sidecar.page_html import Html, ago, fmt, join, secs, signed_ms, tag, when

Status = dict[str, Any]
BODY_MARK = "<!--body-->"


@cache
def template() -> str:
    """web/index.html: the page's style and script around the place of its body."""
    text = importlib.resources.files("kvoffload.sidecar").joinpath("web/index.html").read_text()
    assert text.count(BODY_MARK) == 1, "web/index.html must hold one <!--body-->"
    return text


def _meta(s: Status) -> str:
    p, every = s.get("prometheus"), secs(s["interval_seconds"])
    if not p:
        span = f"window {secs(s['window_seconds'])} · scrape every {every}"
    else:
        selector = f" {p['selector']}" if p.get("selector") else ""
        if p.get("sliding"):
            read = f"last {secs(s['window_seconds'])}"
        elif p.get("end") is None:
            read = "a fixed range"
        else:
            read = f"{when(p['start'])} … {when(p['end'])}"
        span = f"fleet from {p['url']}{selector} · {read} · read every {every}"
    return f"{span} · updated {when(s['generated_at'])}"


def _fleet_card(s: Status) -> Html:
    """serve --prometheus: the fleet read from Prometheus, what the advice adds up to."""
    p, f, parts = s["prometheus"], s.get("fleet"), [tag("h2", {}, "Fleet")]
    if p.get("last_error"):
        shown = (
            ""
            if p.get("end") is None
            else f" (showing the read of {when(p['start'])} … {when(p['end'])})"
        )
        parts.append(
            tag(
                "p",
                {"class": "down", "id": "read-error"},
                f"last read failed: {p['last_error']}{shown}",
            )
        )
    if f:
        actions = ", ".join(f"{n} {a}" for a, n in f["actions"].items()) or "no advice yet"
        few = (
            f" · {f['insufficient_data']} with too little data"
            if f.get("insufficient_data")
            else ""
        )
        parts.append(tag("p", {"id": "fleet-actions"}, f"{f['engines']} engine(s): {actions}{few}"))
        parts.append(
            tag(
                "p",
                {},
                f"CPU tiers (pinned host memory): {fmt(f['configured_pinned_bytes'], 'bytes')} "
                f"configured → {fmt(f['advised_pinned_bytes'], 'bytes')} advised",
            )
        )
        if f.get("mean_ttft_change_seconds") is not None:
            v = f["mean_ttft_change_seconds"]
            parts.append(
                tag(
                    "p",
                    {},
                    join(
                        "Mean TTFT change per request if every change is applied: ",
                        tag("span", {"class": "cost" if v > 0 else "saving"}, signed_ms(v)),
                        f" over {round(f['requests']):,} requests",
                    ),
                )
            )
    parts += [tag("p", {"class": "warn"}, w) for w in p.get("warnings") or []]
    return tag("section", {"class": "card", "id": "fleet-summary"}, join(*parts))


def _host_card(h: dict[str, Any]) -> Html:
    """vLLM's container memory as the sidecar reads it: will the pinned tier OOM it?"""
    head = tag("h2", {}, "Host memory (vLLM's container)")
    cg, limit = h.get("cgroup"), h.get("limit_bytes")
    if not cg:
        return tag(
            "section",
            {"class": "card", "id": "host-memory"},
            join(
                head,
                tag("p", {"class": "muted"}, h.get("problem") or f"not read ({h.get('source')})"),
            ),
        )
    stat = cg["stat"]
    held = (stat.get("anon") or 0) + (stat.get("shmem") or 0)
    text = (
        f"unreclaimable {fmt(held, 'bytes')} (shared {fmt(stat.get('shmem'), 'bytes')}, "
        f"where vLLM 0.26 pins its CPU tier) · in use {fmt(cg['usage_bytes'], 'bytes')} · limit "
        f"{'none' if limit is None else fmt(limit, 'bytes')}"
    )
    if limit:
        text += f" ({100 * held / limit:.0f} % of it held)"
    if cg.get("oom_kills"):
        text += f" · {cg['oom_kills']} OOM kill(s)"
    where = f"read from {cg['path']} ({h.get('source')})" + (
        f" · {h['problem']}" if h.get("problem") else ""
    )
    return tag(
        "section",
        {"class": "card", "id": "host-memory"},
        join(head, tag("p", {}, text), tag("p", {"class": "muted"}, where)),
    )


def _targets(s: Status) -> Html:
    """Each target: up or down, when it last answered (age and time), how long that took."""
    rows = []
    for t in s["targets"]:
        ok = t.get("last_success_timestamp")
        last = (
            "never"
            if ok is None
            else join(
                ago(s["generated_at"] - ok), Html("<br>"), tag("span", {"class": "muted"}, when(ok))
            )
        )
        took = t.get("last_scrape_duration_seconds")
        rows.append(
            tag(
                "tr",
                {"data-instance": t["instance"]},
                join(
                    tag("td", {}, t["instance"]),
                    tag("td", {"class": "up" if t["up"] else "down"}, "up" if t["up"] else "down"),
                    tag("td", {"class": "num"}, last),
                    tag("td", {"class": "num"}, "—" if took is None else secs(took)),
                    tag("td", {"class": "muted"}, t.get("last_error") or ""),
                ),
            )
        )
    head = join(
        *(tag("th", {}, h) for h in ("instance", "state", "last success", "scrape took", "error"))
    )
    table = tag(
        "table",
        {"id": "targets"},
        join(tag("thead", {}, tag("tr", {}, head)), tag("tbody", {}, join(*rows))),
    )
    return tag("section", {"class": "card"}, join(tag("h2", {}, "Targets"), table))


def _state_card(s: Status) -> Html:
    """No group yet: every target down, or waiting for a first scrape with vLLM's series."""
    down = bool(s["targets"]) and all(not t["up"] for t in s["targets"])
    if down:
        b = tag(
            "span",
            {"class": "action target-down", "id": "action", "data-state": "down"},
            "target down",
        )
        why = "no target can be scraped (errors above)."
    else:
        b = tag(
            "span",
            {"class": "action waiting", "id": "action", "data-state": "waiting"},
            "waiting for data",
        )
        why = "No vLLM engine seen yet."
    return tag(
        "section",
        {"class": "card", "id": "no-groups"},
        join(b, " ", tag("span", {"class": "muted"}, why)),
    )


def render_body(s: Status, history: Trends | None, metrics_href: str = "metrics") -> Html:
    """The page's body: what the script swaps in on each refresh, and the first paint."""
    groups = [
        group_card(
            g,
            (history or {}).get((g["labels"]["instance"], g["labels"]["model_name"])),
            s["interval_seconds"],
        )
        for g in s["groups"]
    ]
    cards = ([_fleet_card(s)] if s.get("prometheus") else []) + (
        [_host_card(s["host_memory"])] if s.get("host_memory") else []
    )
    links = join(
        "Figures cover the sidecar's window. Machine-readable: ",
        tag("a", {"href": "api/v1/status"}, "/api/v1/status"),
        ", ",
        tag("a", {"href": metrics_href}, "/" + metrics_href),
        ".",
    )
    return join(
        tag("header", {}, join(tag("h1", {}, "kvoffload"), tag("span", {"id": "meta"}, _meta(s)))),
        tag(
            "main",
            {},
            join(
                tag("div", {"id": "fleet"}, join(*cards)),
                _targets(s),
                tag("div", {"id": "groups"}, join(*(groups or [_state_card(s)]))),
                tag("p", {"class": "muted"}, links),
            ),
        ),
    )


def render_page(s: Status, history: Trends | None, metrics_href: str = "metrics") -> str:
    """The whole document, its body rendered (the first paint needs no script)."""
    return template().replace(BODY_MARK, render_body(s, history, metrics_href))
