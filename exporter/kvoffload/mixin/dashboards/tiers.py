"""The overview's row of the tiers below the CPU tier (vLLM's TieringOffloadingSpec).

All secondary tiers together from the rules, then each from vLLM's series by `tier` ("1:fs", ...).
Only a server with such a tier exports these series, so the row starts collapsed."""

from __future__ import annotations

from typing import Any

from kvoffload.mixin import grafana as g
from kvoffload.mixin.dashboards.panels import about, unit
from kvoffload.mixin.dashboards.queries import PanelQueries

TIERS_ROW = "Secondary tiers (below the CPU tier)"
BY = "instance, tier"
_WHERE = "Empty without a tier below the CPU (vLLM's TieringOffloadingSpec)."


def tiers_row(s: PanelQueries) -> list[Any]:
    """Hit shares, traffic, bandwidth, failures and jobs in flight; then each tier's hits and
    traffic, and the lookup delay."""
    return [*_together(s), *_per_tier(s)]


def _panel(s: PanelQueries, title: str, keys: dict[str, str], width: int = 8) -> Any:
    """One chart of catalog figures, legend `{{instance}} <name>` per figure."""
    first = next(iter(keys))
    described = " ".join(about(s.cfg, k) for k in keys)
    targets = [g.target(s.rule(k), f"{{{{instance}}}} {name}") for k, name in keys.items()]
    return g.timeseries(
        title, f"{described} {_WHERE}", unit(first), targets, min_value=0, width=width
    )


def _together(s: PanelQueries) -> list[Any]:
    """All secondary tiers together, from the figures' rules."""
    return [
        _panel(
            s,
            "Chunks found below the CPU tier",
            {"tier_hit_ratio": "secondary tiers", "primary_tier_hit_ratio": "CPU tier"},
        ),
        _panel(
            s,
            "Secondary-tier traffic",
            {"tier_read_bytes_per_second": "read", "tier_write_bytes_per_second": "written"},
        ),
        _panel(
            s,
            "Secondary-tier bandwidth while copying",
            {"tier_read_gbps": "read", "tier_write_gbps": "write"},
        ),
        _panel(
            s,
            "Failed and dropped promotions and cascades",
            {
                "tier_promotion_failures_per_second": "promotions failed",
                "tier_cascade_failures_per_second": "cascades failed",
                "promotion_allocation_failures_per_second": "promotions without a CPU slot",
            },
            width=12,
        ),
        _panel(
            s,
            "Promotions and cascades in flight",
            {"tier_active_promotions": "promotions", "tier_active_cascades": "cascades"},
            width=12,
        ),
    ]


def _rate(s: PanelQueries, name: str) -> str:
    return f"sum by ({BY}) (rate({s.raw(name)}[$__rate_interval]))"


def _either(s: PanelQueries, chunk: str, block: str) -> str:
    """The chunk spelling of a lookup counter, else the older block one."""
    return f"(\n{_rate(s, chunk)}\nor\n{_rate(s, block)}\n)"


def _per_tier(s: PanelQueries) -> list[Any]:
    """Each tier on its own from vLLM's series by `tier` (0:primary is the CPU tier).

    Plus how long the secondary tiers' lookups make a request wait (vLLM 0.26.0's only tiering
    series)."""
    t = g.target
    hits = _either(s, "kv_offload_tiering_chunk_hits_total", "kv_offload_tiering_block_hits_total")
    queries = _either(
        s, "kv_offload_tiering_chunk_queries_total", "kv_offload_tiering_block_queries_total"
    )
    read = _rate(s, "kv_offload_tiering_read_bytes_total")
    write = _rate(s, "kv_offload_tiering_write_bytes_total")
    return [
        g.timeseries(
            "Hit share per tier",
            "Chunks found over chunks looked up, per tier (vllm:kv_offload_tiering_chunk_hits "
            "/ …_chunk_queries; block_hits / block_queries in the first releases with tiering "
            f"metrics). A tier is asked only for the chunks the tiers above it missed. {_WHERE}",
            "percentunit",
            [t(f"{hits}\n/\n({queries} > 0)", "{{instance}} {{tier}}")],
            min_value=0,
            max_value=1,
            width=8,
        ),
        g.timeseries(
            "Traffic per tier",
            "Bytes per second promoted from each secondary tier into the CPU tier (read) and "
            "cascaded into it (written): vllm:kv_offload_tiering_read_bytes_total, "
            f"…_write_bytes_total. {_WHERE}",
            "Bps",
            [
                t(read, "{{instance}} {{tier}} read"),
                t(write, "{{instance}} {{tier}} written"),
            ],
            min_value=0,
            width=8,
        ),
        _panel(
            s,
            "Secondary-tier lookups a request waits for",
            {"tier_lookup_wait_seconds": "waited", "tier_lookup_blocking_seconds": "blocked"},
        ),
    ]
