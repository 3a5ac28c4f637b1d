"""HTML building and number formatting for the server-rendered status page.

Every text is escaped on the way in (`tag`), so no value can inject markup or show as "null".
The formatters round for people: 0.117 s, 57.3 GB, 12.5 %."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Mapping


class Html(str):
    """Markup that is already safe: `tag` puts it in as it is."""


def esc(text: object) -> Html:
    """`text` as HTML text or an attribute value (quotes too)."""
    return Html(html.escape(str(text), quote=True))


def tag(name: str, attrs: Mapping[str, object] | None = None, *kids: Html | str | None) -> Html:
    """`<name attrs>kids</name>`: attribute values and plain-text kids escaped, None left out."""
    parts = [name]
    for key, value in (attrs or {}).items():
        if value is None or value is False:
            continue
        parts.append(key if value is True else f'{key}="{esc(value)}"')
    inner = "".join(k if isinstance(k, Html) else esc(k) for k in kids if k is not None)
    return Html(f"<{' '.join(parts)}>{inner}</{name}>")


def join(*parts: Html | str | None) -> Html:
    """The parts one after another (escaped where plain text), the absent ones left out."""
    return Html("".join(p if isinstance(p, Html) else esc(p) for p in parts if p is not None))


def _finite(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def sig(v: float, digits: int = 3) -> str:
    """`v` to `digits` significant digits, without a trailing ".0" or an exponent."""
    if v == 0:
        return "0"
    text = f"{v:.{digits}g}"
    if "e" in text:  # 1.23e+04: written out instead
        decimals = max(0, digits - 1 - math.floor(math.log10(abs(v))))
        text = f"{v:.{decimals}f}"
    return text


def fmt(value: object, unit: str) -> str:
    """A figure for people in `unit`: pct, bytes, s, x, tok/s, tokens, GB/s, ratio."""
    v = _finite(value)
    if v is None:
        return "—"
    if unit == "pct":
        return f"{100 * v:.1f} %"
    if unit == "bytes":
        units, i = ["B", "KB", "MB", "GB", "TB", "PB"], 0
        while abs(v) >= 1000 and i < len(units) - 1:
            v, i = v / 1000, i + 1
        return f"{v:.{2 if i else 0}f} {units[i]}"
    if unit == "s":
        return secs(v)
    if unit == "x":
        return f"{v:.2f}×"
    if unit in ("tok/s", "tokens"):
        return f"{round(v):,} {unit}"
    return f"{v:.2f}" + ("" if unit == "ratio" else f" {unit}")


def secs(value: object) -> str:
    """A duration for people: 39.3 µs, 117 ms, 5 s, 2.5 min, 1.5 h (never 0.11666666666666667 s)."""
    v = _finite(value)
    if v is None:
        return "—"
    a = abs(v)
    if a == 0:
        return "0 s"
    if a < 0.001:
        return f"{sig(v * 1e6)} µs"
    if a < 1:
        return f"{sig(v * 1000)} ms"
    if a < 120:
        return f"{sig(v)} s"
    if a < 7200:
        return f"{sig(v / 60)} min"
    return f"{sig(v / 3600)} h"


def signed_ms(value: object) -> str:
    """A TTFT change: +1.2 ms / −0.8 ms (negative = faster)."""
    v = _finite(value)
    if v is None:
        return "—"
    return ("+" if v >= 0 else "−") + f"{abs(v * 1000):.1f} ms"


def ago(seconds: float) -> str:
    """An age for people: just now, 3 s ago, 5 min ago."""
    return "just now" if seconds < 1 else f"{secs(round(seconds))} ago"


def when(t: object) -> str:
    """A wall-clock time in UTC, to the second: 2026-12-04 18:40:12 UTC."""
    v = _finite(t)
    if v is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(v))


def clock(t: float) -> str:
    """A time of day in UTC for an axis: 18:40:12."""
    return time.strftime("%H:%M:%S", time.gmtime(t))


def gib(v: float) -> str:
    """A tier size: 512 MiB, 1.5 GiB, 16 GiB."""
    if v < 1:
        m = v * 1024
        return f"{m:.0f} MiB" if m >= 10 else f"{m:.1f} MiB"
    return f"{v:.0f} GiB" if v >= 10 else f"{float(f'{v:.2f}'):g} GiB"
