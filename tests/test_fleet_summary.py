"""The fleet summary over real vLLM analyses: what it says of the changes it advises."""

from __future__ import annotations

import lzma
from dataclasses import replace
from pathlib import Path

from kvoffload.analysis.analyze import Settings, analyze_groups, window_from_recording
from kvoffload.fleet.summary import summarize

# Real vLLM 0.26.0 (tests/test_tiering.py says which run): one engine, advised to disable.
REAL = Path(__file__).parent / "fixtures" / "vllm-0.26-h200-tiering" / "rec.om.xz"


def test_a_fleets_ttft_change_is_unknown_not_zero_without_an_estimate(tmp_path: Path) -> None:
    """The fleet summary's mean leaves out changes without a TTFT estimate, and says how many;
    with none estimated it is None (printed as nothing), never 0.0 (the README walk-through)."""
    rec = tmp_path / "rec.om"
    rec.write_bytes(lzma.decompress(REAL.read_bytes()))
    (group,) = analyze_groups(window_from_recording(str(rec))[0], Settings())
    assert group.recommendation.action == "disable"  # a change, its TTFT effect measured
    known = summarize([group])
    assert known.mean_ttft_change_seconds is not None and known.changes_without_ttft == 0
    unknown = replace(group, recommendation=replace(group.recommendation, ttft_change_seconds=None))
    summary = summarize([unknown])
    assert summary.mean_ttft_change_seconds is None and summary.changes_without_ttft == 1
    assert summary.ttft_seconds_saved_per_second == 0.0
    both = summarize([group, unknown])
    assert both.changes_without_ttft == 1 and both.mean_ttft_change_seconds is not None
