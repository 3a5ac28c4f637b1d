"""The fast reader of scrape-ordered recordings (recording.journal_reader) gives exactly what the
general reader gives, or declines and leaves the file to it.

Equality is of the whole analysis JSON (every figure, bit for bit), on simulator scenarios
(a restart, the legacy names, two models in one process, two DP engines), the real H200
captures and a journal of two targets; every file odd in a way the fast reader does not take
(cut short, CR line ends, a NUL, a line it does not know, time going back, a sample without
timestamp) is declined, and reading it gives what the general reader gives (the same JSON or
the same error). Every test runs twice: with the compiled block scan (recording/_scan.c) and with
its pure-Python twin, workers included."""

from __future__ import annotations

import io
import itertools
import json
import math
from pathlib import Path

import pytest

from kvoffload.analysis.analyze import (
    analyze_window,
    window_from_expositions,
    window_from_recording,
)
from kvoffload.errors import InputError
from kvoffload.ingest.catalog import WANTED_FAMILIES, wanted
from kvoffload.ingest.parse import ParseError
from kvoffload.recording import journal_reader as fastjournal
from kvoffload.recording.journal_reader import Declined, journal_extracts
from kvoffload.recording.openmetrics import RecordingWriter, read_recording
from kvoffload.sim import scenarios
from kvoffload.sim.write_recording import record_scenario

from helpers import h200_scrapes, recording_text


@pytest.fixture(autouse=True, params=["compiled", "pure"])
def scan(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which block scan the reader (and the workers it starts) uses."""
    if request.param == "compiled":
        assert fastjournal._compiled_scan_block is not None, "recording/_scan.c was not built"
        monkeypatch.delenv("KVOFFLOAD_PURE_PYTHON", raising=False)
    else:
        monkeypatch.setenv("KVOFFLOAD_PURE_PYTHON", "1")
    monkeypatch.setattr(fastjournal, "COMPILED", request.param == "compiled")
    return str(request.param)


def _general(path: Path) -> str:
    win, _n, lifetime = window_from_expositions(read_recording(str(path), wanted, WANTED_FAMILIES))
    return json.dumps(analyze_window(win, lifetime=lifetime), sort_keys=True)


def _fast(path: Path) -> str:
    win, _n, lifetime = window_from_recording(str(path))
    return json.dumps(analyze_window(win, lifetime=lifetime), sort_keys=True)


def _takes(path: Path) -> int:
    """How many scrapes the fast reader gives (raises Declined when it declines)."""
    return sum(1 for _ in journal_extracts(str(path)))


@pytest.fixture(scope="module")
def sim_recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("fastjournal")
    out = {}
    for name in ("restart", "legacy-0.23", "two-models", "dp2"):
        scenario = scenarios.get(name)
        path = work / f"{name}.om"
        record_scenario(scenario, str(path), scenario.duration_s, 15.0, instance=f"{name}:8000")
        out[name] = path
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["restart", "legacy-0.23", "two-models", "dp2"])
def test_simulator_recordings_read_the_same(sim_recordings: dict[str, Path], name: str) -> None:
    path = sim_recordings[name]
    assert _takes(path) == 121
    assert _fast(path) == _general(path)


def test_real_capture_and_two_targets_read_the_same(tmp_path: Path) -> None:
    one = tmp_path / "h200.om"
    one.write_text(recording_text(h200_scrapes("8b-offload"), instance="h200:8000"))
    assert _takes(one) > 1
    assert _fast(one) == _general(one)

    two = tmp_path / "two.om"
    two.write_text(_two_targets())
    assert _takes(two) > 2
    fast = json.loads(_fast(two))
    assert {g["labels"]["instance"] for g in fast} == {"a:8000", "b:8000"}
    assert _fast(two) == _general(two)


def _two_targets() -> str:
    """Two targets in one journal, as `record --target A --target B` writes it."""
    buf = io.StringIO()
    writer = RecordingWriter(buf, job="vllm")
    offload, plain = h200_scrapes("8b-offload"), h200_scrapes("8b-nooffload")
    for k, ((_t1, body1), (_t2, body2)) in enumerate(zip(offload, plain, strict=False)):
        writer.write_scrape(body1, 1.8e9 + 15 * k, instance="a:8000")
        writer.write_scrape(body2, 1.8e9 + 15 * k + 1, instance="b:8000")
    writer.close()
    return buf.getvalue()


def _odd_variants(text: str) -> dict[str, str]:
    lines = text.splitlines(keepends=True)
    first_sample = next(
        i for i, line in enumerate(lines) if line.startswith("vllm:prompt_tokens_total")
    )
    no_stamp = list(lines)
    no_stamp[first_sample] = no_stamp[first_sample].rsplit(" ", 1)[0] + "\n"
    foreign = list(lines)
    foreign.insert(first_sample, 'vllm:something_else{engine="0"} 1.0 1800000000.0\n')
    stamps = [i for i, line in enumerate(lines) if line.startswith("vllm:prompt_tokens_total")]
    back = list(lines)
    last = stamps[-1]
    head, value, _ts = back[last].rsplit(" ", 2)
    back[last] = f"{head} {value} 1.0\n"
    return {
        "cut short": text[: len(text) // 2],
        "CR line ends": text.replace("\n", "\r\n"),
        "a NUL byte": text.replace("# TYPE", "\x00# TYPE", 1),
        "a sample without timestamp": "".join(no_stamp),
        "a line of another name": "".join(foreign),
        "time going back": "".join(back),
    }


@pytest.mark.parametrize(
    "case",
    [
        "cut short",
        "CR line ends",
        "a NUL byte",
        "a sample without timestamp",
        "a line of another name",
        "time going back",
    ],
)
def test_odd_files_are_declined_and_read_as_before(
    sim_recordings: dict[str, Path], tmp_path: Path, case: str
) -> None:
    path = tmp_path / "odd.om"
    path.write_text(_odd_variants(sim_recordings["restart"].read_text())[case])
    with pytest.raises(Declined):
        _takes(path)
    try:
        expected: str | None = _general(path)
        error = None
    except InputError as exc:
        expected, error = None, str(exc)
    if error is None:
        assert _fast(path) == expected
    else:
        with pytest.raises(InputError) as raised:
            _fast(path)
        assert str(raised.value) == error


@pytest.mark.parametrize("window", [60.0, 300.0, 447.0, 900.0, 1e9])
def test_a_window_reads_only_the_tail_and_gives_the_same(
    sim_recordings: dict[str, Path], window: float
) -> None:
    """--window: the fast reader starts at the last scrape the window needs (bisecting the
    file) and the figures are those of reading everything."""
    path = sim_recordings["restart"]
    # Scrapes every 15 s: the last one at or before (end - window), and every one after it.
    assert _takes_tail(path, window) == min(math.ceil(window / 15) + 1, 121)
    win, _n, lifetime = window_from_recording(str(path), window)
    fast = analyze_window(win, lifetime=lifetime)
    win, _n, lifetime = window_from_expositions(
        read_recording(str(path), wanted, WANTED_FAMILIES), window
    )
    # Equal but for rounding: the counters' running totals start from another base.
    assert _rounded(fast) == _rounded(analyze_window(win, lifetime=lifetime))


def _rounded(value: object) -> object:
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items() if k not in ("reasons", "warnings")}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _takes_tail(path: Path, window: float) -> int:
    return sum(1 for _ in journal_extracts(str(path), window))


@pytest.mark.parametrize("name", ["restart", "dp2", "two-models"])
@pytest.mark.parametrize("parts", [2, 3, 7])
def test_a_recording_read_in_parallel_parts_gives_the_same(
    sim_recordings: dict[str, Path], name: str, parts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large recordings are cut at scrape boundaries (journal_parts), read one part per
    process and given back in order: the same scrapes as one pass, so the same JSON, bit for
    bit (the window runs once, over them)."""
    from kvoffload.recording import reader
    from kvoffload.recording.journal_reader import journal_parts
    from kvoffload.recording.parts import BATCH, extracts_in_parts

    path = sim_recordings[name]
    spans = journal_parts(str(path), parts)
    assert len(spans) == parts and spans[0][0] == 0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert sum(_takes_span(path, span) for span in spans) == 121
    one_pass = list(journal_extracts(str(path)))
    in_parts = list(extracts_in_parts(str(path), spans))
    assert in_parts == one_pass
    assert [list(ex.counters) for ex in in_parts] == [list(ex.counters) for ex in one_pass]
    assert BATCH < 121  # batches cross the seams too
    monkeypatch.setattr(reader, "PARALLEL_BYTES", 0)
    whole, _n, _l = window_from_recording(str(path), jobs=1)
    win, count, lifetime = window_from_recording(str(path), jobs=parts)
    assert count == 121 and not lifetime
    assert json.dumps(analyze_window(win), sort_keys=True) == json.dumps(
        analyze_window(whole), sort_keys=True
    )


def test_parts_that_go_back_in_time_are_declined(
    sim_recordings: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two scrape-ordered halves in the wrong order: each part reads, but one pass would
    decline the file (time goes back); read in parts it is declined too, and the general
    reader refuses it as it refuses any file read scrape by scrape that goes back in time
    (it once sorted this one, a file within its 16 MiB head, and refused the same bytes
    further in: issue #12, attack 6)."""
    from kvoffload.recording import reader
    from kvoffload.recording.journal_reader import journal_parts
    from kvoffload.recording.parts import extracts_in_parts

    text = sim_recordings["restart"].read_text().removesuffix("# EOF\n")
    spans = journal_parts(str(sim_recordings["restart"]), 2)
    raw = text.encode()
    swapped = tmp_path / "swapped.om"
    swapped.write_bytes(raw[spans[1][0] :] + raw[: spans[1][0]] + b"# EOF\n")
    parts = journal_parts(str(swapped), 2)
    assert len(parts) == 2
    with pytest.raises(Declined):
        list(extracts_in_parts(str(swapped), parts))
    monkeypatch.setattr(reader, "PARALLEL_BYTES", 0)
    with pytest.raises(Declined):
        list(journal_extracts(str(swapped)))
    for read in (_fast, _general):
        with pytest.raises(ParseError, match=r"line 24422: timestamp .* goes back in time"):
            read(swapped)


def test_a_worker_that_dies_leaves_a_one_pass_read(
    sim_recordings: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A reading process that ends midway (killed, out of memory) is noticed, said in one
    line, and the file read again in one pass: the same JSON."""
    import sys

    from kvoffload.recording import parts as journalparts
    from kvoffload.recording import reader

    path = sim_recordings["dp2"]
    expected = _fast(path)
    real = journalparts.worker_command

    def dying(path: str, span: tuple[int, int], out: str) -> list[str]:
        if span[0] > 0:  # the second part's worker dies at once
            return [sys.executable, "-c", "import sys; sys.exit('killed: 9')"]
        return real(path, span, out)

    monkeypatch.setattr(journalparts, "worker_command", dying)
    monkeypatch.setattr(reader, "PARALLEL_BYTES", 0)
    with caplog.at_level("WARNING", logger="kvoffload"):
        win, count, lifetime = window_from_recording(str(path), jobs=2)
    assert count == 121
    assert json.dumps(analyze_window(win, lifetime=lifetime), sort_keys=True) == expected
    assert "stopped early (exit code 1): killed: 9; reading it in one pass" in caplog.text


def _takes_span(path: Path, span: tuple[int, int]) -> int:
    return sum(1 for _ in journal_extracts(str(path), span=span))


def _strict(journal: Path, tmp_path: Path) -> Path:
    from kvoffload.recording.openmetrics import finalize_journal

    out = tmp_path / (journal.stem + ".strict.om")
    finalize_journal(str(journal), str(out))
    return out


@pytest.mark.parametrize("name", ["restart", "legacy-0.23", "two-models", "dp2"])
def test_strict_recordings_read_the_same(
    sim_recordings: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """The strict layout `record` leaves (families once, series contiguous) read by columns
    (recording.strict_reader) gives the general reader's JSON, bit for bit."""
    from kvoffload.recording.strict_reader import strict_extracts

    path = _strict(sim_recordings[name], tmp_path)
    assert sum(1 for _ in strict_extracts(str(path))) == 121
    assert _fast(path) == _general(path)


def test_strict_real_capture_and_two_targets(tmp_path: Path) -> None:
    from kvoffload.recording.strict_reader import strict_extracts

    one = tmp_path / "h200.journal"
    one.write_text(recording_text(h200_scrapes("8b-offload"), instance="h200:8000"))
    two = tmp_path / "two.journal"
    two.write_text(_two_targets())
    for journal in (one, two):
        path = _strict(journal, tmp_path)
        assert sum(1 for _ in strict_extracts(str(path))) > 2
        assert _fast(path) == _general(path)


def test_a_family_whose_block_comes_again_keeps_its_series_apart(tmp_path: Path) -> None:
    """A strict-looking file where a family the figures need but whose declaration does not
    matter comes in two blocks: its series, read in the first, hold one array of the times
    they share; the second block's points must grow only their own series."""
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="0",instance="a:1"}} 1 {t}' for t in (15, 30)]
    for part in ((15, 30), (45, 60)):
        lines.append("# TYPE vllm:prompt_tokens counter")
        for engine in ("0", "1"):
            labels = f'{{engine="{engine}",instance="a:1",model_name="m"}}'
            for t in part:
                lines.append(f"vllm:prompt_tokens_total{labels} {t * (1 + int(engine))} {t}")
    path = tmp_path / "again.om"
    path.write_text("\n".join(lines) + "\n# EOF\n")
    from kvoffload.recording.strict_reader import strict_extracts

    assert sum(1 for _ in strict_extracts(str(path))) == 4  # read by columns, not declined
    assert _fast(path) == _general(path)
