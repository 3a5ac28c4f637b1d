"""Real vLLM 0.26.0 KV events (the H200 TTFT sets) through the subscriber and vLLM's replay
protocol: a sidecar that starts late recovers the history vLLM still buffers and builds the
same state as one that saw every message; history older than the buffer is reported, and the
advice calls its sizes provisional."""

import asyncio
import lzma
from pathlib import Path

import pytest

from kvoffload.analysis.analyze import Settings, analyze_window, window_from_expositions
from kvoffload.kvevents.eventfile import RawMessage, read_event_file
from kvoffload.kvevents.state import TargetEvents
from kvoffload.kvevents.subscriber import Subscriber, cancel_all
from kvoffload.recording.openmetrics import read_recording
from kvoffload.sim.kv_events import ZmqEventPublisher

from helpers import free_port
from kv_helpers import replays_served

SETS = Path(__file__).parents[1] / "fixtures" / "vllm-0.26-h200-ttft"


def _capture(tmp_path: Path, name: str = "E-cpu4", set_name: str = "E") -> list[RawMessage]:
    path = tmp_path / f"{name}.kvev"
    path.write_bytes(lzma.decompress((SETS / set_name / f"{name}.kvev.xz").read_bytes()))
    return list(read_event_file(str(path)))


def _curve_key(state: TargetEvents) -> tuple:
    e = state.engines[0]
    return (
        state.messages(),
        e.gpu_missed_blocks,
        e.tracker.histogram.total,
        e.tracker.histogram.cold,
        e.cpu_stored_blocks,
        state.cpu_resident_blocks(),
        state.never_loaded_blocks(),
    )


async def _late_subscriber(
    messages: list[RawMessage], before: int, buffer_steps: int
) -> tuple[TargetEvents, Subscriber]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    replay = f"tcp://127.0.0.1:{free_port()}"
    pub = ZmqEventPublisher(endpoint, replay, topic="kv", buffer_steps=buffer_steps)
    state = TargetEvents()
    sub = Subscriber(
        endpoint, 0, state.ingest_message, replay, topic="kv", replay_timeout_seconds=5.0
    )
    for msg in messages[:before]:
        pub.publish(msg.payload)  # vLLM was publishing before the sidecar started
    task = asyncio.create_task(sub.run())
    async with replays_served(pub):
        try:
            await asyncio.sleep(0.2)  # the slow joiner: what is published now may be missed live
            for msg in messages[before:]:
                pub.publish(msg.payload)
                await asyncio.sleep(0.001)
            for _ in range(300):
                if sub.state.last_seq == len(messages) - 1:
                    break
                await asyncio.sleep(0.01)
        finally:
            await cancel_all([task])
    return state, sub


def test_a_late_sidecar_builds_the_same_state_from_vllm_replay(tmp_path):
    messages = _capture(tmp_path)
    whole = TargetEvents()
    for i, msg in enumerate(messages):
        whole.ingest_message(RawMessage(0, i, msg.received_at, msg.topic, msg.payload))
    state, sub = asyncio.run(
        _late_subscriber(messages, before=len(messages) // 2, buffer_steps=10_000)
    )
    assert sub.state.replayed >= len(messages) // 2
    assert state.unseen_before_start() == 0 and state.lost_messages() == 0
    assert _curve_key(state) == _curve_key(whole)


def test_history_older_than_vllm_buffer_is_unseen_and_the_advice_provisional(tmp_path):
    messages = _capture(tmp_path)
    state, sub = asyncio.run(_late_subscriber(messages, before=300, buffer_steps=100))
    assert sub.state.history_from_seq is not None and sub.state.history_from_seq >= 200
    assert state.unseen_before_start() == sub.state.history_from_seq
    recording = tmp_path / "E-cpu4.om"
    recording.write_bytes(lzma.decompress((SETS / "E" / "E-cpu4.om.xz").read_bytes()))
    window, _, lifetime = window_from_expositions(read_recording(str(recording)))
    (instance, _model) = next(g for g in window.groups() if g[1])
    (group,) = [
        g
        for g in analyze_window(window, Settings(), lifetime, {instance: state})
        if g["labels"]["model_name"]
    ]
    assert group["kv_events"]["unseen_before_start"] == state.unseen_before_start()
    assert any(w.startswith("provisional:") for w in group["recommendation"]["warnings"])


def _final_counter(recording_text: str, name: str) -> float:
    values = [
        float(line.split()[1])
        for line in recording_text.splitlines()
        if line.startswith(name + "{")
    ]
    return values[-1]


@pytest.mark.parametrize("name", ["E/E-cpu4", "B/B-cpu10", "B/B-cpu5", "live/cpu4g", "live/cpu2g"])
def test_loads_seen_in_events_are_vllms_loads(tmp_path, name):
    """vLLM loads the leading run of CPU-resident blocks after the GPU hit; counting that
    run gives exactly vLLM's load-bytes counter on every real capture, so the never-loaded
    figure built on it is right, and never below the counters' own lower bound."""
    set_name, run = name.split("/")
    state = TargetEvents()
    for msg in _capture(tmp_path, run, set_name):
        state.ingest_message(msg)
    text = lzma.decompress((SETS / set_name / f"{run}.om.xz").read_bytes()).decode()
    recording = tmp_path / f"{run}.om"
    recording.write_text(text)
    window, _, lifetime = window_from_expositions(read_recording(str(recording)))
    (instance, _model) = next(g for g in window.groups() if g[1])
    (group,) = [
        g
        for g in analyze_window(window, Settings(), lifetime, {instance: state})
        if g["labels"]["model_name"]
    ]
    ev = group["kv_events"]
    loaded = _final_counter(text, "vllm:kv_offload_load_bytes_total")
    stored = _final_counter(text, "vllm:kv_offload_store_bytes_total")
    assert ev["cpu_loaded_bytes"] == pytest.approx(loaded, rel=0.01)
    assert state.engines[0].cpu_stored_blocks * ev["bytes_per_block"] == pytest.approx(
        stored, rel=0.01
    )
    never_loaded = ev["never_loaded_evicted_bytes"] + ev["never_loaded_resident_bytes"]
    assert never_loaded >= stored - loaded
