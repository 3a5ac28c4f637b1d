"""Any valid OpenMetrics layout of a recording reads the same: scrape by scrape (`record`'s
journal, recordings of earlier versions), families contiguous (what OpenMetrics requires of a
file with several timestamps, and what other tools write), series contiguous, and the strict
file `record` leaves when it ends — on the real H200 captures."""

import json
import lzma
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest

from kvoffload.recording.openmetrics import finalize_journal

SETS = Path(__file__).parent / "fixtures" / "vllm-0.26-h200-ttft"


def relayout(text: str, mode: str) -> str:
    """The same samples, families (or series) contiguous, each family's TYPE line once."""
    families: OrderedDict[str, tuple[str, OrderedDict[str, list[str]]]] = OrderedDict()
    current = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            current = families.setdefault(line.split()[2], (line, OrderedDict()))
        elif line and not line.startswith("#"):
            assert current is not None
            current[1].setdefault(line.rsplit(" ", 2)[0], []).append(line)
    out = []
    for type_line, series in families.values():
        out.append(type_line)
        if mode == "family":
            rows = [
                (float(line.rsplit(" ", 1)[1]), i, line)
                for i, lines in enumerate(series.values())
                for line in lines
            ]
            out += [line for _ts, _i, line in sorted(rows)]
        else:
            out += [line for lines in series.values() for line in lines]
    return "\n".join(out) + "\n# EOF\n"


def analyze(path: Path, events: Path) -> dict:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvoffload",
            "analyze",
            str(path),
            "--events",
            str(events),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    out.pop("source")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("set_name, server", [("B", "B-cpu5"), ("live", "cpu4g")])
def test_every_layout_gives_the_same_json(tmp_path, set_name, server):
    text = lzma.decompress((SETS / set_name / f"{server}.om.xz").read_bytes()).decode()
    events = tmp_path / "events.kvev"
    events.write_bytes(lzma.decompress((SETS / set_name / f"{server}.kvev.xz").read_bytes()))
    results = {}
    for mode in ("scrape", "family", "series"):
        path = tmp_path / f"{mode}.om"
        path.write_text(text if mode == "scrape" else relayout(text, mode))
        results[mode] = analyze(path, events)
    finalize_journal(str(tmp_path / "scrape.om"), str(tmp_path / "strict.om"))
    results["strict"] = analyze(tmp_path / "strict.om", events)
    assert results["scrape"]["groups"] and results["scrape"]["scrapes"] > 5
    assert results["family"] == results["scrape"]
    assert results["series"] == results["scrape"]
    assert results["strict"] == results["scrape"]


@pytest.mark.slow
def test_a_family_declared_without_samples_survives_the_strict_rewrite(tmp_path):
    """vLLM declares its per-direction offload families before the first transfer, with no
    sample yet; that the family is there decides how the others are read (flat, not legacy
    naming). The strict file `record` leaves keeps such a family's TYPE line, so it reads as the
    journal does."""
    text = lzma.decompress((SETS / "B" / "B-cpu5.om.xz").read_bytes()).decode()
    # No load yet, in any scrape: the family's TYPE line stays, its samples go.
    text = "".join(
        line
        for line in text.splitlines(keepends=True)
        if not line.startswith("vllm:kv_offload_load_bytes")
    )
    assert "# TYPE vllm:kv_offload_load_bytes counter" in text
    events = tmp_path / "events.kvev"
    events.write_bytes(lzma.decompress((SETS / "B" / "B-cpu5.kvev.xz").read_bytes()))
    journal = tmp_path / "scrape.om"
    journal.write_text(text)
    finalize_journal(str(journal), str(tmp_path / "strict.om"))
    strict_text = (tmp_path / "strict.om").read_text()
    assert strict_text.count("# TYPE vllm:kv_offload_load_bytes counter") == 1
    assert analyze(tmp_path / "strict.om", events) == analyze(journal, events)
