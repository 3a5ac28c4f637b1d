#!/usr/bin/env python3
"""A file-system tier under the CPU tier on real vLLM: the tier-below what-if against the servers.

Issue #28 item 5 for tiers. Reads the `qwen3-0.6b-rag-tiering-ab*` folders of orch.py (each call
ran no offloading, a 1 GiB CPU tier, and the same with vLLM 0.26.0's fs tier under it, on the
same requests), runs `kvoffload analyze --events --json` on each offloading server with the
checkout's code, and prints per server: the clients' TTFT, what vLLM counted (offload hit ratio,
bytes stored into the CPU tier), what the fs tier's own KV events say it wrote, and what the
what-ifs predicted: from the CPU-only server's events (an fs tier below it) and from the fs
server's own. Writes tier-table.md and tier-table.json into bench/real/results/.

usage: .venv/bin/python bench/real/tier_table.py [bench/real/results]
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from knobs_table import ROOT, call_rows, fmt, pooled

PREFIX = "qwen3-0.6b-rag-tiering-ab"
OFFLOADING = ("cpu1", "cpu1-fs")


def _row(group: dict, kind: str, **match: object) -> dict | None:
    rows = (group["kv_events"].get("whatif") or {}).get(kind, [])
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    return found[0] if found else None


def one_call(folder: str) -> list[dict]:
    """One call's rows: every server, measured and (for offloading ones) predicted."""
    call = os.path.basename(folder)[len(PREFIX) :].lstrip("-") or "1"
    rows, groups = call_rows(folder, call, OFFLOADING)
    for row in rows:
        s = row["server"]
        if s in groups:
            g = groups[s]
            fig, ev = g["figures"], g["kv_events"]
            row["measured_hit_ratio"] = fig.get("offload_hit_ratio")
            row["measured_stored_bytes"] = fig.get("stored_bytes")
            row["measured_tier_stored_bytes"] = ev.get("tier_stored_bytes")
            row["tier_lookup_wait_ms"] = (fig.get("tier_lookup_wait_seconds") or 0) * 1e3 or None
            kind = "secondary_tier" if s == "cpu1-fs" else "eviction"
            match = {"size": "current"} if s == "cpu1-fs" else {"size": "current", "policy": "lru"}
            own = _row(g, kind, **match)
            other = "cpu1" if s == "cpu1-fs" else "cpu1-fs"
            cross = _row(groups[other], kind, **match) if other in groups else None
            row["predicted_hit_ratio_own_events"] = own and own["cpu_hit_ratio"]
            row[f"predicted_hit_ratio_from_{other}"] = cross and cross["cpu_hit_ratio"]
            if s == "cpu1-fs":
                row["predicted_tier_written_bytes"] = own and own["tier_written_bytes"]
                row["predicted_tier_hit_share"] = own and own["tier_hit_ratio"]
            now = (g.get("ttft") or {}).get("now") or {}
            row["estimated_ttft_effect_ms"] = now.get("seconds") and 1e3 * now["seconds"]
            row["estimated_range_ms"] = [1e3 * x for x in now.get("range_seconds") or []]
            rec = g["recommendation"]
            row["advice"] = rec["action"]
            row["secondary_tier_pays"] = (rec.get("secondary_tier") or {}).get("pays")
    return rows


def table(rows: list[dict]) -> str:
    """The markdown table of docs/sizing.md."""
    head = (
        "| call | server | requests | TTFT mean (p50) ms | vs no offload, same call | "
        "hit ratio: predicted (own events / the other server's) / measured | "
        "GB into the fs tier: predicted / its KV events | tier lookup wait ms | "
        "verdict's TTFT estimate (range) | advice (tier pays) |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        hit = wrote = est = wait = "–"
        if "measured_hit_ratio" in r:
            cross = next(v for k, v in r.items() if k.startswith("predicted_hit_ratio_from_"))
            hit = (
                f"{fmt(r['predicted_hit_ratio_own_events'])} / {fmt(cross)} / "
                f"{fmt(r['measured_hit_ratio'])}"
            )
            if r["server"] == "cpu1-fs":
                p, m = r.get("predicted_tier_written_bytes"), r.get("measured_tier_stored_bytes")
                wrote = f"{fmt(p and p / 1e9, '.2f')} / {fmt(m and m / 1e9, '.2f')}"
            wait = fmt(r.get("tier_lookup_wait_ms"), ".1f")
            rng = r.get("estimated_range_ms") or []
            est = fmt(r.get("estimated_ttft_effect_ms"), "+.1f")
            if rng:
                est += f" ({rng[0]:+.1f} … {rng[1]:+.1f})"
        pays = r.get("secondary_tier_pays", "–")
        lines.append(
            f"| {r['call']} | {r['server']} | {r['requests']} | "
            f"{r['ttft_mean_ms']:.1f} ({r['ttft_p50_ms']:.1f}) | "
            f"{fmt(r['ttft_vs_nooffload_ms'], '+.1f')} | {hit} | {wrote} | {wait} | {est} | "
            f"{r.get('advice', '–')}" + (f" ({pays})" if r["server"] == "cpu1-fs" else "") + " |"
        )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    results = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "bench/real/results")
    folders = sorted(os.path.join(results, d) for d in os.listdir(results) if d.startswith(PREFIX))
    rows = [r for f in folders for r in one_call(f)]
    md = table(rows) + pooled(rows)
    with open(os.path.join(results, "tier-table.md"), "w") as f:
        f.write(md)
    with open(os.path.join(results, "tier-table.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(md)


if __name__ == "__main__":
    main()
