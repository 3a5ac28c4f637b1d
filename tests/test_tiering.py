"""Secondary tiers below the CPU tier: vLLM's tiering series read under both spellings, the
figures on the fixtures written from vLLM's source, and when a secondary tier pays."""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.analysis.analyze import (
    analyze_window,
    window_from_expositions,
    window_from_recording,
)
from kvoffload.analysis.tiering import secondary_tier_verdict
from kvoffload.ingest.catalog import WANTED_FAMILIES, extract, wanted
from kvoffload.ingest.parse import parse_text

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-tiering"
CHUNK = 2_359_296  # the fixtures' chunk (render.py)


def figures(text: str) -> dict[str, float | None]:
    win, _n, lifetime = window_from_expositions([parse_text(text, wanted, WANTED_FAMILIES)])
    (group,) = analyze_window(win, lifetime=lifetime)
    return group["figures"]


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_chunk_spelling_gives_each_tiers_hits_and_bandwidth() -> None:
    f = figures(fixture("tiering-chunk.prom"))
    assert f["tier_hit_ratio"] == pytest.approx(40 / 50)
    assert f["primary_tier_hit_ratio"] == pytest.approx(150 / 200)
    assert f["tier_read_gbps"] == pytest.approx(6.0)
    assert f["tier_write_gbps"] == pytest.approx(1.5)
    # vLLM 0.26.0's per-request tiering histograms: 50 requests, 400 µs blocked, 30 ms waited
    assert f["tier_lookup_blocking_seconds"] == pytest.approx(4e-4)
    assert f["tier_lookup_wait_seconds"] == pytest.approx(0.03)


def test_block_spelling_of_the_first_releases_gives_the_same_figures() -> None:
    chunk = figures(fixture("tiering-chunk.prom"))
    block = figures(fixture("tiering-block.prom"))
    for key in ("tier_hit_ratio", "tier_read_gbps", "tier_write_gbps"):
        assert block[key] == pytest.approx(chunk[key]), key
    # those releases counted no lookup of the CPU tier and no job in flight
    assert block["primary_tier_hit_ratio"] is None
    assert block["tier_active_promotions"] is None


def test_both_spellings_in_one_body_are_never_added() -> None:
    """A body with chunk and block lookups (no release has both): the chunk ones, alone."""
    text = fixture("tiering-chunk.prom") + "\n".join(
        line
        for line in fixture("tiering-block.prom").splitlines()
        if "block_" in line and not line.startswith("#")
    )
    assert figures(text)["tier_hit_ratio"] == pytest.approx(40 / 50)
    doubled = text.replace('tier="1:fs"} 40.0', 'tier="1:fs"} 10.0', 1)  # the first: chunk
    assert figures(doubled)["tier_hit_ratio"] == pytest.approx(10 / 50)


def test_the_series_of_several_secondary_tiers_are_added_per_engine() -> None:
    text = fixture("tiering-chunk.prom")
    obj = [
        line.replace('tier="1:fs"', 'tier="2:obj"')
        for line in text.splitlines()
        if 'tier="1:fs"' in line and "_created" not in line and "lookup" not in line
    ]
    ex = extract(parse_text(text + "\n".join(obj) + "\n", wanted, WANTED_FAMILIES), 0.0, "i")
    counters = {k[0]: v for k, v in ex.counters.items()}
    assert counters["tier_read_bytes"] == 2 * 40 * CHUNK
    assert counters["tier_chunk_queries"] == 100 and counters["primary_chunk_queries"] == 200
    assert {k[0]: v for k, v in ex.gauges.items()}["tier_active_promotions"] == 2


def test_active_jobs_and_failures_from_the_fixture() -> None:
    f = figures(fixture("tiering-chunk.prom"))
    assert f["tier_active_promotions"] == 1 and f["tier_active_cascades"] == 0
    # one scrape: amounts since start, but no time span, so no per-second figure
    assert f["tier_promotion_failures_per_second"] is None


FAST = {
    "tier_hit_ratio": 0.8,
    "primary_tier_hit_ratio": 0.75,
    "tier_read_gbps": 6.0,
    "load_gbps": 30.0,
    "kv_bytes_per_token": 147_456.0,
    "recompute_tokens_per_second": 10_000.0,
}


def test_a_fast_tier_that_finds_the_cpu_tiers_misses_pays() -> None:
    v = secondary_tier_verdict(FAST)
    assert v.pays is True
    # 147,456 B at 6 GB/s then at 30 GB/s, against 100 µs recomputed
    assert v.tier_seconds_per_token == pytest.approx(147_456 / 6e9 + 147_456 / 30e9)
    assert v.recompute_seconds_per_token == pytest.approx(1e-4)
    assert "80.0%" in v.reasons[0]


def test_a_tier_slower_than_recompute_does_not_pay() -> None:
    v = secondary_tier_verdict({**FAST, "tier_read_gbps": 1.0})
    assert v.pays is False and "recompute wins" in v.reasons[0]
    # batching makes a recomputed token cheaper: the caller's marginal cost decides
    v = secondary_tier_verdict(FAST, recompute_seconds_per_token=20e-6)
    assert v.pays is False and v.recompute_seconds_per_token == 20e-6


def test_a_tier_that_finds_little_or_below_a_cpu_tier_that_misses_nothing_does_not_pay() -> None:
    assert secondary_tier_verdict({**FAST, "tier_hit_ratio": 0.01}).pays is False
    v = secondary_tier_verdict({**FAST, "primary_tier_hit_ratio": 0.995})
    assert v.pays is False and "misses too little" in v.reasons[0]


def test_no_lookups_or_no_speeds_cannot_tell() -> None:
    assert secondary_tier_verdict({}).pays is None
    v = secondary_tier_verdict({**FAST, "load_gbps": None})
    assert v.pays is None and v.reasons


def test_dropped_and_failed_promotions_are_reasons() -> None:
    v = secondary_tier_verdict(
        {
            **FAST,
            "promotion_allocation_failures_per_second": 0.5,
            "tier_promotion_failures_per_second": 0.1,
        }
    )
    assert any("free CPU-tier slot" in r for r in v.reasons)
    assert any("promotion jobs/s failed" in r for r in v.reasons)


def test_a_tier_whose_series_appear_later_is_no_restart() -> None:
    """The obj tier's first promotion creates its read series after the fs tier's: the
    window keeps counting (the earliest `_created` of a key's series stands for it)."""
    from kvoffload.analysis.window import Window

    text = fixture("tiering-chunk.prom")
    later = text + "\n".join(
        line.replace('tier="1:fs"', 'tier="2:obj"').replace(
            line.rsplit(" ", 1)[1], "4e9" if "_created" in line else "0.0"
        )
        for line in text.splitlines()
        if "read_bytes" in line and 'tier="1:fs"' in line
    )
    win = Window(None)
    for t, body in ((1e9, text), (1e9 + 30, later)):
        win.update(extract(parse_text(body, wanted, WANTED_FAMILIES), t, "i"))
    (group,) = analyze_window(win)
    assert group["figures"]["tier_read_bytes_per_second"] == 0.0


REAL_TIERING = Path(__file__).parent / "fixtures" / "vllm-0.26-h200-tiering" / "rec.om.xz"


def test_real_vllm_026_tiering_exports_lookup_delays_and_no_per_tier_series(
    tmp_path: Path,
) -> None:
    """Real vLLM 0.26.0, TieringOffloadingSpec with a file-system tier under a 1 GiB CPU tier
    (bench/real/results/qwen3-0.6b-rag-tiering-fs: 1 s scrapes, 248 requests): its only tiering
    series are the two lookup-delay histograms, and the deferred lookups are most of the TTFT."""
    rec = tmp_path / "rec.om"
    rec.write_bytes(lzma.decompress(REAL_TIERING.read_bytes()))
    window, _n, lifetime = window_from_recording(str(rec))
    (group,) = analyze_window(window, lifetime=lifetime)
    f = group["figures"]
    # Δsum / Δcount of vllm:kv_offload_tiering_lookup_async_delay_seconds over the recording
    # (the sidecar's snapshots: 17.97 s over 250 requests at the end, 9 ms over 2 at the start)
    assert f["tier_lookup_wait_seconds"] == pytest.approx((17.9653 - 0.0090) / 248, rel=0.05)
    assert 0 < f["tier_lookup_blocking_seconds"] < 1e-3
    assert f["offload_hit_ratio"] is not None and f["mean_lookup_seconds"] is not None
    for key in ("tier_hit_ratio", "primary_tier_hit_ratio", "tier_read_gbps"):
        assert f[key] is None, key  # after 0.26.0
    verdict = secondary_tier_verdict(f)
    assert verdict.pays is None and "exports no per-tier hits" in verdict.reasons[0]
    assert f"{f['tier_lookup_wait_seconds'] * 1e3:.3g} ms" in verdict.reasons[0]
    # ...and the group's advice carries it beside the CPU tier's action
    rec = group["recommendation"]
    assert rec["secondary_tier"] is not None and rec["secondary_tier"]["pays"] is None
    assert any(r.startswith("secondary tier: secondary-tier lookups make") for r in rec["reasons"])


def test_the_advice_says_whether_a_secondary_tier_pays_without_changing_the_action() -> None:
    from kvoffload.analysis.advisor import Counters, Evidence, decide

    with_tier = Counters(dict(FAST), True, 600.0)
    without = Counters({k: v for k, v in FAST.items() if not k.startswith(("tier", "primary"))},
                       True, 600.0)  # fmt: skip
    a, b = decide(Evidence(with_tier)), decide(Evidence(without))
    assert a.action == b.action and b.secondary_tier is None
    assert a.secondary_tier == {
        "pays": True,
        "tier_seconds_per_token": pytest.approx(147_456 / 6e9 + 147_456 / 30e9),
        "recompute_seconds_per_token": pytest.approx(1e-4),
    }
    assert [r for r in a.reasons if r.startswith("secondary tier: ")]


def test_real_tiering_capture_with_its_kv_events_prices_the_tier_below(tmp_path: Path) -> None:
    """The same capture with its KV events (analyze --events): the replay of vLLM's fs tier
    under the 1 GiB CPU tier predicts the hit ratio the server measured (0.615; the CPU tier
    alone would find almost nothing there: the 40 documents are ~4.7 GB), and the tier's tokens
    cannot repay the 72 ms its lookups cost a request, so the verdict is no."""
    rec, events = tmp_path / "rec.om", tmp_path / "rec.om.kvev"
    rec.write_bytes(lzma.decompress(REAL_TIERING.read_bytes()))
    kvev = REAL_TIERING.with_name("rec.om.kvev.xz")
    events.write_bytes(lzma.decompress(kvev.read_bytes()))
    run = [sys.executable, "-m", "kvoffload", "analyze", str(rec), "--events", str(events)]
    out = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=120, check=True)
    (group,) = json.loads(out.stdout)["groups"]
    measured = group["figures"]["offload_hit_ratio"]
    whatif = group["kv_events"]["whatif"]
    (tier,) = [r for r in whatif["secondary_tier"] if r["size"] == "current"]
    (alone,) = [r for r in whatif["eviction"] if r["size"] == "current" and r["policy"] == "lru"]
    assert abs(tier["cpu_hit_ratio"] - measured) < 0.02, (tier, measured)
    assert alone["cpu_hit_ratio"] < 0.05 and tier["tier_hit_ratio"] > 0.5
    # the current size's prediction counts the tier below, as the server's hit ratio does
    assert group["kv_events"]["predicted_offload_hit_ratio_current"] < 0.05
    with_tier = group["kv_events"]["predicted_offload_hit_ratio_current_with_tier"]
    assert with_tier == tier["cpu_hit_ratio"]
    (curve,) = [s for s in group["recommendation"]["trace"] if s["stage"] == "curve"]
    both = f"{alone['cpu_hit_ratio']:.3f} alone, {with_tier:.3f} with the tier below"
    assert both in curve["why"]
    assert group["recommendation"]["secondary_tier"]["pays"] is False
    # the hits the verdict prices came through the CPU tier from either tier
    assert group["recommendation"]["reasons"][0].startswith(
        "the CPU tier with the tier below costs TTFT: 62% of GPU-missed tokens reload through"
    )
    (reason,) = [r for r in group["recommendation"]["reasons"] if r.startswith("secondary tier")]
    wait = group["figures"]["tier_lookup_wait_seconds"]
    assert f"less than the {wait * 1e3:.3g} ms its lookups make one wait" in reason
    text = subprocess.run(run, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "what-if a file-system tier below at the current size" in text
