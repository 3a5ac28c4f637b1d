"""docs/metrics.md, rendered from the catalog so the reference never drifts from the code."""

from __future__ import annotations

from kvoffload.analysis.signals import FIGURES
from kvoffload.sidecar.metrics import KV_EVENT_METRICS, TTFT_METRICS

_TARGET_ROWS = [
    ("kvoffload_build_info{version}", "gauge", "kvoffload version (always 1)."),
    (
        "kvoffload_up{target}",
        "gauge",
        "1 if the last scrape of the vLLM target succeeded and parsed, else 0.",
    ),
    (
        "kvoffload_scrape_duration_seconds{target}",
        "gauge",
        "Duration of the last successful scrape, from request to updated figures.",
    ),
    (
        "kvoffload_scrape_failures_total{target}",
        "counter",
        "Scrapes that failed (unreachable, slow, HTTP error, oversized, unparsable).",
    ),
    ("kvoffload_scrape_payload_bytes{target}", "gauge", "Size of the last /metrics body."),
    (
        "kvoffload_last_success_timestamp_seconds{target}",
        "gauge",
        "Unix time of the last successful scrape.",
    ),
    (
        "kvoffload_offloading_enabled{target,model_name}",
        "gauge",
        "1 if the engine exposes KV offloading metrics.",
    ),
    ("kvoffload_window_seconds{target,model_name}", "gauge", "Time span the figures cover."),
]
_ADVICE_ROWS = [
    (
        "kvoffload_recommendation{target,model_name,action}",
        "gauge",
        "1 for the current advice (enable, leave_off, keep, grow, shrink, store_threshold, "
        "disable), 0 for the others.",
    ),
    (
        "kvoffload_recommended_size_bytes{target,model_name}",
        "gauge",
        "Recommended --kv-offloading-size in bytes, when the advice carries a size.",
    ),
]


def metrics_markdown() -> str:
    lines = [
        "# Metrics the sidecar exports",
        "",
        "Generated from `exporter/kvoffload/analysis/signals.py` by "
        "`kvoffload.sidecar.reference` (a test fails when this file drifts).",
        "Every series carries `target` (the vLLM scrape target, host:port); derived figures add",
        "`model_name`. Figures are computed over the sidecar's `--window` (5m by default), summed",
        "over engines (ratios are ratios of sums). An undefined figure has no sample.",
        "",
        "| metric | type | JSON key | help |",
        "|---|---|---|---|",
    ]
    for name, mtype, help_text in _TARGET_ROWS:
        lines.append(f"| `{name}` | {mtype} | | {help_text} |")
    for fig in FIGURES:
        extra = "".join(f',{k}="{v}"' for k, v in fig.labels)
        unit = "" if fig.export_scale == 1 else f" (JSON in {fig.unit})"
        lines.append(
            f"| `{fig.metric}{{target,model_name{extra}}}` | gauge | `{fig.key}` | "
            f"{fig.help}{unit} |"
        )
    for name, mtype, help_text in _ADVICE_ROWS:
        lines.append(f"| `{name}` | {mtype} | | {help_text} |")
    for name, (labels, help_text) in TTFT_METRICS.items():
        lines.append(
            f"| `{name}{{{','.join(['target', 'model_name', *labels])}}}` | gauge | | {help_text} |"
        )
    lines += [
        "",
        "JSON (`/api/v1/status`, `kvoffload analyze --json`) uses the figure keys; "
        "undefined figures are `null`. The TTFT verdict (docs/advisor.md) is "
        "`figures.offload_ttft_effect_seconds`, `recommendation.ttft_change_seconds`, "
        "`ttft_change_basis`, `ttft_change_range_seconds` and a `ttft` block per group.",
        "",
        "## With `--kv-events`",
        "",
        "Exact sizing from vLLM's KV events (docs/sizing.md). Per engine sizes; the JSON "
        "adds `kv_events`, `curve` and `predicted_offload_hit_ratio` to each group.",
        "",
        "| metric | type | help |",
        "|---|---|---|",
    ]
    for name, (mtype, labels, help_text) in KV_EVENT_METRICS.items():
        shown = f"{name}_total" if mtype == "counter" else name
        lines.append(f"| `{shown}{{{','.join(labels)}}}` | {mtype} | {help_text} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(metrics_markdown())
