"""Progress of long work on stderr (#13 item 5): a line rewritten in place on a terminal, only a
final line (or nothing) elsewhere, never on stdout. `record` on a real pseudo-terminal, and
`analyze FILE` with bytes read seen from outside the reader."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvoffload import cli as cli_module
from kvoffload.cli import analyze as analyze_command
from kvoffload.fleet.options import ReadProgress
from kvoffload.progress import FileReadProgress, Progress
from kvoffload.recording.openmetrics import RecordingWriter

from helpers import SAMPLE, free_port

KVO = [sys.executable, "-m", "kvoffload"]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_on_a_terminal_the_line_is_rewritten_in_place_once_due():
    out, clock = io.StringIO(), Clock()
    p = Progress(stream=out, tty=True, every=0.2, show_after=1.0, clock=clock)
    p.update("a")
    assert out.getvalue() == ""  # not before show_after: a short run prints nothing
    clock.now += 1.0
    p.update("b")
    p.update("c")  # within `every` of the last: not drawn
    clock.now += 0.3
    p.update("d")
    assert out.getvalue() == "\rb\x1b[K\rd\x1b[K"
    p.note("kvoffload: warning: x")  # a line of its own, then the progress line again
    assert out.getvalue().endswith("\r\x1b[Kkvoffload: warning: x\nd\x1b[K")
    p.finish("done")
    assert out.getvalue().endswith("\rdone\x1b[K\n")


def test_a_short_run_on_a_terminal_prints_nothing():
    out, clock = io.StringIO(), Clock()
    p = Progress(stream=out, tty=True, show_after=1.0, clock=clock)
    p.update("a")
    clock.now += 0.5
    p.finish("done")
    assert out.getvalue() == ""


def test_off_a_terminal_only_a_final_line_for_long_work():
    out, clock = io.StringIO(), Clock()
    p = Progress(stream=out, tty=False, final_after=5.0, clock=clock)
    p.update("a")
    p.note("a warning")
    clock.now += 1.0
    p.finish("short")
    assert out.getvalue() == "a warning\n"  # no control characters, no final line
    p = Progress(stream=out, tty=False, final_after=5.0, clock=clock)
    clock.now += 6.0
    p.update("x")
    p.finish()
    assert out.getvalue() == "a warning\nx\n"


def test_clear_takes_the_line_off_the_terminal():
    out = io.StringIO()
    p = Progress(stream=out, tty=True)
    p.update("a")
    p.clear()
    p.clear()  # once is enough
    assert out.getvalue() == "\ra\x1b[K\r\x1b[K"


def test_the_fleet_read_progress_is_the_same_line():
    """analyze --prometheus: the line as before, the last one written off a terminal too."""

    class Stats:
        done, instances, points, questions, errors = 5, 5, 1234, 10, {"x": "boom"}

    out = io.StringIO()
    p = ReadProgress(stream=out, tty=False)
    p(Stats())
    p.finish()
    assert re.fullmatch(
        r"read 5/5 instances, 1,234 points in 10 questions, \d+\.\d s, 1 failed\n", out.getvalue()
    )


def test_bytes_read_are_seen_from_the_descriptor(tmp_path):
    path = tmp_path / "big.om"
    path.write_bytes(b"x" * 300_000)
    reading = FileReadProgress(str(path), Progress(stream=io.StringIO(), tty=False))
    reading.poll()
    assert reading.offset == 0 and "of" not in reading.line()  # not open yet: items only
    with open(path, "rb", buffering=0) as fh:
        fh.read(100_000)
        reading.poll()
        assert reading.offset == 100_000
        assert "97.7 KiB of 293.0 KiB (33 %)" in reading.line()
        fh.read()
        reading.poll()
        fh.seek(0)  # a second pass after reading to the end
        fh.read(10)
        reading.poll()
    assert reading.passes == 2 and "pass 2" in reading.line()
    reading.poll()  # closed: the last offset stays
    assert reading.offset == 10


def test_a_mapped_file_shows_no_made_up_bytes(tmp_path):
    """A reader that maps the file (the mapping holds a descriptor at offset 0): items only."""
    import mmap

    path = tmp_path / "big.om"
    path.write_bytes(b"x" * 300_000)
    reading = FileReadProgress(str(path), Progress(stream=io.StringIO(), tty=False))
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    with mm:
        assert mm.find(b"y") == -1
        reading.poll()
        assert "of" not in reading.line() and "%" not in reading.line()


def _big_recording(path: Path, scrapes: int) -> None:
    """`scrapes` scrapes of the sample, one second apart, written fast: one scrape rendered
    by the writer, the others by changing its timestamps."""
    buf = io.StringIO()
    RecordingWriter(buf, instance="vllm:8000").write_scrape(SAMPLE.read_text(), 1_000_000.0)
    one = buf.getvalue()
    assert one.count(" 1000000.0\n") > 100
    with open(path, "w") as fh:
        for i in range(scrapes):
            fh.write(one.replace(" 1000000.0\n", f" {1_000_000.0 + i!r}\n"))
        fh.write("# EOF\n")


def test_analyze_shows_bytes_read_on_stderr_and_keeps_stdout_json(tmp_path, monkeypatch):
    rec = tmp_path / "rec.om"
    _big_recording(rec, 300)
    size_mib = rec.stat().st_size / 2**20
    # As on a terminal, shown from the start and often (the file reads in well under a second)
    made: list[Progress] = []

    def progress(**kw):
        made.append(Progress(**{**kw, "tty": True, "show_after": 0.0, "every": 0.005}))
        return made[-1]

    monkeypatch.setattr(analyze_command, "Progress", progress)
    result = CliRunner().invoke(cli_module.cli, ["analyze", str(rec), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # stdout is the JSON alone
    assert doc["scrapes"] == 300
    lines = result.stderr.split("\r")
    live = [
        # (the general reader's descriptor tells the bytes; the scrapes are counted at the end)
        re.match(r"reading rec\.om: ([\d.]+) MiB of ([\d.]+) MiB \((\d+) %\)", x)
        for x in lines
    ]
    live = [m for m in live if m]
    assert live, result.stderr[:2000]
    assert all(float(m.group(2)) == pytest.approx(size_mib, abs=0.06) for m in live)
    assert re.search(r"read rec\.om: [\d.]+ MiB, 300 scrapes in [\d.]+ s\x1b\[K\n$", result.stderr)


def test_analyze_of_a_small_file_off_a_terminal_prints_nothing_on_stderr():
    r = subprocess.run(
        [*KVO, "analyze", str(SAMPLE), "--json"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
    json.loads(r.stdout)


@pytest.fixture
def sample_server(fixtures_http: str) -> str:
    """The sample as a /metrics endpoint, on the run's one fixture file server."""
    return f"{fixtures_http}/{SAMPLE.name}"


def _record_args(url: str, out: Path) -> list[str]:
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    return [
        *KVO,
        "record",
        "--target",
        url,
        "--target",
        dead,
        "--interval",
        "0.3s",
        "--duration",
        "2s",
        "--scrape-timeout",
        "1s",
        "-o",
        str(out),
    ]


def test_record_shows_scrapes_and_failures_on_a_terminal(sample_server, tmp_path):
    """A real pseudo-terminal on stderr: the line is rewritten as scrapes land, each failure's
    warning sits on a line of its own, and the final line stays."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        _record_args(sample_server, tmp_path / "rec.om"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    stdout = proc.stdout.read() if proc.stdout else b""
    assert proc.wait(30) == 0
    err = b"".join(chunks).decode()
    assert stdout == b""
    counts = [
        (int(w), int(f))
        for w, f in re.findall(
            r"\rrecording 2 target\(s\) every 0\.3 s: (\d+) scrapes written, (\d+) failed, ", err
        )
    ]
    assert len(counts) >= 3, err
    assert counts == sorted(counts) and counts[-1][0] >= 5 and counts[-1][1] >= 5, counts
    # warnings on their own lines, the progress line cleared first
    assert "\r\x1b[Kkvoffload: warning: " in err and "cannot connect" in err
    final = re.search(r"wrote (\d+) scrapes to \S+rec\.om \((\d+) failed\)", err)
    assert final and int(final.group(1)) >= 5 and int(final.group(2)) >= 5, err


def test_record_off_a_terminal_writes_no_progress_line(sample_server, tmp_path):
    r = subprocess.run(
        _record_args(sample_server, tmp_path / "rec.om"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and "\r" not in r.stderr and "\x1b" not in r.stderr
    lines = r.stderr.splitlines()
    assert all(x.startswith("kvoffload: warning: ") for x in lines[:-1]), lines
    assert re.fullmatch(r"wrote \d+ scrapes to \S+rec\.om \(\d+ failed\)", lines[-1])
