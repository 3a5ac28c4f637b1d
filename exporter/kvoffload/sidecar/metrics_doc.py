"""docs/metrics.md, rendered from the catalog so the reference never drifts from the code."""

from __future__ import annotations

from kvoffload.analysis.signals import FIGURES
from kvoffload.ingest.catalog import CATALOG, Source
from kvoffload.sidecar.metrics import (
    ADVICE_METRICS,
    FLEET_METRICS,
    HOST_MEMORY_METRICS,
    KV_EVENT_METRICS,
    TARGET_METRICS,
    TIER_METRICS,
    TTFT_METRICS,
    WHATIF_METRICS,
)


def _row(name: str, spec: tuple[str, list[str], str]) -> str:
    mtype, labels, help_text = spec
    shown = f"{name}_total" if mtype == "counter" else name
    return f"| `{shown}{{{','.join(labels)}}}` | {mtype} | | {help_text} |"


def metrics_markdown() -> str:
    """The whole of docs/metrics.md: the sidecar's series, then what it reads of vLLM."""
    lines = [
        "# Metrics the sidecar exports",
        "",
        "Generated from `exporter/kvoffload/analysis/signals.py` by "
        "`kvoffload.sidecar.metrics_doc` (a test fails when this file drifts).",
        "Every series carries `target` (the vLLM scrape target, host:port); derived figures add",
        "`model_name`. Figures are computed over the sidecar's `--window` (5m by default), summed",
        "over engines (ratios are ratios of sums). An undefined figure has no sample.",
        "",
        "| metric | type | JSON key | help |",
        "|---|---|---|---|",
        *_figure_rows(),
        "",
        "JSON (`/api/v1/status`, `kvoffload analyze --json`) uses the figure keys; "
        "undefined figures are `null`. The TTFT verdict (docs/advisor.md) is "
        "`figures.offload_ttft_effect_seconds`, `recommendation.ttft_change_seconds`, "
        "`ttft_change_basis`, `ttft_change_range_seconds` and a `ttft` block per group.",
    ]
    lines += _series_sections()
    lines += [
        "",
        "## The sidecar itself",
        "",
        "Like every exporter, its own cost and runtime (prometheus_client's collectors): "
        "`process_cpu_seconds_total`, `process_resident_memory_bytes`, "
        "`process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`, "
        "`process_start_time_seconds` (Linux), `python_info{implementation,major,minor,"
        "patchlevel,version}` and `python_gc_objects_collected_total`, "
        "`python_gc_objects_uncollectable_total`, `python_gc_collections_total` "
        "(`{generation}`).",
    ]
    return "\n".join(lines) + "\n"


def _series_sections() -> list[str]:
    """The sections after the figures: KV events, what-ifs, tiers, memory, --prometheus, vLLM."""
    lines: list[str] = []
    lines += _section(
        "With `--kv-events`",
        "Exact sizing from vLLM's KV events (docs/sizing.md). Per engine sizes; the JSON "
        "adds `kv_events`, `curve` and `predicted_offload_hit_ratio` to each group.",
        _table(KV_EVENT_METRICS),
    )
    lines += _section(
        "The store_threshold and eviction what-ifs",
        "Exact replays of vLLM 0.26.0's store_threshold (N = 1-4) and lru/arc rules over the "
        "GPU-missed lookups of the KV events (kvevents/whatif.py), at the current tier size and "
        "the advised one (`tier`), where the events come from a file (`analyze --events`): a "
        "second pass over it once the sizes are known. The JSON has them as `kv_events.whatif`; "
        "the advice sets `recommendation.kv_connector_extra_config` from them "
        "(docs/advisor.md).",
        _table(WHATIF_METRICS),
    )
    lines += _section(
        "Per secondary tier",
        "Under TieringOffloadingSpec with vLLM's per-tier series (after 0.26.0), the tier "
        "figures above again for each secondary tier apart (its `tier` label), so a slow tier "
        "does not hide behind a fast one; at most 8 tiers a target. The JSON has them as "
        '`tiers` ({"1:fs": {figure key: value}}).',
        _table(TIER_METRICS),
    )
    lines += _section(
        "vLLM's container memory",
        "Read every 15 s from the cgroup of vLLM's container where the sidecar can see it "
        "(`--host-memory.cgroup`: the pod's cgroup less the sidecar's own, the cgroup of "
        "vLLM's processes in a shared PID namespace, or a directory given), v2 or v1; absent "
        "with `--prometheus` and where nothing is visible (`kvoffload_host_memory_read_info` "
        "then says why). The OOM check and `KVOffloadHostMemoryNearLimit` read them.",
        _table(HOST_MEMORY_METRICS),
    )
    lines += _section(
        "With `--prometheus`",
        "`serve --prometheus URL` reads the whole fleet from Prometheus every `--interval` "
        "instead of scraping (docs/architecture.md): the series above then carry Prometheus' "
        "`instance` as `target`, their figures cover `--range` (or `--start`/`--end`), and "
        "`kvoffload_up`, `kvoffload_last_success_timestamp_seconds` and "
        "`kvoffload_scrape_failures_total` describe the reads of each instance's series. No "
        "KV-event series. The reads themselves:",
        _table(FLEET_METRICS),
    )
    lines += _section(
        "What it reads of vLLM",
        "The catalog (`exporter/kvoffload/ingest/catalog.py`, one row per series read). A value "
        "outside its row's range is unknown: the figures that read it are absent while that "
        "scrape is in the window, and the group's warnings name the series and the value "
        "(docs/reliability.md). A numeric label outside its range is as if absent.",
        [_source_row(src) for src in CATALOG],
        "| key | kind | vLLM series | believable range | notes |\n|---|---|---|---|---|",
    )
    return lines


def _figure_rows() -> list[str]:
    """The first table's rows: per target, the figures, the advice and the TTFT verdict."""
    lines = [_row(name, spec) for name, spec in TARGET_METRICS.items()]
    for fig in FIGURES:
        extra = "".join(f',{k}="{v}"' for k, v in fig.labels)
        unit = "" if fig.export_scale == 1 else f" (JSON in {fig.unit})"
        lines.append(
            f"| `{fig.metric}{{target,model_name{extra}}}` | gauge | `{fig.key}` | "
            f"{fig.help}{unit} |"
        )
    lines += [_row(name, spec) for name, spec in ADVICE_METRICS.items()]
    for name, (labels, help_text) in TTFT_METRICS.items():
        lines.append(
            f"| `{name}{{{','.join(['target', 'model_name', *labels])}}}` | gauge | | {help_text} |"
        )
    return lines


def _section(
    title: str, intro: str, rows: list[str], header: str = "| metric | type | help |\n|---|---|---|"
) -> list[str]:
    """One `##` section: its title, a paragraph, then a table."""
    return ["", f"## {title}", "", intro, "", *header.split("\n"), *rows]


def _source_row(src: Source) -> str:
    if src.kind == "label":
        series = f"`{src.name}{{{src.label}}}` (label)"
    elif src.label is not None:
        op = "=~" if src.regex else "="
        series = f'`{src.name}{{{src.label}{op}"{src.value}"}}`'
    else:
        series = f"`{src.name}`"
    notes = {
        "gauge": "summed over engines" if src.summed else "averaged over engines",
        "offload": f"{src.direction}; {src.naming}"
        + (" (read when the flat family is absent)" if src.naming == "legacy" else ""),
    }.get(src.kind, "")
    if src.note:
        notes = f"{notes}; {src.note}" if notes else src.note
    return f"| `{src.key}` | {src.kind} | {series} | {src.range} | {notes} |"


def _table(metrics: dict[str, tuple[str, list[str], str]]) -> list[str]:
    out = []
    for name, (mtype, labels, help_text) in metrics.items():
        shown = f"{name}_total" if mtype == "counter" else name
        label_text = "{" + ",".join(labels) + "}" if labels else ""
        out.append(f"| `{shown}{label_text}` | {mtype} | {help_text} |")
    return out


if __name__ == "__main__":
    import sys

    sys.stdout.write(metrics_markdown())
