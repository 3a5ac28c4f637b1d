"""Parsing the durations and sizes users type on the command line."""

from __future__ import annotations

import re

from kvoffload.errors import InputError

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)


def parse_duration(text: str | float) -> float:
    """'5s', '5m', '1h', '500ms', '1.5' (seconds) → seconds."""
    if isinstance(text, int | float):
        return float(text)
    m = _DURATION_RE.match(text)
    if not m:
        raise InputError(f"bad duration {text!r}: use e.g. 500ms, 15s, 5m, 1h")
    value = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    if value <= 0:
        raise InputError(f"bad duration {text!r}: must be positive")
    return value


def parse_size(text: str | float) -> float:
    """'16MiB', '4GiB', '4G' (decimal), '1048576' → bytes."""
    if isinstance(text, int | float):
        return float(text)
    m = _SIZE_RE.match(text)
    if not m:
        raise InputError(f"bad size {text!r}: use e.g. 16MiB, 4GiB, 500MB")
    unit = (m.group(2) or "B").upper()
    if unit == "B":
        factor = 1.0
    else:
        power = "KMGT".index(unit[0]) + 1
        factor = float(1024**power if "I" in unit else 1000**power)
    return float(m.group(1)) * factor
