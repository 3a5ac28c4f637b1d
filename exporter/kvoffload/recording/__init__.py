"""Recordings: the OpenMetrics files `record` writes, their readers and the `record` loop."""
