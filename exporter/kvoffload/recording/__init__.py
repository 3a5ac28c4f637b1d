"""Recordings: the OpenMetrics files `record` writes, their readers and the `record` loop.

Its `read(path, consume, report)` is the one way in. It picks the strict reader for what `record`
leaves, else the general one.
"""

from kvoffload.recording.reader import read

__all__ = ["read"]
