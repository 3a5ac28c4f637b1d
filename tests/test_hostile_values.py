"""Values that are numbers but not believable (issue #25 item 4): +Inf beside -Inf in one
scrape (math.fsum raised), 1e308 twice (its sum overflowed), values so large or so near zero
that the TTFT fit and its quotients overflow to NaN (the JSON could not be written), a
KV-event size from such figures (math.floor of inf), invalid UTF-8 in a family name. Before:
`analyze` exited 1 with a traceback and /api/v1/status answered 500. Now such a value makes
its figures absent (a counter beyond ±1e30 is unknown, like NaN) and both answer; a fuzz of
every sample of a real recording and its KV events holds it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import lzma
import math
import random
import struct
import subprocess
import sys
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp import web

from kvoffload.cli import main
from kvoffload.ingest.parse import Exposition
from kvoffload.kvevents.eventfile import MAGIC, RawMessage, read_event_file
from kvoffload.kvevents.state import TargetEvents
from kvoffload.recording.openmetrics import read_recording
from kvoffload.sidecar.http import make_app
from kvoffload.sidecar.service import Sidecar, SidecarConfig

from helpers import FIXTURES, running

RUN = FIXTURES / "vllm-0.26-h200-ttft" / "B"
HOSTILE_TEXT = ["+Inf", "-Inf", "NaN", "1e308", "-1e308", "1.7976931348623157e308", "1e300"]
HOSTILE_TEXT += ["-1e300", "-1", "-5e18", "0", "5e-324", "1e20", "1e40", "-1e-40"]
HOSTILE = [float(v) for v in HOSTILE_TEXT]
HOSTILE_INTS = [-1, 0, 2**63 - 1, -(2**63), 2**64 - 1, 2**31, 10**12]


def _no_constants(name: str) -> float:
    raise AssertionError(f"{name} in the JSON")


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvoffload", "analyze", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_line_or_ok(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    if r.returncode == 0:
        json.loads(r.stdout, parse_constant=_no_constants)
    else:
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr


def _strict(path: Path, values: list[list[str]]) -> None:
    """A strict-layout recording: one series per column of `values`, a scrape per row."""
    lines = ["# TYPE vllm:prompt_tokens counter"]
    for engine in range(len(values[0])):
        for i, row in enumerate(values):
            labels = f'engine="{engine}",instance="a:1",job="vllm",model_name="m"'
            lines.append(f"vllm:prompt_tokens_total{{{labels}}} {row[engine]} {1.7e9 + 15 * i}")
    path.write_text("\n".join(lines) + "\n# EOF\n")


@pytest.mark.parametrize(
    "values",
    [
        [["100", "100"], ["+Inf", "-Inf"], ["300", "300"], ["400", "400"]],
        [["100", "100"], ["1e308", "1e308"], ["1e308", "1e308"], ["400", "400"]],
        [["1", "2"], ["1e300", "-1e300"], ["1e40", "5e-324"], ["4", "5"]],
    ],
    ids=["inf-and-minus-inf", "1e308-twice", "huge-and-tiny"],
)
def test_non_finite_or_huge_values_in_one_scrape_are_read(tmp_path, values):
    path = tmp_path / "hostile.om"
    _strict(path, values)
    r = _analyze(str(path), "--json")
    assert r.returncode == 0, r.stderr
    _one_line_or_ok(r)
    (group,) = json.loads(r.stdout)["groups"]
    # The scrapes holding such a value are unknown: no rate is made of them.
    assert group["figures"]["prompt_tokens_per_second"] is None


@pytest.mark.parametrize("journal", [False, True], ids=["strict", "journal"])
@pytest.mark.parametrize("where", ["family", "label"])
def test_invalid_utf8_in_a_name_is_one_line(tmp_path, journal, where):
    name = b"vllm:prompt_tok\xffens" if where == "family" else b"vllm:prompt_tokens"
    value = b"\xff" if where == "label" else b"m"
    head = b"# kvoffload recording journal of x\n" if journal else b""
    body = head
    for i in range(3):
        if journal or i == 0:
            body += b"# TYPE " + name + b" counter\n"
        body += (
            name + b'_total{instance="a:1",model_name="' + value + b'"} %d %d\n' % (i, 1.7e9 + i)
        )
    path = tmp_path / "utf8.om"
    path.write_bytes(body + b"# EOF\n")
    r = _analyze(str(path))
    assert r.returncode == 2 and "invalid UTF-8" in r.stderr and r.stderr.count("\n") == 1


def test_a_pipe_is_one_line(tmp_path):
    r = subprocess.run(
        f"{sys.executable} -m kvoffload analyze <(cat {RUN / 'B-cpu10.om.xz'} | xz -dc)",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "not a regular file" in r.stderr and "Traceback" not in r.stderr


# -- the fuzz: a real recording and its KV events, every number open to attack ---------------
@pytest.fixture(scope="module")
def real_run() -> tuple[list[str], list[RawMessage]]:
    lines = lzma.decompress((RUN / "B-cpu10.om.xz").read_bytes()).decode().split("\n")
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(
            _tmp_file(lzma.decompress((RUN / "B-cpu10.kvev.xz").read_bytes()))
        )
        messages = list(read_event_file(tmp))
    return lines, messages


@contextlib.contextmanager
def _tmp_file(data: bytes):
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".kvev") as fh:
        fh.write(data)
        fh.flush()
        yield fh.name


def _mutated_lines(lines: list[str], rng: random.Random, share: float) -> str:
    out = []
    for line in lines:
        if line and line[0] != "#" and rng.random() < share:
            head, _value, stamp = line.rsplit(" ", 2)
            value = rng.choice(HOSTILE_TEXT) if rng.random() < 0.8 else repr(rng.uniform(-1e6, 1e6))
            line = f"{head} {value} {stamp}"
        out.append(line)
    return "\n".join(out)


def _number(rng: random.Random, value: object) -> object:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        return rng.choice(HOSTILE)
    if isinstance(value, int):
        return rng.choice(HOSTILE_INTS)
    return value


def _mutated_message(rng: random.Random, msg: RawMessage, share: float) -> RawMessage:
    """The message with its numbers (the batch's time, block sizes, hashes, the sequence
    number, the time it was received) replaced at random."""
    payload = list(msgspec.msgpack.decode(msg.payload))
    if rng.random() < share:
        payload[0] = _number(rng, payload[0])
    events = []
    for event in payload[1]:
        event = dict(event)
        for key in ("block_size", "group_idx", "parent_block_hash"):
            if rng.random() < share:
                event[key] = _number(rng, event.get(key) if event.get(key) is not None else 1)
        if rng.random() < share and event.get("block_hashes"):
            event["block_hashes"] = [_number(rng, h) for h in event["block_hashes"]]
        events.append(event)
    payload[1] = events
    received = msg.received_at if rng.random() >= share else float(rng.choice(HOSTILE))
    seq = msg.seq if rng.random() >= share else int(rng.choice(HOSTILE_INTS))
    return RawMessage(msg.dp_rank, seq, received, msg.topic, msgspec.msgpack.encode(payload))


def _write_events(path: Path, messages: list[RawMessage]) -> None:
    enc = msgspec.msgpack.Encoder()
    with path.open("wb") as fh:
        fh.write(MAGIC)
        for m in messages:
            record = enc.encode([m.dp_rank, m.seq, m.received_at, m.topic, m.payload])
            fh.write(struct.pack(">I", len(record)) + record)


FUZZ_RUNS = 24


@pytest.mark.slow
def test_fuzzed_values_of_a_real_recording_never_crash_analyze(tmp_path, real_run):
    """Random NaN, ±Inf, 1e308, negative, denormal values in every sample (or a share of
    them) of a real vLLM 0.26 recording and its KV events: `analyze` exits 0 with JSON that
    holds no NaN, or 2 with one line; never a traceback."""
    lines, messages = real_run
    rec, events = tmp_path / "rec.om", tmp_path / "rec.kvev"
    outcomes = []
    for seed in range(FUZZ_RUNS):
        rng = random.Random(seed)
        rec.write_text(_mutated_lines(lines, rng, rng.choice([1.0, 0.5, 0.05, 0.005])))
        args = ["analyze", str(rec), "--json"]
        if seed % 3:
            share = rng.choice([0.0, 0.5, 0.05, 0.005])
            _write_events(events, [_mutated_message(rng, m, share) for m in messages])
            args += ["--events", str(events)]
        if seed % 4 == 0:
            args += ["--memory-limit", "16GiB"]
        out, err = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(args)
            except SystemExit as exc:
                code = int(exc.code or 0)
        assert code in (0, 2), (seed, err.getvalue()[-500:])
        if code == 0:
            json.loads(out.getvalue(), parse_constant=_no_constants)
        else:
            assert err.getvalue().count("\n") == 1, (seed, err.getvalue())
        outcomes.append(code)
    assert outcomes.count(0) >= FUZZ_RUNS // 2  # most are read: the figures that can be, are


def _body(expo: Exposition, rng: random.Random, share: float) -> str:
    """A scrape of the recording as vLLM serves it, its values replaced at random."""

    def text(v: float) -> str:
        return "NaN" if v != v else ("+Inf" if v > 0 else "-Inf") if math.isinf(v) else repr(v)

    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    lines = [f"# TYPE {family} {mtype}" for family, mtype in expo.families.items()]
    for name, labels, value, _ in expo.samples:
        if rng.random() < share:
            value = rng.choice(HOSTILE) if rng.random() < 0.8 else rng.uniform(-1e6, 1e6)
        pairs = ",".join(
            f'{k}="{esc(v)}"' for k, v in labels.items() if k not in ("instance", "job")
        )
        lines.append(f"{name}{{{pairs}}} {text(value)}")
    return "\n".join(lines) + "\n"


async def _serve_fuzzed(seed: int, scrapes: list[Exposition], messages: list[RawMessage]) -> dict:
    rng = random.Random(seed)
    share, event_share = [(1.0, 0.0), (0.3, 0.3), (0.05, 0.05), (0.005, 0.5)][seed % 4]
    served = [0]

    async def hostile(_r: web.Request) -> web.Response:
        served[0] += 1
        body = _body(scrapes[served[0] % len(scrapes)], rng, share)
        return web.Response(text=body, content_type="text/plain")

    target = web.Application()
    target.router.add_get("/metrics", hostile)
    answers: dict[tuple[str, int], int] = {}
    async with running(target) as target_port:
        sidecar = Sidecar(
            SidecarConfig(
                [f"http://127.0.0.1:{target_port}/metrics"],
                interval_seconds=0.05,
                window_seconds=60,
            )
        )
        events = TargetEvents()
        sidecar.events[sidecar.targets[0].name] = events  # as if subscribed
        async with running(make_app(sidecar)) as port, aiohttp.ClientSession() as s:
            for step in range(12):
                for m in messages[step * 100 : (step + 1) * 100]:
                    events.ingest_message(_mutated_message(rng, m, event_share))
                await asyncio.sleep(0.06)
                for path in ("/metrics", "/api/v1/status", "/api/v1/history", "/healthz"):
                    async with s.get(f"http://127.0.0.1:{port}{path}") as r:
                        key = (path, r.status)
                        answers[key] = answers.get(key, 0) + 1
                        text = await r.text()
                    if path == "/api/v1/status" and r.status == 200:
                        json.loads(text, parse_constant=_no_constants)
                    if path == "/metrics" and r.status == 200:
                        samples = [ln for ln in text.splitlines() if ln and ln[0] != "#"]
                        assert all(math.isfinite(float(ln.rsplit(" ", 1)[1])) for ln in samples)
            assert sidecar.targets[0].scrapes > 0
    return answers


def test_a_sidecar_fed_fuzzed_values_never_500s(real_run):
    """The same values served by a live target (and its KV events taken in): /metrics,
    /api/v1/status and the history answer 200 throughout, with no NaN or Inf in them."""
    lines, messages = real_run
    with _tmp_file("\n".join(lines).encode()) as path:
        scrapes = list(read_recording(path))
    for seed in range(4):
        answers = asyncio.run(_serve_fuzzed(seed, scrapes, messages))
        assert {status for _path, status in answers} == {200}, (seed, answers)
