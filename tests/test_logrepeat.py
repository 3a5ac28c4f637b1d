"""Repeated log lines are rate-limited with a count, not written every scrape."""

import logging

from kvoffload.logrepeat import RepeatFilter


def test_repeats_are_held_back_and_counted(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("kvoffload.logrepeat.time.monotonic", lambda: clock[0])
    flt = RepeatFilter(interval_seconds=60)
    records = []

    def log(text: str) -> None:
        record = logging.LogRecord("kvoffload", logging.WARNING, __file__, 1, text, (), None)
        if flt.filter(record):
            records.append(record.getMessage())

    for _ in range(86):  # a target down while vLLM starts: one failed scrape per second
        log("scrape failed: http://vllm:8000/metrics: cannot connect")
        clock[0] += 1
    log("another target failed")
    assert records == [
        "scrape failed: http://vllm:8000/metrics: cannot connect",
        "scrape failed: http://vllm:8000/metrics: cannot connect "
        "(and 59 more times in the last 60 s)",
        "another target failed",
    ]
