"""`--state-dir` files written by someone else (issue #25, attacks 7 and 8): edited to absurd
values, damaged a byte at a time, made huge, linked to a device, a FIFO or a file outside the
directory, or shared by two sidecars. Before: NaN reached /api/v1/status (500), a cold count
of -1e12 published an achievable hit ratio of 396,209, a last_seq of -5 wedged ingestion, 10 M
checkpoints took 14 s and 3 GB to load, 971 of 1,000 one-byte corruptions loaded, /dev/zero
was read to 19.7 GB, a FIFO hung the start, a planted `.tmp` link was written through. Now
each such file is set aside (`*.bad`) with one line and the sidecar starts fresh."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import subprocess
import sys
import threading
import time
from array import array
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kvoffload.errors import InputError
from kvoffload.kvevents import persist, statefile
from kvoffload.kvevents.curve import build_curve
from kvoffload.kvevents.state import TargetEvents
from kvoffload.sidecar.exposition import render_metrics
from kvoffload.sidecar.service import KVEventsSource, Sidecar, SidecarConfig

INSTANCE = "vllm:8000"
URL = "http://vllm:8000/metrics"
BASE = 1 << 40


def _events(budget: int | None = None) -> TargetEvents:
    """A small real-looking state: two ranks, prefix chains, a CPU tier, reuse."""
    state = TargetEvents(1.0, budget)
    for rank in (0, 1):
        eng = state.engine(rank)
        parent = None
        for i in range(40):
            eng.sequence(i, 1_700_000_000.0 + i)
            eng.block_size = 16
            hashes = tuple(range(BASE + 10 * (i % 25), BASE + 10 * (i % 25) + 10))
            eng._gpu_stored(hashes, parent)
            for h in hashes:
                eng.cpu_resident.store(h)
            eng.cpu_stored_blocks += len(hashes)
            parent = hashes[-1] if i % 5 else None
    state.bytes_per_block = 2.0**20
    return state


def _file(tmp_path: Path, budget: int | None = None) -> Path:
    path = persist.state_path(tmp_path, INSTANCE)
    persist.save(_events(budget), INSTANCE, path, {'["vllm:8000", "m"]': {"prefix_queries": 5.0}})
    return path


def _raw(path: Path) -> dict[str, Any]:
    decoded: dict[str, Any] = msgspec.msgpack.decode(statefile.unframe(path.read_bytes()))
    return decoded


def _write(path: Path, raw: dict[str, Any]) -> None:
    """A file with a valid checksum: only the range checks can refuse it."""
    path.write_bytes(statefile.frame(msgspec.msgpack.encode(raw)))


def _refused(path: Path, caplog: pytest.LogCaptureFixture, budget: int | None = None) -> str:
    caplog.clear()
    with caplog.at_level(logging.WARNING, "kvoffload.kvevents"):
        assert persist.load(path, INSTANCE, 1.0, budget) is None
    (record,) = caplog.records
    line = record.getMessage()
    assert "\n" not in line and "starting fresh" in line, line
    assert not os.path.lexists(path) and path.with_name(path.name + ".bad").exists()
    return line


def _doubles(*values: float, n: int) -> bytes:
    return array("d", [*values, *([0.0] * (n - len(values)))]).tobytes()


NAN, INF = float("nan"), float("inf")


def _set(*keys: Any) -> Any:
    """A change to the decoded file: set raw[k1][k2]... to a value."""

    def change(raw: dict[str, Any], value: Any) -> None:
        node = raw
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value

    return change


E0 = ("engines", 0)
ABSURD = [
    ((*E0, "histogram", "cold"), -1e12),
    ((*E0, "histogram", "cold"), 1e15),  # more first touches than accesses
    ((*E0, "histogram", "total"), NAN),
    ((*E0, "histogram", "total"), INF),
    ((*E0, "histogram", "finite_sum"), -1.0),
    ((*E0, "histogram_exact"), _doubles(NAN, n=(1 << 16) + 1)),
    ((*E0, "histogram_exact"), _doubles(0.0, 1e12, n=(1 << 16) + 1)),  # above the total
    ((*E0, "histogram_coarse"), _doubles(-5.0, n=32 * 8)),
    ((*E0, "scalars", "gpu_missed_blocks"), -(10**18)),
    ((*E0, "scalars", "cpu_loaded_blocks"), 2**64 - 1),
    ((*E0, "scalars", "messages"), 1.5),
    ((*E0, "scalars", "lost_messages"), True),
    ((*E0, "scalars", "last_seq"), -5),
    ((*E0, "scalars", "last_seq"), "12"),
    ((*E0, "scalars", "last_seq"), 2**50),
    ((*E0, "scalars", "history_from_seq"), 10**6),  # after last_seq
    ((*E0, "scalars", "block_size"), 2**20 + 1),
    ((*E0, "scalars", "block_size"), -3200),
    ((*E0, "scalars", "block_size"), 9.2e20),
    ((*E0, "scalars", "sequence_jumps"), -1),
    ((*E0, "tracker", "threshold"), 0),
    ((*E0, "tracker", "accesses"), -7),
    ((*E0, "checkpoints"), [[1.0, 2.0]]),  # more first touches than accesses
    ((*E0, "checkpoints"), [[NAN, 0.0]]),
    ((*E0, "checkpoints"), [[float(2**i), 0.0] for i in range(129)]),
    ((*E0, "rank"), -1),
    ((*E0, "rank"), 5000),
    (("engines", 1, "rank"), 0),  # twice
    (("bytes_per_block",), NAN),
    (("bytes_per_block",), -1.0),
    (("bytes_per_block",), 0.0),
    (("bytes_per_block",), 1e300),
    (("decode_errors",), -1),
    (("last_error",), 42),
    (("baselines",), {f"g{i}": {} for i in range(5000)}),
]


@pytest.mark.parametrize("keys,value", ABSURD, ids=[f"{k[-1]}={v!r:.20}" for k, v in ABSURD])
def test_an_absurd_value_in_any_field_is_refused(tmp_path, caplog, keys, value):
    path = _file(tmp_path)
    raw = _raw(path)
    _set(*keys)(raw, value)
    _write(path, raw)
    _refused(path, caplog)


def test_what_the_sidecar_saves_loads_and_its_figures_are_finite(tmp_path):
    path = _file(tmp_path)
    loaded = persist.load(path, INSTANCE, 1.0, None)
    assert loaded is not None and loaded.events.messages() == 80
    curve = build_curve(loaded.events, 2.0**20)
    assert curve is not None
    ratios = [p.predicted_offload_hit_ratio for p in curve.points] + [curve.achievable_hit_ratio]
    assert all(0.0 <= r <= 1.0 for r in ratios)


def test_a_publisher_timestamp_or_baseline_that_is_no_number_is_dropped_not_trusted(tmp_path):
    """These come from outside (the publisher's stamps, the target's counters): a NaN there
    is unknown, not a reason to lose the state."""
    path = _file(tmp_path)
    raw = _raw(path)
    raw["engines"][0]["scalars"]["first_ts"] = NAN
    raw["engines"][1]["scalars"]["last_ts"] = -INF
    raw["baselines"] = {'["vllm:8000", "m"]': {"prefix_queries": NAN}, '["vllm:8000", "n"]': {}}
    _write(path, raw)
    loaded = persist.load(path, INSTANCE, 1.0, None)
    assert loaded is not None
    assert loaded.events.engines[0].first_ts is None and loaded.events.engines[1].last_ts is None
    assert loaded.baselines == {'["vllm:8000", "n"]': {}}


@pytest.mark.slow
def test_a_thousand_one_byte_corruptions_none_loads(tmp_path, caplog):
    """Before: 971 of 1,000 loaded silently. The checksum finds every one."""
    good = _file(tmp_path).read_bytes()
    rng = random.Random(25)
    path = persist.state_path(tmp_path, INSTANCE)
    loaded = 0
    for _ in range(1000):
        data = bytearray(good)
        at = rng.randrange(len(data))
        data[at] = (data[at] + rng.randrange(1, 256)) % 256  # a different byte
        path.write_bytes(bytes(data))
        caplog.clear()
        with caplog.at_level(logging.WARNING, "kvoffload.kvevents"):
            if persist.load(path, INSTANCE, 1.0, None) is not None:
                loaded += 1
        assert len(caplog.records) == 1 and "starting fresh" in caplog.records[0].getMessage()
    assert loaded == 0


def test_a_cut_file_is_refused(tmp_path, caplog):
    path = _file(tmp_path)
    data = path.read_bytes()
    for cut in (3, 20, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        assert "not a state file" in _refused(path, caplog)


@pytest.mark.timing
def test_blocks_over_the_budget_are_refused_before_they_are_unpacked(tmp_path, caplog):
    """Before: 5 M blocks over a 10,000 budget blocked the start for 160 s."""
    path = _file(tmp_path, budget=10_000)
    raw = _raw(path)
    n = 2_000_000
    raw["engines"][0]["tracker_blocks"] = b"".join(
        (BASE + i).to_bytes(17, "big", signed=True) for i in range(n)
    )
    _write(path, raw)
    started = time.monotonic()
    line = _refused(path, caplog, budget=10_000)
    assert "over the budget" in line and time.monotonic() - started < 10


@pytest.mark.timing
def test_a_million_checkpoints_are_refused_at_once(tmp_path, caplog):
    """Before: 10 M checkpoints cost 2.97 GB and 14 s to load."""
    path = _file(tmp_path)
    raw = _raw(path)
    raw["engines"][0]["checkpoints"] = [[1.0, 0.0]] * 1_000_000
    _write(path, raw)
    started = time.monotonic()
    assert "length <= 128" in _refused(path, caplog)
    assert time.monotonic() - started < 10


def test_a_file_over_the_size_limit_is_refused_without_reading(tmp_path, caplog):
    path = persist.state_path(tmp_path, INSTANCE)
    with open(path, "wb") as fh:
        fh.truncate(statefile.MAX_BYTES + 1)  # sparse: nothing to read if it were read
    assert "over the" in _refused(path, caplog)


def _in_a_thread(call: Any, seconds: float = 10.0) -> Any:
    """`call()` in a thread, asserting it returns within `seconds` (a FIFO must not hang)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "hung"
    return out[0]


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "outside"])
def test_a_state_that_is_a_link_device_or_fifo_is_refused_without_reading(tmp_path, caplog, kind):
    """Before: a link to /dev/zero was read to 19.7 GB; a FIFO hung."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    path = persist.state_path(state_dir, INSTANCE)
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        outside = _file(tmp_path)  # a valid state, but reached through a link
        path.symlink_to(outside)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "kvoffload.kvevents"):
        assert _in_a_thread(lambda: persist.load(path, INSTANCE, 1.0, None)) is None
    (record,) = caplog.records
    assert "symbolic link" in record.getMessage() or "not a regular file" in record.getMessage()
    assert not os.path.lexists(path)  # the link or FIFO set aside, not what it points to
    if kind == "outside":
        assert persist.load(outside, INSTANCE, 1.0, None) is not None


def test_links_planted_in_the_state_dir_are_not_written_through(tmp_path):
    """Before: a planted `NAME.tmp` link made the save overwrite a file outside the dir."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    path = persist.state_path(state_dir, INSTANCE)
    path.with_name(path.name + ".tmp").symlink_to(victim)  # the old fixed temporary name
    persist.save(_events(), INSTANCE, path)
    assert victim.read_bytes() == b"precious"
    path.unlink()
    path.symlink_to(victim)  # the state file itself: the link is replaced, not followed
    persist.save(_events(), INSTANCE, path)
    assert victim.read_bytes() == b"precious"
    assert not path.is_symlink() and persist.load(path, INSTANCE, 1.0, None) is not None
    assert [p.name for p in state_dir.iterdir() if p.name.endswith(".tmp")] == [
        path.name + ".tmp"  # only the planted one: no temporary file of ours is left
    ]


def _sidecar(state_dir: Path) -> Sidecar:
    return Sidecar(
        SidecarConfig(
            [URL],
            kv_events=[KVEventsSource(URL, "tcp://127.0.0.1:1")],
            state_dir=str(state_dir),
        )
    )


def test_a_second_sidecar_on_the_same_dir_fails_in_one_line(tmp_path):
    first = _sidecar(tmp_path)
    with pytest.raises(InputError) as exc:
        _sidecar(tmp_path)
    message = str(exc.value)
    assert "\n" not in message and f"pid {os.getpid()}" in message and "--state-dir" in message

    asyncio.run(first.stop())  # saves, then lets the next one in
    asyncio.run(_sidecar(tmp_path).stop())


def test_serve_on_a_dir_in_use_exits_2_in_one_line(tmp_path):
    held = statefile.lock_directory(tmp_path)
    try:
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "kvoffload", "serve"),
                *("--target", URL, "--kv-events", "tcp://127.0.0.1:1"),
                *("--state-dir", str(tmp_path), "--listen", "127.0.0.1:0"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        held.close()
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "in use by another kvoffload sidecar" in lines[0], lines


def test_a_sidecar_with_a_poisoned_state_starts_fresh_and_serves(tmp_path, caplog):
    """Before: NaN in the histogram made /api/v1/status answer 500."""
    path = _file(tmp_path)
    raw = _raw(path)
    raw["engines"][0]["histogram"]["total"] = NAN
    raw["bytes_per_block"] = NAN
    _write(path, raw)
    with caplog.at_level(logging.WARNING, "kvoffload.kvevents"):
        sidecar = _sidecar(tmp_path)
    assert sidecar.events[INSTANCE].messages() == 0
    assert any("starting fresh" in r.getMessage() for r in caplog.records)
    json.dumps(sidecar.status(), allow_nan=False)
    text = render_metrics(sidecar.snapshot(), openmetrics=False).decode()
    assert not [line for line in text.splitlines() if line[:1] != "#" and "NaN" in line]

    asyncio.run(sidecar.stop())
    again = persist.load(path, INSTANCE, 1.0, None)  # what it saved at stop is sane
    assert again is not None and again.events.messages() == 0


def test_a_histogram_total_near_zero_gives_no_curve_not_an_infinite_one(tmp_path):
    """A sampled state whose histogram total is 1e-307 (within every range check) scales its
    counts by missed ÷ total = inf: the curve is absent, never inf or NaN ratios (#25 item 4)."""
    state = TargetEvents(0.5, None)
    eng = state.engine(0)
    for i in range(40):
        eng.sequence(i, 1.7e9 + i)
        eng.block_size = 16
        eng._gpu_stored(tuple(range(BASE + 10 * (i % 25), BASE + 10 * (i % 25) + 10)), None)
    path = persist.state_path(tmp_path, INSTANCE)
    persist.save(state, INSTANCE, path, {})
    raw = _raw(path)
    engine = raw["engines"][0]
    engine["histogram"] = {"cold": 0.0, "total": 1e-307, "finite_sum": 0.0}
    for key in ("histogram_exact", "histogram_coarse"):
        engine[key] = bytes(len(engine[key]))
    _write(path, raw)
    loaded = persist.load(path, INSTANCE, 0.5, None)
    assert loaded is not None and loaded.events.engines[0].tracker.sampled
    assert build_curve(loaded.events, 2.0**20) is None
