"""`record` writes strict OpenMetrics, and a killed `record` leaves a journal `analyze` reads.

The targets are two tiny HTTP servers replaying the real vLLM 0.26 bodies captured on an H200
(tests/fixtures/vllm-0.26-h200-capture), one body per request; one switches from a server
without offloading to one with it, the other the other way round, so label sets appear and
disappear mid-recording (as after a vLLM restart), next to histograms, counters' `_created`
and the `instance` label the recorder adds.

prometheus_client 0.26's OpenMetrics parser drops every sample but the first of a series' second
and later points (its duplicate-timestamp filter is only reset when the series changes, not
when the timestamp does), so on any file with several points per histogram series it reports
"+Inf bucket missing". `assert_strict` therefore runs it twice: over the whole file with that
histogram check off (grouping, one TYPE per family, time order, names, '# EOF' — all its other
rules), and over the file cut into one timestamp at a time, unchanged (the histogram rules on
every point).
"""

from __future__ import annotations

import asyncio
import json
import logging
import lzma
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client.openmetrics import parser as om_parser

from kvoffload.ingest import extsort
from kvoffload.ingest.parse import iter_openmetrics, parse_text, read_chunks
from kvoffload.recording.openmetrics import (
    Recording,
    RecordingWriter,
    finalize_journal,
    read_recording,
)

from helpers import free_port, h200_scrapes

KVO = [sys.executable, "-m", "kvoffload"]
SETS = Path(__file__).parent / "fixtures" / "vllm-0.26-h200-ttft"


def assert_strict(text: str) -> int:
    """prometheus_client's OpenMetrics parser accepts `text` (see the module docstring);
    returns the number of samples."""
    check_histogram = om_parser._check_histogram
    om_parser._check_histogram = lambda samples, name: None
    try:
        families = list(om_parser.text_string_to_metric_families(text))
    finally:
        om_parser._check_histogram = check_histogram
    names = [f.name for f in families]
    assert len(names) == len(set(names))
    slices: dict[str, list[str]] = {}
    type_line = ""
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            type_line = line
        elif line and not line.startswith("#"):
            lines = slices.setdefault(line.rsplit(" ", 1)[1], [])
            if type_line not in lines:
                lines.append(type_line)
            lines.append(line)
    total = 0
    for lines in slices.values():
        one = list(om_parser.text_string_to_metric_families("\n".join(lines) + "\n# EOF\n"))
        total += sum(len(f.samples) for f in one)
    assert total == sum(1 for line in text.splitlines() if line and line[0] != "#")
    return total


def promtool_samples(path: Path, tmp: Path) -> int:
    """Backfill the file with promtool (the real consumer of OpenMetrics recordings); returns
    the samples it ingested."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by `make test` (Debian package prometheus)"
    r = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(path), str(tmp)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if re.match(r"[0-9A-Z]{26}\s", line)]
    assert rows, r.stdout
    return sum(int(row[4]) for row in rows)  # NUM SAMPLES


# -- a recording against real vLLM bodies ------------------------------------------------------


def _serve(bodies: dict[str, list[str]]) -> Iterator[dict[str, str]]:
    """One loopback server per name, each answering /metrics with its next body (the last one
    again once they run out). Yields name → URL."""
    loop = asyncio.new_event_loop()
    runners: list[web.AppRunner] = []
    urls: dict[str, str] = {}

    def app_for(seq: list[str]) -> web.Application:
        served = [0]

        async def metrics(_r: web.Request) -> web.Response:
            body = seq[min(served[0], len(seq) - 1)]
            served[0] += 1
            return web.Response(text=body, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        return app

    async def start() -> None:
        for name, seq in bodies.items():
            runner = web.AppRunner(app_for(seq), access_log=None)
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
            urls[name] = f"http://127.0.0.1:{port}/metrics"

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield urls
    finally:
        for runner in runners:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(scope="module")
def vllm_targets() -> Iterator[dict[str, str]]:
    # A replicas A/B: one server with a CPU tier (its offload series created as transfers
    # happen), one without; and a third that restarts mid-recording with a new engine.
    offload = [body for _ts, body in h200_scrapes("8b-offload")]
    plain = [body for _ts, body in h200_scrapes("8b-nooffload")]
    engine1 = [body.replace('engine="0"', 'engine="1"') for body in plain]
    yield from _serve({"a": offload, "b": plain, "c": plain[4:8] + engine1[:4] + plain[:8]})


def targets(urls: dict[str, str]) -> list[str]:
    return [arg for url in urls.values() for arg in ("--target", url)]


def kvo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVO, *args], capture_output=True, text=True, timeout=timeout)


def analyze_json(path: Path) -> dict:
    r = kvo("analyze", str(path), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    doc.pop("source")
    return doc


@pytest.mark.slow
def test_record_writes_openmetrics_that_prometheus_client_and_promtool_accept(
    vllm_targets, tmp_path
):
    out = tmp_path / "run.om"
    r = kvo(
        "record", *targets(vllm_targets), "--interval", "0.15s", "--duration", "3s", "-o", str(out)
    )
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "run.om.partial").exists()
    text = out.read_text()
    samples = assert_strict(text)
    assert text.count("# TYPE vllm:kv_offload_size histogram\n") == 1
    times = {line.rsplit(" ", 1)[1] for line in text.splitlines() if line[:1] != "#"}
    offload = {
        line.rsplit(" ", 1)[1]
        for line in text.splitlines()
        if line.startswith("vllm:kv_offload_size_count{")
    }
    engine1 = {line.rsplit(" ", 1)[1] for line in text.splitlines() if 'engine="1"' in line}
    assert 1 < len(offload) < len(times) / 2 and 1 < len(engine1) < len(times) / 3
    assert promtool_samples(out, tmp_path / "tsdb") == samples
    doc = analyze_json(out)
    assert doc["scrapes"] == len(times)
    assert [g["offloading"] for g in doc["groups"]].count(True) == 1


@pytest.mark.slow
def test_killed_record_leaves_a_journal_analyze_reads_like_the_finished_file(
    vllm_targets, tmp_path
):
    out = tmp_path / "killed.om"
    journal = tmp_path / "killed.om.partial"
    rec = subprocess.Popen(
        [
            *KVO,
            "record",
            *targets(vllm_targets),
            "--interval",
            "0.15s",
            "--duration",
            "1h",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            not journal.exists()
            or journal.read_text().count("# TYPE python_gc_objects_collected counter") < 12
        ):
            time.sleep(0.1)
    finally:
        rec.send_signal(signal.SIGKILL)
        rec.wait(20)
    assert journal.exists() and not out.exists()
    r = kvo("analyze", str(journal), "--json")
    assert r.returncode == 0, r.stderr
    assert "is the journal of a recording that did not finish" in r.stderr
    from_journal = json.loads(r.stdout)
    from_journal.pop("source")
    r = kvo("record", "--finalize", str(journal))
    assert r.returncode == 0, r.stderr
    assert not journal.exists()
    assert analyze_json(out) == from_journal
    assert from_journal["scrapes"] >= 10
    assert assert_strict(out.read_text()) == promtool_samples(out, tmp_path / "tsdb")


# -- the rewrite and the regroup, in process ---------------------------------------------------


def _fixture(set_name: str, server: str) -> str:
    return lzma.decompress((SETS / set_name / f"{server}.om.xz").read_bytes()).decode()


def test_finalize_is_strict_on_recordings_of_earlier_versions(tmp_path):
    """The real captures were written scrape by scrape by an earlier `record` (every `_total`
    before every `_created`): the rewrite makes them strict, and they read the same."""
    src = tmp_path / "B-cpu5.om"
    src.write_text(_fixture("B", "B-cpu5"))
    out = tmp_path / "strict.om"
    scrapes = finalize_journal(str(src), str(out))
    assert scrapes == len(list(read_recording(str(src))))
    assert assert_strict(out.read_text()) == promtool_samples(out, tmp_path / "tsdb")
    assert _scrapes(out) == _scrapes(src)


def _scrapes(path: Path) -> list[tuple[float | None, list]]:
    return [(e.timestamp, sorted(e.samples, key=repr)) for e in read_recording(str(path))]


def test_spilling_to_disk_changes_nothing(tmp_path, monkeypatch):
    """With a budget far below the file, both directions go through sorted runs on disk (and
    a merge of merges): the same bytes out, the same scrapes in."""
    src = tmp_path / "live.om"
    src.write_text(_fixture("live", "cpu4g"))
    in_memory = tmp_path / "in-memory.om"
    finalize_journal(str(src), str(in_memory))
    monkeypatch.setattr(extsort, "BUDGET_CHARS", 20_000)
    monkeypatch.setattr(extsort, "MAX_FAN_IN", 4)
    spilled = tmp_path / "spilled.om"
    finalize_journal(str(src), str(spilled), tmp_dir=str(tmp_path))
    assert spilled.read_bytes() == in_memory.read_bytes()
    with open(in_memory) as fh:
        regrouped = [
            (e.timestamp, e.samples)
            for e in iter_openmetrics(
                read_chunks(fh, 50_000), unordered=True, tmp_dir=str(tmp_path)
            )
        ]
    monkeypatch.undo()
    assert regrouped == [(e.timestamp, e.samples) for e in read_recording(str(in_memory))]
    assert [(ts, sorted(samples, key=repr)) for ts, samples in regrouped] == _scrapes(src)


def test_a_journal_cut_mid_line_loses_only_its_last_scrape(tmp_path, caplog):
    scrapes = h200_scrapes()[:6]
    rec = Recording(str(tmp_path / "cut.om"), instance="vllm:8000")
    for ts, body in scrapes:
        rec.write_exposition(parse_text(body), ts)
    journal = Path(rec.journal)
    text = journal.read_text()
    journal.write_text(text[: len(text) - 300])  # SIGKILL in the middle of the 6th scrape
    with caplog.at_level(logging.WARNING, "kvoffload"):
        read = [(e.timestamp, len(e.samples)) for e in read_recording(str(journal))]
    assert "is the journal of a recording that did not finish" in caplog.text
    assert [ts for ts, _ in read] == [ts for ts, _ in scrapes[:5]]
    out = tmp_path / "cut-finalized.om"
    assert finalize_journal(str(journal), str(out)) == 5
    assert [(e.timestamp, len(e.samples)) for e in read_recording(str(out))] == read
    assert_strict(out.read_text())


def test_a_recording_is_not_overwritten_and_a_missing_file_points_at_its_journal(tmp_path):
    path = str(tmp_path / "r.om")
    rec = Recording(path)
    rec.write_exposition(parse_text(h200_scrapes()[0][1]), 1.8e9)
    r = kvo("record", "--target", "http://127.0.0.1:9/metrics", "-o", path)
    assert r.returncode == 2 and "still running or was killed" in r.stderr
    r = kvo("analyze", path)
    assert r.returncode == 2 and "r.om.partial is there" in r.stderr
    assert rec.close() == 1 and not Path(rec.journal).exists()


def test_a_cut_family_contiguous_file_reads_what_is_there(tmp_path, caplog):
    out = tmp_path / "whole.om"
    src = tmp_path / "src.om"
    src.write_text(_fixture("live", "cpu4g"))
    finalize_journal(str(src), str(out))
    text = out.read_text()
    cut = tmp_path / "cut.om"
    cut.write_text(text[: int(len(text) * 0.9)])
    with caplog.at_level(logging.WARNING, "kvoffload"):
        scrapes = list(read_recording(str(cut)))
    assert "families or series at its end may be missing" in caplog.text
    assert len(scrapes) == len(list(read_recording(str(out))))


def test_each_scrape_of_the_journal_is_strict_on_its_own():
    """Within a scrape, a counter's `_created` comes right after its `_total` and a
    histogram's series stay together, though vLLM's 0.0.4 body lists them apart."""
    import io

    buf = io.StringIO()
    writer = RecordingWriter(buf, instance="vllm:8000")
    writer.write_scrape(h200_scrapes()[-1][1], 1.8e9)
    writer.close()
    assert_strict(buf.getvalue())
