"""Rate-limits repeated log lines: repeats within the interval are counted, not written.

The next line written says how many there were.

Why: a target that is down fails every scrape, which drowned the log in identical warnings.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict


class RepeatFilter(logging.Filter):
    def __init__(self, interval_seconds: float = 60.0, max_keys: int = 1000) -> None:
        super().__init__()
        self.interval = interval_seconds
        self.max_keys = max_keys
        # (logger, level, text) → (when it was last written, how many held back since)
        self._seen: OrderedDict[tuple[str, int, str], tuple[float, int]] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        key = (record.name, record.levelno, text)
        now = time.monotonic()
        written, held = self._seen.get(key, (-float("inf"), 0))
        if now - written < self.interval:
            self._seen[key] = (written, held + 1)
            return False
        if held:
            record.msg = f"{text} (and {held} more times in the last {now - written:.0f} s)"
            record.args = ()
        self._seen[key] = (now, 0)
        self._seen.move_to_end(key)
        while len(self._seen) > self.max_keys:
            self._seen.popitem(last=False)
        return True


def install(
    interval_seconds: float = 60.0, handlers: list[logging.Handler] | None = None
) -> RepeatFilter:
    """Rate-limits repeats on `handlers` (default: every root-logger handler, where basicConfig
    writes)."""
    flt = RepeatFilter(interval_seconds)
    for handler in logging.getLogger().handlers if handlers is None else handlers:
        handler.addFilter(flt)
    return flt
