"""The simulator reproduces what a CPU tier did to TTFT on real vLLM 0.26.0 (H200): its versions of
the three sets of reference/vllm-0.26-h200-ttft give the clients' mean TTFT change within ±30%:
worse on Qwen3-0.6B eager (the reload's wait and the connector's per-step work cost more than
recomputing), better on Qwen3-8B with CUDA graphs."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvoffload.sim import SimServer, scenarios
from kvoffload.sim.oracle import run_point

CLIENTS = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "vllm-0.26-h200-ttft" / "clients.json").read_text()
)

# simulator scenario with a tier → (real set, server without a tier, server with one)
PAIRS = {
    "h200-0.6b-eager-prefill-cpu2": ("live", "nooffload", "cpu2g"),
    "h200-0.6b-eager-prefill-cpu4": ("live", "nooffload", "cpu4g"),
    "h200-8b-graphs-cpu5": ("B", "B-nooffload", "B-cpu5"),
    "h200-8b-graphs-cpu10": ("B", "B-nooffload", "B-cpu10"),
    "h200-0.6b-eager-decode-cpu4": ("E", "E-nooffload", "E-cpu4"),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_ttft_change_within_30_percent_of_real_vllm(name):
    sc = scenarios.get(name)
    with_tier = run_point(sc, sc.cpu_gib)["mean_ttft_s"]
    without = run_point(sc, 0)["mean_ttft_s"]
    set_name, off, on = PAIRS[name]
    measured = CLIENTS[set_name][on] - CLIENTS[set_name][off]
    simulated = with_tier - without
    assert simulated == pytest.approx(measured, rel=0.3), (simulated, measured)


def test_a_reload_waits_in_queue_and_the_connector_slows_an_eager_engine():
    """The mechanism, not only the totals: with a tier the queue time rises (reloads wait for
    their copy and the next step) and, on the eager 0.6B engine, so does the prefill time."""

    def means(name, gib):
        sim = SimServer(replace(scenarios.get(name), cpu_gib=gib or None))
        sim.run()
        recs = sim.ground_truth()["requests"]
        return (
            sum(r["queue_s"] for r in recs) / len(recs),
            sum(r["prefill_s"] for r in recs) / len(recs),
        )

    q_off, p_off = means("h200-0.6b-eager-prefill-cpu4", 0)
    q_on, p_on = means("h200-0.6b-eager-prefill-cpu4", 4.0)
    assert q_off < 0.001 < 0.005 < q_on
    assert p_on > p_off
    q_off8, p_off8 = means("h200-8b-graphs-cpu5", 0)
    q_on8, p_on8 = means("h200-8b-graphs-cpu5", 5.0)
    assert q_on8 > q_off8 and p_on8 < p_off8 - 0.02
