"""Offline: a recorded KV-event file into the same state the sidecar builds live."""

from __future__ import annotations

from kvoffload.errors import InputError
from kvoffload.kvevents.decode import decode_batch
from kvoffload.kvevents.eventfile import read_event_file
from kvoffload.kvevents.state import TargetEvents


def load_event_file(path: str, sample_rate: float = 1.0,
                    sample_budget: int | None = None) -> TargetEvents:
    state = TargetEvents(sample_rate, sample_budget)
    for msg in read_event_file(path):
        try:
            batch = decode_batch(msg.payload, msg.dp_rank)
        except InputError as exc:
            state.decode_errors += 1
            state.last_error = f"{path}: message {msg.seq} of rank {msg.dp_rank}: {exc}"
            continue
        state.ingest(batch, msg.seq, msg.dp_rank)
    if not state.messages():
        raise InputError(f"{path}: no KV-event messages")
    return state
