"""`record --repair` on what is not a recording (issue #25, attack 6): before, a one-line JSON
or a blob without a newline was rewritten to `# EOF` (exit 0), /dev/zero grew to 13 GB and a
FIFO hung. Now each is refused in one line, exit 2, the input left byte for byte; a real
recording cut short is still repaired."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.ingest.parse import parse_text
from kvoffload.recording.openmetrics import JOURNAL_MARK, RecordingWriter

KVO = [sys.executable, "-m", "kvoffload"]
BODY = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="m"} 3\n'
    "# TYPE vllm:prompt_tokens counter\n"
    'vllm:prompt_tokens_total{model_name="m"} 100\n'
)


def _repair(path: Path, *extra: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KVO, "record", "--repair", str(path), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("kvoffload: error: "), proc.stderr
    return lines[0]


def _journal(scrapes: int) -> bytes:
    out = io.StringIO()
    writer = RecordingWriter(out, "host:8000", header=f"{JOURNAL_MARK} of run.om")
    for i in range(scrapes):
        writer.write_exposition(parse_text(BODY), 1_700_000_000.0 + 15 * i)
    return out.getvalue().encode()


@pytest.mark.parametrize(
    "content",
    [
        b'{"model": "m", "hit_ratio": 0.4}',  # a one-line JSON, no newline
        b'{"model": "m", "hit_ratio": 0.4}\n',  # and with one
        b"x" * (3 << 20),  # a blob without a newline, beyond the first MiB read
        b"abc",  # a short one
        b"hello world\n",  # text whose first line is no sample
        b"\xff\xfe# TYPE a gauge\n",  # not UTF-8
        b"",
    ],
    ids=["json", "json-newline", "blob", "short-blob", "text", "binary", "empty"],
)
def test_what_is_no_recording_is_refused_and_left_as_it_is(tmp_path, content):
    path = tmp_path / "not-a-recording.om"
    path.write_bytes(content)
    line = _one_error_line(_repair(path))
    assert "not a recording" in line, line
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-recording.om"]  # no tmp left


def test_a_device_is_refused_without_reading_it(tmp_path):
    """/dev/zero never ends: before, --repair read it to 13 GB."""
    link = tmp_path / "zero.om"
    link.symlink_to("/dev/zero")
    for path in (Path("/dev/zero"), link):
        line = _one_error_line(_repair(path, "-o", str(tmp_path / "out.om"), timeout=20))
        assert "not a regular file" in line, line
    assert not (tmp_path / "out.om").exists()


def test_a_fifo_is_refused_without_blocking(tmp_path):
    """Before, opening a FIFO without a writer hung --repair for good."""
    fifo = tmp_path / "pipe.om"
    os.mkfifo(fifo)
    line = _one_error_line(_repair(fifo, timeout=20))
    assert "not a regular file" in line, line


def test_an_output_that_is_a_device_is_refused(tmp_path):
    journal = tmp_path / "run.om.partial"
    journal.write_bytes(_journal(3))
    out = tmp_path / "null.om"
    out.symlink_to("/dev/null")
    line = _one_error_line(_repair(journal, "-o", str(out)))
    assert "not a regular file" in line, line
    assert journal.exists() and out.is_symlink()


def test_a_recording_whose_rewrite_would_not_read_is_left_as_it_is(tmp_path):
    """A first line like a recording's, garbage later: the result would not parse, so the
    input is not replaced."""
    content = _journal(3).replace(b"} 3.0 ", b"} three ", 2) + b"# EOF\n"
    assert b"three" in content
    path = tmp_path / "bad.om"
    path.write_bytes(content)
    line = _one_error_line(_repair(path))
    assert "would not be a recording" in line, line
    assert path.read_bytes() == content


def test_a_strict_recording_with_no_whole_point_is_not_replaced(tmp_path):
    path = tmp_path / "cut.om"
    content = b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 3'
    path.write_bytes(content)
    line = _one_error_line(_repair(path))
    assert "no whole point" in line, line
    assert path.read_bytes() == content


def test_a_cut_journal_and_a_cut_recording_are_still_repaired(tmp_path):
    data = _journal(4)
    journal = tmp_path / "run.om.partial"
    journal.write_bytes(data[: len(data) - 10])  # the last scrape cut
    proc = _repair(journal)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "run.om"
    assert not journal.exists()
    text = out.read_text()
    assert text.endswith("# EOF\n") and text.count("vllm:num_requests_running{") == 3
    cut = tmp_path / "cut.om"
    cut.write_text(text[:-20])
    proc = _repair(cut)
    assert proc.returncode == 0, proc.stderr
    assert cut.read_text().endswith("# EOF\n")
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_journal_cut_inside_its_mark_still_finalizes(tmp_path):
    journal = tmp_path / "early.om.partial"
    journal.write_bytes(JOURNAL_MARK.encode()[:10])
    proc = _repair(journal)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "early.om").read_text() == "# EOF\n"
