"""Click callbacks that read a duration or size flag, shared by every command.

Why: `30s`, `2m` and `128MiB` mean the same and fail with the same one line in cli/ and fleet/.
"""

from __future__ import annotations

import re
from typing import Any

import click

from kvoffload.errors import InputError
from kvoffload.units import parse_duration, parse_size


def duration_callback(_ctx: click.Context, _param: click.Parameter, value: Any) -> float | None:
    """A duration flag in seconds (`30s`, `2m`, `1h30m`), None where unset."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except InputError as exc:
        raise click.BadParameter(str(exc)) from None


def duration_or_zero_callback(
    ctx: click.Context, param: click.Parameter, value: Any
) -> float | None:
    """A duration where 0 means "none" (the help says so): 0, 0s, 0m all read as 0."""
    if isinstance(value, str) and re.fullmatch(r"0+(\.0*)?(ms|s|m|h)?", value.strip()):
        return 0.0
    return duration_callback(ctx, param, value)


def size_callback(_ctx: click.Context, _param: click.Parameter, value: Any) -> float | None:
    """A size flag in bytes (`512Mi`, `128MiB`, `1.5G`), None where unset."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except InputError as exc:
        raise click.BadParameter(str(exc)) from None
