"""The advisor on the simulator's scenario library, and its rules in isolation."""

import pytest

from kvoffload.analysis.advisor import (
    GIB,
    Counters,
    Evidence,
    Measured,
    TtftEvidence,
    decide,
    round_size_gib,
)
from kvoffload.analysis.analyze import analyze_window
from kvoffload.analysis.ttft import Effect
from kvoffload.analysis.window import Window
from kvoffload.ingest.catalog import WANTED_FAMILIES, extract, wanted
from kvoffload.ingest.parse import parse_text
from kvoffload.sim import SimServer, scenarios
from kvoffload.thresholds import Thresholds

from helpers import PAYING_FIGURES


def advise(
    figures: dict,
    offloading: bool,
    window_seconds: float,
    memory_limit_bytes: float | None = None,
    t: Thresholds | None = None,
    prompt_tokens: float = 0.0,
    engines: int = 1,
):
    """The advice from the counters alone."""
    c = Counters(
        figures,
        offloading,
        window_seconds,
        memory_limit_bytes,
        prompt_tokens=prompt_tokens,
        engines=engines,
    )
    return decide(Evidence(c), t)


def judged(figures, offloading, mean_ttft, now, effect_at, t, hit_ratio_now=None):
    """The advice from the counters (an hour, plenty of tokens) and the TTFT evidence."""
    c = Counters(figures, offloading, 3600, prompt_tokens=1e6)
    ttft = TtftEvidence(mean_ttft, now, effect_at, hit_ratio_now)
    return decide(Evidence(c, ttft=ttft), t)


def run_scenario(name: str, interval: float | None = None) -> list[dict]:
    """Scrape a scenario every `interval` virtual seconds over its whole length."""
    sc = scenarios.get(name)
    interval = interval or sc.scrape_interval_s
    sim = SimServer(sc)
    window = Window(None)
    t = 0.0
    while t <= sc.duration_s:
        sim.advance_to(t)
        window.update(
            extract(
                parse_text(sim.render(), wanted, WANTED_FAMILIES), sc.start_epoch + t, "sim:8000"
            )
        )
        t += interval
    return analyze_window(window)


def _single_model_scenarios() -> list[str]:
    return [n for n in scenarios.names() if not scenarios.get(n).extra_models]


@pytest.mark.slow
@pytest.mark.parametrize("name", _single_model_scenarios())
def test_advisor_takes_the_scenarios_right_action(name):
    (group,) = run_scenario(name)
    rec = group["recommendation"]
    sc = scenarios.get(name)
    assert rec["action"] == (sc.advice_without_events or sc.advice), rec["reasons"]
    assert rec["reasons"] and all(isinstance(r, str) and r for r in rec["reasons"])
    assert "speedup" in rec["evidence"]


def test_sizes_point_the_right_way():
    (grow,) = run_scenario("buffer-too-small")
    g = grow["figures"]
    assert grow["recommendation"]["kv_offloading_size_gib"] * GIB > g["cpu_capacity_bytes"]
    (shrink,) = run_scenario("buffer-oversized")
    s = shrink["figures"]
    size = shrink["recommendation"]["kv_offloading_size_gib"] * GIB
    assert s["stored_bytes_since_start"] < size < s["cpu_capacity_bytes"]
    assert size >= s["gpu_capacity_bytes"]  # never below the GPU KV size
    (enable,) = run_scenario("pressure-without-offloading")
    e = enable["figures"]
    assert enable["recommendation"]["kv_offloading_size_gib"] * GIB >= 2 * e["gpu_capacity_bytes"]


def test_two_models_in_one_process_are_judged_apart():
    groups = {g["labels"]["model_name"]: g for g in run_scenario("two-models")}
    assert len(groups) == 2
    states = sorted(g["offloading"] for g in groups.values())
    assert states == [False, True]


BASE = dict(PAYING_FIGURES)


def test_thin_data_keeps_the_current_state():
    rec = advise(BASE, True, window_seconds=30, prompt_tokens=100)
    assert rec.action == "keep" and "too little data" in rec.reasons[0]
    rec = advise(BASE, False, window_seconds=3600, prompt_tokens=10)
    assert rec.action == "leave_off"


def test_the_counter_speedup_is_a_figure_not_the_judge():
    rec = advise({**BASE, "speedup": 1.1}, True, 3600, prompt_tokens=1e6)
    assert rec.action == "keep" and rec.evidence["speedup"] == 1.1


def _effect(seconds: float, low: float, high: float) -> Effect:
    return Effect(
        seconds,
        low,
        high,
        {
            "reload_wait_seconds": 0.012,
            "store_seconds": 0.01,
            "recompute_saved_seconds": 0.001,
            "reloaded_tokens_per_request": 400.0,
        },
    )


def test_a_tier_that_hits_but_costs_ttft_is_disabled():
    rec = judged(
        BASE, True, 0.084, _effect(0.024, 0.020, 0.028), None, Thresholds(), hit_ratio_now=0.72
    )
    assert rec.action == "disable"
    assert rec.ttft_change_seconds == -0.024 and rec.ttft_change_basis == "measured"
    assert rec.ttft_change_range_seconds == [-0.028, -0.020]
    assert rec.reasons[0].startswith("the CPU tier costs TTFT: 72% of GPU-missed tokens")
    assert "24 ms worse than recomputing" in rec.reasons[0]


def test_an_effect_within_its_noise_is_said_so_and_the_other_costs_decide():
    # A likely saving that its range does not clear keeps what is there; no saving at all
    # leaves only the tier's certain costs: disable. Either way the advice says it cannot tell.
    for effect, action in (
        (_effect(-0.02, -0.06, 0.01), "keep"),
        (_effect(-0.004, -0.006, -0.002), "keep"),
        (_effect(0.004, -0.006, 0.012), "disable"),
    ):
        rec = judged(BASE, True, 0.084, effect, None, Thresholds())
        assert rec.action == action, rec.reasons
        assert any("no measurable TTFT effect" in r for r in rec.reasons)
        assert any("canary replica" in r for r in rec.reasons)
        assert rec.decided_by == "estimate"
        assert [step["stage"] for step in rec.trace] == ["counters", "estimate"]
    rec = judged(
        BASE,
        True,
        0.084,
        _effect(-0.03, -0.05, -0.01),
        None,
        Thresholds(),
    )
    assert rec.action == "keep" and rec.ttft_change_seconds is None
    assert any("the CPU tier pays" in r for r in rec.reasons)


def test_enable_only_when_the_predicted_saving_clears_its_range():
    off = {**BASE, "gpu_kv_usage_ratio": 0.9, "gpu_prefix_hit_ratio": 0.2}
    rec = advise(off, False, 3600, prompt_tokens=1e6)
    assert rec.action == "enable"
    saving = judged(off, False, 0.1, None, lambda size: _effect(-0.03, -0.05, -0.01), Thresholds())
    assert saving.action == "enable" and saving.ttft_change_seconds == -0.03
    assert saving.ttft_change_basis == "predicted"
    cost = judged(off, False, 0.1, None, lambda size: _effect(0.015, 0.005, 0.02), Thresholds())
    assert cost.action == "leave_off" and cost.ttft_change_seconds is None
    assert "would hit, but" in cost.reasons[0] and "worse" in cost.reasons[0]


def test_allocation_failures_grow_the_tier():
    rec = advise({**BASE, "allocation_failures_per_second": 0.5}, True, 3600, prompt_tokens=1e6)
    assert rec.action == "grow" and rec.kv_offloading_size_gib == 10.0  # 2×4 GiB + 20% → 10


def test_memory_limit_warns_with_any_action():
    rec = advise(BASE, True, 3600, memory_limit_bytes=4 * GIB, prompt_tokens=1e6)
    assert rec.action == "keep"
    assert rec.warnings and "OOM" in rec.warnings[0]
    rec = advise(BASE, True, 3600, memory_limit_bytes=64 * GIB, prompt_tokens=1e6)
    assert not rec.warnings


def test_thresholds_are_configurable():
    rec = advise(BASE, True, 3600, prompt_tokens=1e6, t=Thresholds(low_reuse_ratio=0.6))
    assert rec.action == "store_threshold"  # BASE's reuse ratio is 0.5
    strict = Thresholds(min_ttft_saving_seconds=0.05)
    rec = judged(
        BASE,
        True,
        0.084,
        _effect(-0.03, -0.05, -0.01),
        None,
        strict,
    )
    # 30 ms saved is under a 50 ms bar: not a measured saving, only a likely one
    assert rec.action == "keep" and any("no measurable TTFT effect" in r for r in rec.reasons)


@pytest.mark.parametrize(
    "gib, rounded", [(0.1, 0.25), (0.26, 0.5), (3.9, 4.0), (4.2, 5.0), (33, 36.0)]
)
def test_round_size(gib, rounded):
    assert round_size_gib(gib * GIB) == rounded


def test_sizes_are_per_engine_and_the_memory_check_counts_every_engine():
    # Two DP engines, 4 GiB of CPU tier each (8 GiB summed): grow is sized per engine.
    two = {
        **BASE,
        "cpu_capacity_bytes": 8 * GIB,
        "gpu_capacity_bytes": 2 * GIB,
        "allocation_failures_per_second": 0.5,
    }
    rec = advise(two, True, 3600, prompt_tokens=1e6, engines=2)
    assert rec.action == "grow" and rec.kv_offloading_size_gib == 10.0
    # 2 × 10 GiB + 20% > 16 GiB: the pod OOMs although one engine's tier would fit.
    rec = advise(two, True, 3600, prompt_tokens=1e6, engines=2, memory_limit_bytes=16 * GIB)
    assert rec.warnings and "2 engine(s)" in rec.warnings[0]


def test_the_enable_rule_is_the_alerts_condition():
    """advisor `enable` ⇔ conditions.ENABLE, which KVOffloadRecommendEnable renders (the
    promtool cases check the PromQL side on the same shapes): GPU turnover under the reuse
    horizon alone is pressure on both sides."""
    from kvoffload.analysis.conditions import ENABLE

    t = Thresholds()
    quiet = {
        **BASE,
        "gpu_kv_usage_ratio": 0.3,
        "preemptions_per_second": 0.0,
        "waiting_for_capacity": 0.0,
    }
    for figures in (
        {**quiet, "gpu_turnover_seconds": 62.5},
        {**quiet, "gpu_turnover_seconds": 6250.0},
        {**quiet, "gpu_turnover_seconds": None, "gpu_kv_usage_ratio": 0.95},
        {**quiet, "gpu_turnover_seconds": 62.5, "gpu_prefix_hit_ratio": 0.8},
        {**quiet, "gpu_turnover_seconds": 62.5, "gpu_prefix_hit_ratio": 0.0},
    ):
        rec = advise(figures, False, 3600, prompt_tokens=1e6)
        assert (rec.action == "enable") == ENABLE.holds(figures, t), figures
    assert (
        advise({**quiet, "gpu_turnover_seconds": 62.5}, False, 3600, prompt_tokens=1e6).action
        == "enable"
    )


def test_the_grow_rule_is_the_alerts_condition():
    """advisor `grow` ⇔ conditions.TOO_SMALL (KVOffloadBufferTooSmall renders its parts)."""
    from kvoffload.analysis.conditions import TOO_SMALL

    t = Thresholds()
    steady = {**BASE, "allocation_failures_per_second": 0.0}
    for figures in (
        steady,
        {**steady, "cpu_capacity_tokens": 10_000.0},  # no larger than the GPU cache
        {**steady, "allocation_failures_per_second": 0.5},
        {**steady, "cpu_capacity_tokens": None},
    ):
        rec = advise(figures, True, 3600, prompt_tokens=1e6)
        assert (rec.action == "grow") == TOO_SMALL.holds(figures, t), figures
    assert (
        advise({**steady, "cpu_capacity_tokens": 10_000.0}, True, 3600, prompt_tokens=1e6).action
        == "grow"
    )


def test_the_advice_is_decided_once_from_the_whole_evidence():
    """decide reads one Evidence value and changes none of it: the same evidence gives the same
    advice, and a measured A/B joins the evidence instead of patching an earlier advice."""
    counters = Counters(BASE, True, 3600, prompt_tokens=1e6)
    costs = TtftEvidence(0.084, _effect(0.024, 0.020, 0.028), None, 0.72)
    alone = decide(Evidence(counters, ttft=costs))
    assert alone.action == "disable"
    pays = Measured(_effect(-0.03, -0.05, -0.02), 0.084, "replicas", "3 replicas without a tier")
    evidence = Evidence(counters, ttft=costs, measured=(pays,))
    first, second = decide(evidence), decide(evidence)
    assert first == second
    assert first.action == "keep" and first.decided_by == "replicas"
    assert [step["stage"] for step in first.trace] == ["counters", "estimate", "replicas"]
    assert first.reasons[0].startswith("the replicas' A/B shows the tier pays: 3 replicas")
    assert decide(Evidence(counters, ttft=costs)) == alone
