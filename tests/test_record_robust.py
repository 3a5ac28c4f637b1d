"""`record` and `analyze` against what stops or breaks a recording (issue #12, attack 8, and the
chunk boundaries of attack 6): SIGTERM, SIGKILL and a file cut at any byte, a full disk, an
output that is a device, a directory that cannot be written; and the general reader, whose
answer must not depend on how much it reads at a time.

The recordings are real: `kvoffload record` processes scraping a loopback server that replays
the vLLM 0.26 bodies captured on an H200, their `model_name` made non-ASCII ("modèle-模型") so
that a cut can fall inside a multi-byte character.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import random
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_recording_strict import assert_strict, promtool_samples

from kvoffload.analysis.analyze import (
    analyze_window,
    window_from_expositions,
    window_from_recording,
)
from kvoffload.cli import main
from kvoffload.errors import InputError
from kvoffload.ingest.catalog import WANTED_FAMILIES, wanted
from kvoffload.ingest.parse import ParseError, parse_text
from kvoffload.recording import openmetrics as recording_module
from kvoffload.recording.openmetrics import CHUNK, Recording, RecordingWriter, read_recording

from helpers import free_port, h200_scrapes

KVO = [sys.executable, "-m", "kvoffload"]
NAME = "modèle-模型"


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    """A loopback /metrics replaying the real H200 bodies one per request, then again."""
    bodies = [
        body.replace('model_name="', f'model_name="{NAME}-')
        for _ts, body in h200_scrapes("8b-offload")
    ]
    served = [0]

    async def metrics(_r: web.Request) -> web.Response:
        served[0] += 1
        return web.Response(text=bodies[served[0] % len(bodies)], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    port = free_port()

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _record(target: str, out: Path, *extra: str, **popen: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*KVO, "record", "--target", target, "--interval", "0.1s", "-o", str(out), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,  # type: ignore[arg-type]
    )


def _wait_for_scrapes(journal: Path, n: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while (
        not journal.exists() or journal.read_bytes().count(b"# TYPE vllm:num_requests_running ") < n
    ):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("kvoffload: error: "), stderr
    return lines[0]


@pytest.fixture(scope="module")
def killed_journal(target: str, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The journal a `record` killed with SIGKILL leaves, after 8 scrapes."""
    out = tmp_path_factory.mktemp("killed") / "run.om"
    proc = _record(target, out, "--duration", "1h")
    try:
        _wait_for_scrapes(Path(str(out) + ".partial"), 8, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=20)
    assert not out.exists()
    return Path(str(out) + ".partial").read_bytes()


# -- signals ------------------------------------------------------------------------------------


def test_sigterm_closes_the_recording_like_ctrl_c(target, tmp_path):
    out = tmp_path / "run.om"
    proc = _record(target, out, "--duration", "1h")
    try:
        _wait_for_scrapes(tmp_path / "run.om.partial", 4, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        _stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "interrupted; closing the recording" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "run.om.partial").exists()
    text = out.read_text(encoding="utf-8")
    assert text.endswith("\n# EOF\n") and NAME in text
    samples = assert_strict(text)
    assert promtool_samples(out, tmp_path / "tsdb") == samples


# -- a recording cut at any byte ------------------------------------------------------------------


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`kvoffload ARGS` in this process: (exit code, stdout, stderr). Anything but a clean
    exit (a traceback) fails the test."""
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _whole_scrapes(data: bytes) -> int:
    """Scrapes a reader can trust in a journal cut after `data`: every timestamp of its whole
    sample lines but the last (that scrape may be partial: nothing after it says otherwise)."""
    stamps = {
        line.rsplit(b" ", 1)[1]
        for line in data.split(b"\n")[:-1]
        if line and not line.startswith(b"#")
    }
    return max(0, len(stamps) - 1)


def _multibyte_cuts(data: bytes) -> list[int]:
    """Offsets inside a multi-byte character: in the 2nd byte of 'è', in 2nd and 3rd of '模'."""
    cuts = []
    for m in re.finditer(NAME.encode(), data):
        if m.start() > len(data) // 2:
            e, mo = m.start() + 4, m.start() + len("modèle-".encode())
            cuts += [e, mo + 1, mo + 2]
        if len(cuts) >= 6:
            break
    return cuts


def test_analyze_reads_a_journal_cut_at_any_byte(killed_journal, tmp_path, capsys):
    data = killed_journal
    rng = random.Random(12)
    cuts = sorted(rng.sample(range(1, len(data)), 30) + _multibyte_cuts(data))
    line_ends = [m.end() for m in re.finditer(b"\n", data)]
    cuts += [line_ends[len(line_ends) // 2], line_ends[len(line_ends) // 2] - 3]
    cuts += [1, line_ends[0] - 1, line_ends[0], line_ends[1] - 2, line_ends[1], line_ends[2] - 4]
    for i, cut in enumerate(cuts):
        path = tmp_path / f"cut{i}.om.partial"
        path.write_bytes(data[:cut])
        code, out, err = _cli(["analyze", str(path), "--json"], capsys)
        whole = _whole_scrapes(data[:cut])
        # The last whole scrape can be taken for a partial one too: when the lines after
        # it are all of families analyze does not read, nothing it reads says it ended.
        if code == 2:
            assert whole <= 1, (cut, err)
            assert "truncated recording" in _one_line(err), err
            continue
        assert code == 0, (cut, err)
        assert whole - 1 <= json.loads(out)["scrapes"] <= whole, cut
        assert "is the journal of a recording that did not finish" in err, (cut, err)
        line = int(err.split("truncated at line ")[1].split()[0])
        assert line == data[:cut].count(b"\n"), (cut, err)  # the lines it could read
        assert "Traceback" not in err


def test_repair_restores_what_promtool_reads_from_a_cut_journal(killed_journal, tmp_path, capsys):
    data = killed_journal
    for i, cut in enumerate([*_multibyte_cuts(data)[:2], len(data) * 2 // 3, len(data) - 1]):
        journal = tmp_path / f"r{i}.om.partial"
        journal.write_bytes(data[:cut])
        code, cut_json, _err = _cli(["analyze", str(journal), "--json"], capsys)
        assert code == 0
        code, _out, err = _cli(["record", "--repair", str(journal)], capsys)
        assert code == 0, err
        out = tmp_path / f"r{i}.om"
        assert not journal.exists() and out.exists()
        text = out.read_text(encoding="utf-8")
        samples = assert_strict(text)
        assert promtool_samples(out, tmp_path / f"tsdb{i}") == samples
        code, repaired_json, _err = _cli(["analyze", str(out), "--json"], capsys)
        assert code == 0
        cut_doc, repaired_doc = json.loads(cut_json), json.loads(repaired_json)
        cut_doc.pop("source"), repaired_doc.pop("source")
        # Every scrape but the last, possibly partial one; analyze may have dropped one more
        # (see above), else the figures are the same.
        assert repaired_doc["scrapes"] == _whole_scrapes(data[:cut])
        if repaired_doc["scrapes"] == cut_doc["scrapes"]:
            assert repaired_doc == cut_doc
        else:
            assert repaired_doc["scrapes"] == cut_doc["scrapes"] + 1


def _strict(journal: bytes, tmp_path: Path) -> bytes:
    src = tmp_path / "whole.om.partial"
    src.write_bytes(journal)
    recording_module.finalize_journal(str(src), str(tmp_path / "whole.om"))
    return (tmp_path / "whole.om").read_bytes()


def test_a_strict_recording_cut_at_any_byte_reads_and_repairs(killed_journal, tmp_path, capsys):
    data = _strict(killed_journal, tmp_path)
    capsys.readouterr()  # the journal's own warning (killed)
    rng = random.Random(7)
    first = [m.end() for m in re.finditer(b"\n", data[:4096])]
    early = [1, first[0] - 1, first[0], first[0] + 7, first[1], first[2] - 1]
    for i, cut in enumerate(early + sorted(rng.sample(range(1, len(data)), 12))):
        path = tmp_path / f"s{i}.om"
        path.write_bytes(data[:cut])
        code, out, err = _cli(["analyze", str(path), "--json"], capsys)
        if code == 2:  # cut before a whole first point: said in one line
            line = _one_line(err)
            assert "truncated recording" in line or "cut short" in line or "cut before" in line
            continue
        assert code == 0 and json.loads(out)["scrapes"] >= 1, err
        assert "truncated recording: no '# EOF' after line" in err, err
        if i % 4 == 2:
            code, _out, err = _cli(["record", "--repair", str(path)], capsys)
            assert code == 0, err
            assert promtool_samples(path, tmp_path / f"tsdb{i}") == assert_strict(
                path.read_text(encoding="utf-8")
            )


def _figures(path: Path, fast: bool) -> str:
    if fast:
        win, n, lifetime = window_from_recording(str(path))
    else:
        win, n, lifetime = window_from_expositions(
            read_recording(str(path), wanted, WANTED_FAMILIES)
        )
    return json.dumps([n, analyze_window(win, lifetime=lifetime)], sort_keys=True)


def test_the_fast_readers_agree_with_the_general_one_on_cut_files(killed_journal, tmp_path):
    logging.disable(logging.WARNING)
    try:
        strict = _strict(killed_journal, tmp_path)
        rng = random.Random(3)
        for kind, data in (("journal", killed_journal), ("strict", strict)):
            for i, cut in enumerate(rng.sample(range(len(data) // 4, len(data)), 6)):
                path = tmp_path / f"{kind}{i}.om"
                path.write_bytes(data[:cut])
                assert _figures(path, fast=True) == _figures(path, fast=False), (kind, cut)
    finally:
        logging.disable(logging.NOTSET)


# -- what the output cannot take ----------------------------------------------------------------


def test_an_output_that_is_a_device_is_refused_in_one_line(target, tmp_path):
    link = tmp_path / "full.om"
    link.symlink_to("/dev/full")
    fifo = tmp_path / "fifo.om"
    os.mkfifo(fifo)
    for out in (link, fifo):
        proc = _record(target, out, "--duration", "1s")
        _stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 2
        assert "not a regular file" in _one_line(stderr)
        assert not Path(str(out) + ".partial").exists()
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def _ignore_sigxfsz_and_limit_files(size: int):
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return pre


def test_a_full_disk_stops_the_recording_in_one_line_and_keeps_what_was_written(
    target, tmp_path, capsys
):
    """A file size limit stands for the full disk: writes past it fail (EFBIG) as they would
    with ENOSPC. Before: two tracebacks, exit 1."""
    out = tmp_path / "run.om"
    proc = _record(
        target, out, "--duration", "1h", preexec_fn=_ignore_sigxfsz_and_limit_files(400_000)
    )
    _stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    line = _one_line(stderr)
    assert "File too large: recording stopped after" in line and "run.om.partial" in line
    journal = tmp_path / "run.om.partial"
    scrapes = int(re.search(r"stopped after (\d+) scrapes", line).group(1))
    assert scrapes >= 2 and journal.stat().st_size == 400_000
    code, out_json, err = _cli(["analyze", str(journal), "--json"], capsys)
    assert code == 0 and json.loads(out_json)["scrapes"] == scrapes, err
    code, _out, err = _cli(["record", "--repair", str(journal)], capsys)
    assert code == 0, err
    assert promtool_samples(out, tmp_path / "tsdb") == assert_strict(out.read_text())


def _without_dac_override() -> list[str]:
    """A command prefix under which root obeys file modes (setpriv drops the capabilities
    that let it write anywhere)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) drops root's override of file modes"
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


def test_permission_errors_are_one_line_and_exit_2(target, tmp_path):
    proc = subprocess.run(
        [*KVO, "record", "--target", target, "--duration", "1s", "-o", "/sys/kvoffload.om"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "/sys/kvoffload.om.partial: Permission denied" in _one_line(proc.stderr)
    # The directory turns read-only while recording: the journal stays, said in one line.
    work = tmp_path / "work"
    work.mkdir()
    out = work / "run.om"
    proc2 = subprocess.Popen(
        [
            *_without_dac_override(),
            *KVO,
            "record",
            "--target",
            target,
            "--interval",
            "0.1s",
            "--duration",
            "1h",
            "-o",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for_scrapes(work / "run.om.partial", 2, proc2)
        work.chmod(0o555)
    finally:
        proc2.send_signal(signal.SIGTERM)
        _stdout, stderr = proc2.communicate(timeout=60)
        work.chmod(0o755)
    assert proc2.returncode == 2
    line = _one_line(stderr.replace("kvoffload: interrupted; closing the recording\n", ""))
    assert "Permission denied; the recording stays in" in line
    assert (work / "run.om.partial").read_bytes().endswith(b"# EOF\n")


# -- the general reader's chunks ------------------------------------------------------------------


def _outcome(path: Path, chunk: int) -> tuple[str, object]:
    try:
        scrapes = read_recording(str(path), wanted, WANTED_FAMILIES, chunk_size=chunk)
        return "read", [(e.timestamp, e.samples, sorted(e.families.items())) for e in scrapes]
    except (InputError, ParseError) as exc:
        return "refused", str(exc)


@pytest.fixture(scope="module")
def small_journal(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    rec = Recording(str(tmp_path_factory.mktemp("small") / "j.om"), instance="vllm:8000")
    for ts, body in h200_scrapes()[:3]:
        rec.write_exposition(parse_text(body.replace("qwen3", NAME)), ts)
    rec.close()  # the strict file; its lines make the base of both layouts below
    return Path(rec.path).read_text(encoding="utf-8").splitlines(keepends=True)


_MUTATIONS = st.lists(
    st.tuples(
        st.floats(0, 1),
        st.sampled_from(["unterminated", "cut", "garbage", "earlier", "duplicate"]),
        st.integers(1, 40),
    ),
    min_size=1,
    max_size=3,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    mutations=_MUTATIONS,
    journal=st.booleans(),
    cut=st.one_of(st.none(), st.floats(0, 1)),
    chunks=st.lists(st.integers(64, 8192), min_size=4, max_size=4),
)
def test_what_is_accepted_does_not_depend_on_the_read_chunks(
    small_journal, tmp_path, mutations, journal, cut, chunks
):
    """The same bytes, read in blocks of random sizes: read the same or refused with the same
    error. Mutations put lines where the reader skips without looking (an unterminated label
    set inside a run of histogram buckets it does not read), cut lines and timestamps that go
    back, in either layout (a journal streams, a strict file is sorted)."""
    lines = list(small_journal)
    if journal:  # scrape by scrape: each timestamp's lines again under their TYPE lines
        by_ts: dict[str, list[str]] = {}
        family = ""
        for line in lines:
            if line.startswith("# TYPE"):
                family = line
            elif line[0] != "#":
                block = by_ts.setdefault(line.rsplit(" ", 1)[1], [])
                if family not in block:
                    block.append(family)
                block.append(line)
        lines = [line for block in by_ts.values() for line in block] + ["# EOF\n"]
    buckets = [i for i, line in enumerate(lines) if "_bucket{" in line]
    for where, kind, size in mutations:
        i = min(len(lines) - 2, int(where * (len(lines) - 1)))
        if kind == "unterminated":  # inside a run of buckets, where the reader skips
            i = buckets[min(len(buckets) - 1, int(where * len(buckets)))]
        line = lines[i]
        new = {
            "unterminated": line[: line.find("{") + 1 + size] + "\n" if "{" in line else line,
            "cut": line[: size % max(1, len(line) - 1)] + "\n",
            "garbage": "garbage " * (size % 3 + 1) + "\n",
            "earlier": line.rsplit(" ", 1)[0] + " 1000.0\n" if line[0] != "#" else line,
            "duplicate": line,
        }[kind]
        lines.insert(i + 1, new)
    text = "".join(lines)
    if cut is not None:
        text = text[: int(cut * len(text))]
    path = tmp_path / "mutated.om"
    path.write_text(text, encoding="utf-8")
    expected = _outcome(path, CHUNK)
    for chunk in chunks:
        assert _outcome(path, chunk) == expected, chunk


def test_a_journal_that_goes_back_in_time_is_refused_wherever_it_does(tmp_path):
    """Scrape by scrape (TYPE lines again each scrape), a scrape stamped earlier than the one
    before: refused at its line, near the start as past 16 MiB. Before, the layout was told
    from the first 16 MiB: near the start the file was sorted and read (rc 0), the same
    bytes further in were refused (rc 2)."""
    scrapes = [body for _ts, body in h200_scrapes()]

    def journal(n: int, start: float) -> str:
        buf = io.StringIO()
        writer = RecordingWriter(buf, instance="vllm:8000")
        for k in range(n):
            writer.write_scrape(scrapes[k % len(scrapes)], start + k)
        return buf.getvalue()

    early = journal(2, 1.8e9 + 10) + journal(1, 1.8e9) + journal(3, 1.8e9 + 20)
    padding = journal(1 + 17 * 2**20 // len(journal(1, 0)), 1.7e9)
    late = padding + early
    for name, text in (("early", early), ("late", late)):
        path = tmp_path / f"{name}.om"
        path.write_text(text + "# EOF\n")
        kind, error = _outcome(path, CHUNK)
        assert kind == "refused" and "goes back in time" in str(error), (name, error)
