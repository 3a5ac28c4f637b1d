"""Each secondary tier apart: its figures from its own series, in the JSON, /metrics and report.

On the fixture written from vLLM's source (tests/fixtures/vllm-tiering) with a second, slower
tier added: the group's tier figures add both, each tier's are its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload.analysis.analyze import analyze_groups
from kvoffload.analysis.result import GroupAnalysis
from kvoffload.analysis.signals import PER_TIER_FIGURES
from kvoffload.analysis.window import Window
from kvoffload.cli.report import render_report
from kvoffload.ingest.catalog import MAX_TIERS, WANTED_FAMILIES, extract, wanted
from kvoffload.ingest.parse import parse_text
from kvoffload.sidecar.metrics import _per_tier

FIXTURE = Path(__file__).parent / "fixtures" / "vllm-tiering" / "tiering-chunk.prom"
# The second tier's series as multiples of the fs tier's: half the reads at a quarter of the
# speed, half the lookups found, no failure.
SLOWER = {
    "read_bytes": 0.5,
    "read_time": 2.0,
    "write_bytes": 1.0,
    "write_time": 1.0,
    "promotion_job_failures": 0.0,
    "chunk_queries": 1.0,
    "chunk_hits": 0.5,
}


def _tier_copy(text: str, tier: str, factors: dict[str, float]) -> str:
    """The fs tier's samples again under `tier`, each value times its family's factor."""
    lines = []
    for line in text.splitlines():
        if line.startswith("#") or 'tier="1:fs"' not in line or "_created" in line:
            continue
        name, value = line.rsplit(" ", 1)
        family = name.split("{")[0].removeprefix("vllm:kv_offload_tiering_").removesuffix("_total")
        if family in factors:
            copy = name.replace('tier="1:fs"', f'tier="{tier}"')
            lines.append(f"{copy} {float(value) * factors[family]!r}")
    return "\n".join(lines)


def _zeroed(text: str) -> str:
    """The same series at 0: the scrape 30 s before, so every figure has a rate."""
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#") and "_created" not in line:
            line = f"{line.rsplit(' ', 1)[0]} 0.0"
        out.append(line)
    return "\n".join(out) + "\n"


def _groups(text: str) -> list[GroupAnalysis]:
    window = Window(None)
    for at, body in ((1e9, _zeroed(text)), (1e9 + 30, text)):
        window.update(extract(parse_text(body, wanted, WANTED_FAMILIES), at, "vllm:8000"))
    return analyze_groups(window)


def test_each_tier_has_its_own_figures_and_the_group_adds_them() -> None:
    one = FIXTURE.read_text()
    (alone,) = _groups(one)
    (both,) = _groups(one + "\n" + _tier_copy(one, "2:obj", SLOWER) + "\n")
    assert both.tiers is not None and set(both.tiers) == {"1:fs", "2:obj"}
    fs, obj = both.tiers["1:fs"], both.tiers["2:obj"]
    for fig in PER_TIER_FIGURES:  # the fs tier alone is what the one-tier body said of all
        assert fs[fig.key] == pytest.approx(alone.figures[fig.key]), fig.key
    assert obj["tier_hit_ratio"] == pytest.approx(0.5 * fs["tier_hit_ratio"])
    assert obj["tier_read_gbps"] == pytest.approx(fs["tier_read_gbps"] / 4)
    assert obj["tier_promotion_failures_per_second"] == 0.0
    added = both.figures["tier_read_bytes_per_second"]
    assert added == pytest.approx(fs["tier_read_bytes_per_second"] * 1.5)
    assert both.to_json()["tiers"] == both.tiers


def test_tiers_reach_metrics_and_the_report() -> None:
    one = FIXTURE.read_text()
    groups = _groups(one + "\n" + _tier_copy(one, "2:obj", SLOWER) + "\n")
    samples = {(m.name, s.labels["tier"]): s.value for m in _per_tier(groups) for s in m.samples}
    gbps = samples[("kvoffload_tier_read_bandwidth_bytes_per_second", "2:obj")]
    assert gbps == pytest.approx(1.5e9)  # GB/s in JSON, bytes/s on /metrics
    assert samples[("kvoffload_tier_hit_ratio", "1:fs")] == pytest.approx(0.8)
    report = render_report(groups, "fixture")
    assert "tier 1:fs: hit_ratio" in report and "tier 2:obj: hit_ratio" in report


def test_more_tiers_than_the_cap_are_added_not_kept_apart() -> None:
    """A target with 12 secondary tiers (a hostile or odd one): 8 apart, all 12 in the sum."""
    one = FIXTURE.read_text()
    same = dict.fromkeys(SLOWER, 1.0)
    extra = "\n".join(_tier_copy(one, f"{i}:fs", same) for i in range(2, 13))
    (group,) = _groups(one + "\n" + extra + "\n")
    assert group.tiers is not None and len(group.tiers) == MAX_TIERS
    (alone,) = _groups(one)
    total = group.figures["tier_read_bytes_per_second"]
    assert total == pytest.approx(12 * alone.figures["tier_read_bytes_per_second"])


def test_a_target_renaming_its_tiers_every_scrape_keeps_the_first_ones() -> None:
    """Eight new tier labels a scrape for 40 scrapes: the window keeps the first eight apart
    (it would otherwise grow with every scrape), the sum still reads every tier."""
    one = FIXTURE.read_text()
    same = dict.fromkeys(SLOWER, 1.0)
    window = Window(None)
    for scrape in range(40):
        tiers = [f"{scrape * 8 + j + 2}:fs" for j in range(8)]
        body = one + "\n" + "\n".join(_tier_copy(one, t, same) for t in tiers) + "\n"
        window.update(extract(parse_text(body, wanted, WANTED_FAMILIES), 1e9 + scrape, "v:1"))
    (group,) = analyze_groups(window)
    assert group.tiers is not None
    assert sorted(group.tiers) == sorted(["1:fs", *(f"{j}:fs" for j in range(2, 9))])
