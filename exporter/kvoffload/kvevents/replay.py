"""Offline: a recorded KV-event file into the same state the sidecar builds live."""

from __future__ import annotations

from kvoffload.errors import InputError
from kvoffload.kvevents.eventfile import read_event_file
from kvoffload.kvevents.state import TargetEvents
from kvoffload.kvevents.whatif import register_source


def load_event_file(
    path: str, sample_rate: float = 1.0, sample_budget: int | None = None
) -> TargetEvents:
    state = TargetEvents(sample_rate, sample_budget)
    for msg in read_event_file(path):
        state.ingest_message(msg)
    if not state.messages():
        raise InputError(f"{path}: no KV-event messages")
    register_source(state, path)  # for the what-ifs' second pass (kvevents/whatif.py)
    return state
