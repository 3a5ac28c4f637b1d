"""The human-readable `analyze` report: figures with units, the advice and its reasons."""

from __future__ import annotations

import json

from kvoffload.analysis.result import TTFT_EFFECT_FIGURE, GroupAnalysis
from kvoffload.analysis.signals import FIGURES, PER_TIER_FIGURES
from kvoffload.fleet.summary import FleetSummary
from kvoffload.kvevents.whatif import summary_lines

_UNIT_FORMAT = {
    "ratio": lambda v: f"{v:.3f}",
    "GB/s": lambda v: f"{v:.2f} GB/s",
    "bytes": lambda v: _bytes(v),
    "B/s": lambda v: f"{_bytes(v)}/s",
    "tokens/s": lambda v: f"{v:,.0f} tokens/s",
    "tokens": lambda v: f"{v:,.0f} tokens",
    "x": lambda v: f"{v:.2f}x" if abs(v) >= 0.1 else f"{v:.3f}x",
    "s": lambda v: _seconds(v),
    "1/s": lambda v: f"{v:.4f}/s",
    "requests": lambda v: f"{v:.2f}",
}


def _bytes(v: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(v) >= size:
            return f"{v / size:.2f} {unit}"
    return f"{v:.0f} B"


def _seconds(v: float) -> str:
    if v >= 3600:
        return f"{v / 3600:.1f} h"
    if v >= 1:
        return f"{v:.2f} s"
    return f"{v * 1000:.1f} ms"


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    return _UNIT_FORMAT.get(unit, lambda v: f"{v:g} {unit}")(value)


def render_fleet_summary(summary: FleetSummary, errors: dict[str, str] | None = None) -> list[str]:
    """The fleet in a few lines: actions, pinned memory, TTFT effect, what could not be read."""
    actions = ", ".join(
        f"{n} {a}" for a, n in sorted(summary.actions.items(), key=lambda kv: -kv[1])
    )
    lines = [
        f"fleet: {summary.engines} engine(s) (instance × model): {actions or 'no advice yet'}"
        + (
            f"; {summary.insufficient_data} with too little data"
            if summary.insufficient_data
            else ""
        ),
        f"  pinned host memory: {_bytes(summary.configured_pinned_bytes)} configured, "
        f"{_bytes(summary.advised_pinned_bytes)} advised",
    ]
    if summary.mean_ttft_change_seconds is not None:
        lines.append(
            f"  if every change is applied: mean TTFT {_ms(summary.mean_ttft_change_seconds)} "
            f"per request over {summary.requests:,.0f} requests "
            f"({summary.ttft_seconds_saved_per_second:.3f} s of TTFT saved per second)"
        )
    if summary.changes_without_ttft:
        lines.append(
            f"  {summary.changes_without_ttft} change(s) without a TTFT estimate yet "
            "(left out of the mean: a longer range, or KV events, would give one)"
        )
    for instance, error in sorted((errors or {}).items()):
        lines.append(f"  ! not read: {instance}: {error}")
    return lines


def render_report(
    groups: list[GroupAnalysis],
    source: str,
    note: str = "",
    summary: FleetSummary | None = None,
    errors: dict[str, str] | None = None,
) -> str:
    lines = [f"kvoffload analysis of {source}"]
    if note:
        lines.append(note)
    if summary is not None and (summary.engines > 1 or errors):
        lines.extend(render_fleet_summary(summary, errors))
    if not groups:
        lines.append("no vLLM engine found in the input")
    for g in groups:
        figures = g.figures
        rec = g.recommendation
        lines.append("")
        where = f" @ {g.instance}" if g.instance else ""
        state = "on" if g.offloading else "off"
        lines.append(
            f"model {g.model_name}{where} — offloading {state}, "
            f"{g.window_seconds:.0f} s of data, offload metric names: {g.naming}"
        )
        width = max(len(f.key) for f in FIGURES)
        for fig in FIGURES:
            lines.append(f"  {fig.key:<{width}}  {format_value(figures.get(fig.key), fig.unit)}")
        lines.extend(_tier_lines(g))
        lines.extend(_ttft_lines(g))
        whatif = (g.kv_events or {}).get("whatif")
        size = rec.kv_offloading_size_gib
        if isinstance(whatif, dict):
            # The what-ifs at the size the advice leaves the tier (the knobs are judged there).
            lines.extend(summary_lines(whatif, "advised" if size is not None else "current"))
        size_text = f" (--kv-offloading-size {size:g})" if size is not None else ""
        lines.append(f"  recommendation: {rec.action.upper()}{size_text}")
        if rec.kv_connector_extra_config:
            # What to merge into --kv-transfer-config, as the operator types it.
            extra = json.dumps(rec.kv_connector_extra_config)
            lines.append(f"    kv_connector_extra_config: {extra}")
        lines.extend(f"    - {reason}" for reason in rec.reasons)
        lines.extend(f"    ! {warning}" for warning in rec.warnings)
    return "\n".join(lines) + "\n"


def _tier_lines(g: GroupAnalysis) -> list[str]:
    """One line per secondary tier: its own figures, where vLLM exports them per tier."""
    lines = []
    for tier, figures in (g.tiers or {}).items():
        parts = [
            f"{fig.key.removeprefix('tier_')} {format_value(figures.get(fig.key), fig.unit)}"
            for fig in PER_TIER_FIGURES
        ]
        lines.append(f"  tier {tier}: " + ", ".join(parts))
    return lines


def _ms(value: object) -> str:
    assert isinstance(value, float | int), value
    return f"{float(value) * 1000:+.1f} ms"


def _ttft_lines(g: GroupAnalysis) -> list[str]:
    """The TTFT verdict: mean TTFT, the tier's effect now, the change the advice predicts."""
    verdict = g.ttft
    if verdict is None:
        return []
    lines = [
        f"  mean TTFT {verdict.mean_ttft_seconds * 1000:.1f} ms over "
        f"{verdict.requests:.0f} requests (queue "
        f"{verdict.mean_queue_seconds * 1000:.1f} ms, prefill "
        f"{verdict.mean_prefill_seconds * 1000:.1f} ms)"
    ]
    effect = g.figures.get(TTFT_EFFECT_FIGURE)
    if effect is not None and (now := verdict.now) is not None:
        lines.append(
            f"  TTFT effect of the CPU tier now: {_ms(effect)} per request "
            f"(range {_ms(now.low)} … {_ms(now.high)}; negative = faster)"
        )
    predicted = verdict.predicted
    if predicted is not None and effect is None:
        lines.append(
            f"  predicted TTFT effect of a {verdict.predicted_size_gib:g} GiB "
            f"tier: {_ms(predicted.seconds)} per request "
            f"(range {_ms(predicted.low)} … {_ms(predicted.high)})"
        )
    rec = g.recommendation
    if rec.ttft_change_seconds is not None and rec.ttft_change_range_seconds is not None:
        low, high = rec.ttft_change_range_seconds
        lines.append(
            f"  if applied: mean TTFT {_ms(rec.ttft_change_seconds)} per request "
            f"({rec.ttft_change_basis}, range {_ms(low)} … {_ms(high)})"
        )
    return lines
