#!/usr/bin/env python3
"""store_threshold and eviction_policy on real vLLM: the what-ifs against what the servers did.

Issue #28 item 5. Reads the `qwen3-4b-rag-c16-kv3g-knobs-*` folders of orch.py (each call ran
no offloading, 4 GiB LRU, 4 GiB ARC and/or 4 GiB with store_threshold 2 on the same requests),
runs `kvoffload analyze --events --json` on every offloading server with the checkout's code,
and prints, per server: what the clients measured (TTFT), what vLLM counted (offload hit ratio,
bytes stored), and what the KV-event what-ifs predicted for that knob, from the LRU server's
events of the same call where it ran (else from the server's own). Writes knobs-table.md and
knobs-table.json into bench/real/results/.

usage: .venv/bin/python bench/real/knobs_table.py [bench/real/results]
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Collection

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import plain_copy, run_analyze

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "qwen3-4b-rag-c16-kv3g-knobs-"
GIB = 1 << 30
# The knob each server name stands for: (eviction policy, store_threshold).
KNOBS = {"cpu4": ("lru", 1), "cpu4-arc": ("arc", 1), "cpu4-thr2": ("lru", 2)}


def client_ttft(folder: str) -> dict[str, list[float]]:
    """Measured TTFT (ms) of each server's measured requests without error."""
    out: dict[str, list[float]] = {}
    with open(os.path.join(folder, "requests.csv")) as f:
        for row in csv.DictReader(f):
            if row["phase"] == "measure" and not row["error"]:
                out.setdefault(row["server"], []).append(float(row["ttft_ms"]))
    return out


def analyze_xz(rec_xz: str, events_xz: str) -> dict:
    """The checkout's `analyze --events --json` of an xz-compressed recording, first group."""
    with tempfile.TemporaryDirectory() as tmp:
        rec, events = plain_copy(rec_xz, tmp), plain_copy(events_xz, tmp)  # no .xz in analyze
        doc = run_analyze([sys.executable, "-m", "kvoffload"], rec, events, [])
    if "error" in doc:
        raise RuntimeError(f"{rec_xz}: {doc['error']}")
    return doc["groups"][0]


def analyze(folder: str, server: str) -> dict:
    """One server's recording and KV events of an orch.py folder."""
    rec = os.path.join(folder, "rec", f"{server}.om.xz")
    return analyze_xz(rec, os.path.join(folder, "rec", f"{server}.om.kvev.xz"))


def predicted(group: dict, policy: str, threshold: int) -> dict | None:
    """The what-if row for one knob at the server's own size (4 GiB)."""
    whatif = group["kv_events"].get("whatif") or {}
    if threshold > 1 or policy == "lru":
        rows = [
            r
            for r in whatif.get("store_threshold", [])
            if r["size"] == "current" and r["store_threshold"] == threshold
        ]
    else:
        rows = [
            r
            for r in whatif.get("eviction", [])
            if r["policy"] == policy and abs(r["cpu_gib"] - 4.0) < 1e-6
        ]
    return rows[0] if rows else None


def call_rows(folder: str, call: str, analyzed: Collection[str]) -> tuple[list[dict], dict]:
    """Every server of one orch.py call with its clients' TTFT, and the analysis of those named.

    Why: the knobs' and the tier's tables measure the same way and differ only in what they
    predict (tier_table.py uses it too)."""
    ttft = client_ttft(folder)
    with open(os.path.join(folder, "servers.json")) as f:
        servers = json.load(f)["meta"]["order"]
    ran = [s for s in servers if s in ttft]
    groups = {s: analyze(folder, s) for s in ran if s in analyzed}
    base = statistics.fmean(ttft["nooffload"]) if "nooffload" in ttft else None
    rows = [
        {
            "call": call,
            "server": s,
            "requests": len(ttft[s]),
            "ttft_mean_ms": statistics.fmean(ttft[s]),
            "ttft_p50_ms": statistics.median(ttft[s]),
            "ttft_vs_nooffload_ms": statistics.fmean(ttft[s]) - base if base is not None else None,
        }
        for s in ran
    ]
    return rows, groups


def one_call(folder: str) -> list[dict]:
    """One call's rows: every server, measured and (for offloading ones) predicted."""
    call = os.path.basename(folder)[len(PREFIX) - len("knobs-") :]
    rows, groups = call_rows(folder, call, KNOBS)
    for row in rows:
        s = row["server"]
        if s in groups:
            g = groups[s]
            fig = g["figures"]
            row["measured_hit_ratio"] = fig.get("offload_hit_ratio")
            row["measured_stored_bytes"] = fig.get("stored_bytes")
            source = "cpu4" if "cpu4" in groups else s
            pred = predicted(groups[source], *KNOBS[s])
            row["predicted_from"] = source
            row["predicted_hit_ratio"] = pred and pred["cpu_hit_ratio"]
            row["predicted_stored_bytes"] = pred and pred["stored_bytes"]
            now = (g.get("ttft") or {}).get("now") or {}
            row["estimated_ttft_effect_ms"] = now.get("seconds") and 1e3 * now["seconds"]
            row["estimated_range_ms"] = [1e3 * x for x in now.get("range_seconds") or []]
            row["advice"] = g["recommendation"]["action"]
    return rows


def fmt(v: object, spec: str = ".3f") -> str:
    return "–" if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    """The markdown table of docs/sizing.md."""
    head = (
        "| call | server | requests | TTFT mean (p50) ms | vs no offload, same call | "
        "hit ratio: predicted / measured | stored GB: predicted / measured | "
        "verdict's TTFT estimate (range) | advice |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        gb = 1e9
        hit = f"{fmt(r.get('predicted_hit_ratio'))} / {fmt(r.get('measured_hit_ratio'))}"
        ps, ms = r.get("predicted_stored_bytes"), r.get("measured_stored_bytes")
        stored = f"{fmt(ps and ps / gb, '.1f')} / {fmt(ms and ms / gb, '.1f')}"
        rng = r.get("estimated_range_ms") or []
        est = fmt(r.get("estimated_ttft_effect_ms"), "+.1f")
        if rng:
            est += f" ({rng[0]:+.1f} … {rng[1]:+.1f})"
        if "predicted_hit_ratio" not in r:
            hit = stored = est = "–"
        lines.append(
            f"| {r['call']} | {r['server']} | {r['requests']} | "
            f"{r['ttft_mean_ms']:.1f} ({r['ttft_p50_ms']:.1f}) | "
            f"{fmt(r['ttft_vs_nooffload_ms'], '+.1f')} | {hit} | {stored} | {est} | "
            f"{r.get('advice', '–')} |"
        )
    return head + "\n".join(lines) + "\n"


def pooled(rows: list[dict]) -> str:
    """Each server's mean TTFT over its calls against no offloading's, with run-to-run noise.

    Why: one call's difference to its own baseline moves by tens of ms between calls on the same
    requests, so the knob's effect is judged against the spread of the baseline's runs."""
    runs: dict[str, list[float]] = {}
    for r in rows:
        runs.setdefault(r["server"], []).append(r["ttft_mean_ms"])
    base = runs.get("nooffload", [])
    if len(base) < 2:
        return ""
    sd = statistics.stdev(base)  # one run's noise, from the baseline's own repeats
    out = [f"\nPooled over calls (run-to-run SD of one run, from no offloading: {sd:.1f} ms):\n"]
    for server, means in runs.items():
        if server == "nooffload":
            continue
        diff = statistics.fmean(means) - statistics.fmean(base)
        half = 1.96 * sd * (1 / len(means) + 1 / len(base)) ** 0.5
        out.append(
            f"- {server}: {len(means)} runs, mean TTFT {statistics.fmean(means):.1f} ms, "
            f"{diff:+.1f} ms against no offloading (95% range {diff - half:+.1f} … "
            f"{diff + half:+.1f})\n"
        )
    return "".join(out)


def main() -> None:
    results = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "bench/real/results")
    folders = sorted(os.path.join(results, d) for d in os.listdir(results) if d.startswith(PREFIX))
    rows = [r for f in folders for r in one_call(f)]
    md = table(rows)
    base = [r["ttft_mean_ms"] for r in rows if r["server"] == "nooffload"]
    md += (
        f"\nNo offloading, mean TTFT over {len(base)} calls: "
        + ", ".join(f"{b:.1f}" for b in base)
        + f" ms (spread {max(base) - min(base):.1f} ms).\n"
    )
    md += pooled(rows)
    with open(os.path.join(results, "knobs-table.md"), "w") as f:
        f.write(md)
    with open(os.path.join(results, "knobs-table.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(md)


if __name__ == "__main__":
    main()
