"""What a figure is evaluated over: one group's counter increases and static labels in a window.

Why its own module: the formulas (`formula`) and the catalog (`signals`) both read it, and
neither may import the other back.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.analysis.window import Delta, GroupStatic


@dataclass(frozen=True)
class Context:
    delta: Delta
    static: GroupStatic
    world_size: int = 1
    kv_bytes_per_token: float | None = None  # from the user, when nothing exposes it

    def inc(self, *keys: str) -> float:
        return sum(self.delta.inc.get(k, 0.0) for k in keys)

    def has(self, key: str) -> bool:
        return key in self.delta.inc
