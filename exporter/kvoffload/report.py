"""The human-readable `analyze` report: figures with units, the advice and its reasons."""

from __future__ import annotations

from kvoffload.signals import FIGURES

_UNIT_FORMAT = {
    "ratio": lambda v: f"{v:.3f}",
    "GB/s": lambda v: f"{v:.2f} GB/s",
    "bytes": lambda v: _bytes(v),
    "B/s": lambda v: f"{_bytes(v)}/s",
    "tokens/s": lambda v: f"{v:,.0f} tokens/s",
    "tokens": lambda v: f"{v:,.0f} tokens",
    "x": lambda v: f"{v:.2f}x",
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


def render_report(groups: list[dict[str, object]], source: str, note: str = "") -> str:
    lines = [f"kvoffload analysis of {source}"]
    if note:
        lines.append(note)
    if not groups:
        lines.append("no vLLM engine found in the input")
    for g in groups:
        labels = g["labels"]
        assert isinstance(labels, dict)
        figures = g["figures"]
        assert isinstance(figures, dict)
        rec = g["recommendation"]
        assert isinstance(rec, dict)
        lines.append("")
        where = f" @ {labels['instance']}" if labels.get("instance") else ""
        state = "on" if g["offloading"] else "off"
        lines.append(f"model {labels['model_name']}{where} — offloading {state}, "
                     f"{float(g['window_seconds']):.0f} s of data, "  # type: ignore[arg-type]
                     f"offload metric names: {g.get('naming')}")
        width = max(len(f.key) for f in FIGURES)
        for fig in FIGURES:
            lines.append(f"  {fig.key:<{width}}  {format_value(figures.get(fig.key), fig.unit)}")
        lines.extend(_ttft_lines(g, figures, rec))
        size = rec.get("kv_offloading_size_gib")
        size_text = f" (--kv-offloading-size {size:g})" if size is not None else ""
        lines.append(f"  recommendation: {str(rec['action']).upper()}{size_text}")
        for reason in rec.get("reasons", []):  # type: ignore[union-attr]
            lines.append(f"    - {reason}")
        for warning in rec.get("warnings", []):  # type: ignore[union-attr]
            lines.append(f"    ! {warning}")
    return "\n".join(lines) + "\n"


def _ms(value: object) -> str:
    return f"{float(value) * 1000:+.1f} ms"  # type: ignore[arg-type]


def _ttft_lines(g: dict[str, object], figures: dict[str, object], rec: dict[str, object]
                ) -> list[str]:
    """The TTFT verdict: mean TTFT, the tier's effect now, the change the advice predicts."""
    verdict = g.get("ttft")
    if not isinstance(verdict, dict):
        return []
    lines = [f"  mean TTFT {float(verdict['mean_ttft_seconds']) * 1000:.1f} ms over "
             f"{float(verdict['requests']):.0f} requests (queue "
             f"{float(verdict['mean_queue_seconds']) * 1000:.1f} ms, prefill "
             f"{float(verdict['mean_prefill_seconds']) * 1000:.1f} ms)"]
    effect = figures.get("offload_ttft_effect_seconds")
    if effect is not None:
        low, high = verdict["now"]["range_seconds"]  # type: ignore[index]
        lines.append(f"  TTFT effect of the CPU tier now: {_ms(effect)} per request "
                     f"(range {_ms(low)} … {_ms(high)}; negative = faster)")
    predicted = verdict.get("predicted")
    if isinstance(predicted, dict) and effect is None:
        low, high = predicted["range_seconds"]
        lines.append(f"  predicted TTFT effect of a {predicted['kv_offloading_size_gib']:g} GiB "
                     f"tier: {_ms(predicted['seconds'])} per request "
                     f"(range {_ms(low)} … {_ms(high)})")
    change = rec.get("ttft_change_seconds")
    if change is not None:
        low, high = rec["ttft_change_range_seconds"]  # type: ignore[misc]
        lines.append(f"  if applied: mean TTFT {_ms(change)} per request "
                     f"({rec['ttft_change_basis']}, range {_ms(low)} … {_ms(high)})")
    return lines
