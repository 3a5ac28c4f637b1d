#!/usr/bin/env python3
"""The store_threshold and eviction what-ifs on the real vLLM 0.26 captures (docs/sizing.md).

Runs `kvoffload analyze --events --json` (the checkout's code) on every capture of
tests/fixtures/vllm-0.26-h200-ttft that has KV events and an offloading tier, and prints, at
the current and the advised size: the hit ratio, bytes stored and stored-never-reloaded for
store_threshold N = 1..4 (LRU), LRU against ARC, and vLLM's measured offload hit ratio.

usage: .venv/bin/python bench/whatif_table.py
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "real"))
from knobs_table import analyze_xz  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "vllm-0.26-h200-ttft")
CAPTURES = [
    ("E", "E-cpu4"),
    ("B", "B-cpu10"),
    ("B", "B-cpu5"),
    ("live", "cpu2g"),
    ("live", "cpu4g"),
]
GIB = 1 << 30


def rows_at(group: dict, size: str) -> tuple[float, list[dict], dict[str, float]] | None:
    """The tier size (GiB), the N = 1..4 rows and the LRU/ARC hit ratios at one size."""
    whatif = group["kv_events"]["whatif"]
    thr = sorted(
        (r for r in whatif["store_threshold"] if r["size"] == size),
        key=lambda r: r["store_threshold"],
    )
    if not thr:  # no advised size (the advice keeps the current one)
        return None
    gib = thr[0]["cpu_gib"]
    policy = {
        r["policy"]: r["cpu_hit_ratio"]
        for r in whatif["eviction"]
        if abs(r["cpu_gib"] - gib) < 1e-9 and not r["omitted"]
    }
    return gib, thr, policy


def cell(r: dict) -> str:
    return (
        f"{r['cpu_hit_ratio']:.3f} / {r['stored_bytes'] / GIB:.2f} / "
        f"{r['stored_never_loaded_bytes'] / GIB:.2f}"
    )


def main() -> None:
    print(
        "| capture | size | measured hit | N=1 hit / stored / never reloaded (GiB) | N=2 | N=3 "
        "| N=4 | LRU / ARC hit |\n|---|---|---|---|---|---|---|---|"
    )
    for folder, name in CAPTURES:
        base = os.path.join(FIXTURES, folder, name)
        group = analyze_xz(base + ".om.xz", base + ".kvev.xz")
        measured = group["figures"].get("offload_hit_ratio")
        for size in ("current", "advised"):
            at = rows_at(group, size)
            if at is None:
                continue
            gib, thr, policy = at
            cells = " | ".join(cell(r) for r in thr)
            lru_arc = (
                f"{policy.get('lru', float('nan')):.3f} / {policy.get('arc', float('nan')):.3f}"
            )
            shown = f"{measured:.3f}" if size == "current" and measured is not None else ""
            print(f"| {name} ({size}) | {gib:g} GiB | {shown} | {cells} | {lru_arc} |")


if __name__ == "__main__":
    main()
