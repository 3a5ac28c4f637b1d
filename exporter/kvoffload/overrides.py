"""KEY=VALUE settings on the command line (`serve`/`analyze --threshold`, `generate --set`).

Why: with one parser, both options read numbers alike and refuse a bad pair with the same line.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TypeVar

from kvoffload.errors import InputError

N = TypeVar("N", int, float)


def refuse(option: str, pair: str, why: str) -> InputError:
    """The one-line error for a bad pair: `--set 'x=1': why`."""
    return InputError(f"{option} {pair!r}: {why}")


def split_pair(
    option: str,
    pair: str,
    keys: Collection[str],
    *,
    usage: str = "use",
    strip: bool = False,
    entries: bool = False,
) -> tuple[str, str, str]:
    """`KEY=VALUE` → (KEY, "", VALUE), KEY one of `keys`.

    With `entries`, `KEY.ENTRY=VALUE` → (KEY, ENTRY, VALUE); without, a dotted key is unknown.
    `strip` trims blanks around KEY and VALUE; `usage` starts the message listing the keys.
    """
    key, sep, value = pair.partition("=")
    if strip:
        key, value = key.strip(), value.strip()
    name, entry = key, ""
    if entries:
        name, _, entry = key.partition(".")
    if not sep or name not in keys:
        raise refuse(option, pair, f"{usage} KEY=VALUE with KEY one of {', '.join(sorted(keys))}")
    return name, entry, value


def parse_number(option: str, pair: str, value: str, kind: type[N], why: str) -> N:
    """`value` as an int or float, or the pair's one-line error saying `why`."""
    try:
        return kind(value)
    except ValueError:
        raise refuse(option, pair, why) from None
