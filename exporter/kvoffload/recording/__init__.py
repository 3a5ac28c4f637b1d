"""Recordings: the OpenMetrics files `record` writes, their readers and the `record` loop.

`read(path, consume)` is the one way in (recording.reader picks the fastest reader that takes
the file)."""

from kvoffload.recording.reader import read

__all__ = ["read"]
