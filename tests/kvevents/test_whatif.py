"""The store_threshold and eviction what-ifs (kvevents/whatif.py) equal an independent replay
(vLLM 0.26.0's own LRU/ARC policy classes under a line-for-line CPUOffloadingManager) exactly,
on the real H200 KV-event captures, at sizes from a contended tier to one that holds it all."""

import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest
import vllm_tier_oracle as oracle

from kvoffload.kvevents.whatif import POLICIES, THRESHOLDS, Config, replay_configs, whatif_for_file

from helpers import write_simulator_events

SETS = Path(__file__).parents[1] / "fixtures" / "vllm-0.26-h200-ttft"
CAPTURES = ("E/E-cpu4", "B/B-cpu10", "live/cpu4g")

pytestmark = pytest.mark.skipif(not oracle.available(), reason="vLLM 0.26 source not here")


def _file(tmp_path: Path, name: str) -> str:
    path = tmp_path / (Path(name).name + ".kvev")
    path.write_bytes(lzma.decompress((SETS / f"{name}.kvev.xz").read_bytes()))
    return str(path)


@pytest.mark.parametrize("name", CAPTURES)
def test_whatif_equals_vllm_policies_on_real_captures(tmp_path: Path, name: str) -> None:
    path = _file(tmp_path, name)
    configs = [Config(c, p, n) for c in (300, 2000, 1 << 20) for p in POLICIES for n in THRESHOLDS]
    outcomes = replay_configs(path, configs)
    for config, out in zip(configs, outcomes, strict=True):
        mine = (out.looked_up_blocks, out.hit_blocks, out.stored_blocks, out.never_loaded_blocks)
        assert mine == oracle.replay(
            path, config.capacity_blocks, config.policy, config.store_threshold
        ), config
        assert not out.omitted and out.looked_up_blocks > 0


def test_threshold_cuts_stores_and_arc_differs_under_contention(tmp_path: Path) -> None:
    """Not tautological figures: on E-cpu4 a threshold stores fewer bytes, and at a contended
    size ARC and LRU part ways (so the oracle comparison above exercises both)."""
    path = _file(tmp_path, "E/E-cpu4")
    lru, arc, two = replay_configs(
        path, [Config(1000, "lru"), Config(1000, "arc"), Config(1000, "lru", 2)]
    )
    assert two.stored_blocks < lru.stored_blocks
    assert arc.hit_blocks != lru.hit_blocks


def test_simulations_past_the_block_budget_are_omitted(tmp_path: Path) -> None:
    path = _file(tmp_path, "E/E-cpu4")
    big, small = replay_configs(path, [Config(1 << 20), Config(100)], max_blocks=500)
    assert big.omitted and not small.omitted
    rows = whatif_for_file(path, 2.0**17, 16, {"current": 2.0**40}, max_blocks=500).to_json()
    first, second = rows["store_threshold"][:2]  # type: ignore[index]
    # N = 1 stores every block (over 500); N = 2 stores a few dozen: it runs to the end.
    assert first["omitted"] and first["cpu_hit_ratio"] is None
    assert not second["omitted"] and second["cpu_hit_ratio"] is not None


def test_analyze_json_carries_the_whatif_rows(tmp_path: Path) -> None:
    """analyze FILE --events EVENTS --json: the group's kv_events.whatif holds the four
    store_threshold rows at the current and advised sizes and LRU/ARC rows, equal to a direct
    what-if at those sizes; the text report shows them in two lines."""
    path = _file(tmp_path, "E/E-cpu4")
    om = tmp_path / "E-cpu4.om"
    om.write_bytes(lzma.decompress((SETS / "E" / "E-cpu4.om.xz").read_bytes()))
    run = [sys.executable, "-m", "kvoffload", "analyze", str(om), "--events", path]
    out = json.loads(
        subprocess.run([*run, "--json"], capture_output=True, check=True, timeout=120).stdout
    )
    (group,) = out["groups"]
    info = group["kv_events"]
    whatif = info["whatif"]
    rows = whatif["store_threshold"]
    assert [(r["size"], r["store_threshold"]) for r in rows] == [
        (size, n) for size in ("current", "advised") for n in THRESHOLDS
    ]
    current = next(r for r in rows if r["size"] == "current")
    advised = next(r for r in rows if r["size"] == "advised")
    direct = whatif_for_file(
        path,
        info["bytes_per_block"],
        16,
        {"current": current["cpu_gib"] * 2**30, "advised": advised["cpu_gib"] * 2**30},
    ).to_json()
    assert [{k: r[k] for k in ("stored_bytes", "stored_never_loaded_bytes")} for r in rows] == [
        {k: r[k] for k in ("stored_bytes", "stored_never_loaded_bytes")}
        for r in direct["store_threshold"]  # type: ignore[union-attr]
    ]
    named = {(r["policy"], r["size"]) for r in whatif["eviction"] if r["size"]}
    assert named == {(p, s) for p in POLICIES for s in ("current", "advised")}
    text = subprocess.run(run, capture_output=True, check=True, text=True, timeout=120).stdout
    # The report shows them at the size the advice leaves the tier (the knobs are judged there).
    at = "advised" if group["recommendation"]["kv_offloading_size_gib"] is not None else "current"
    assert f"what-if store_threshold at the {at} size: N=1" in text
    assert f"what-if eviction at the {at} size" in text


def _simulator_event_file(tmp_path: Path, scenario: str) -> str:
    """A simulator run's KV events in an event file."""
    path = tmp_path / f"{scenario}.kvev"
    write_simulator_events(path, scenario)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["laptop-eviction", "restart"])
def test_whatif_equals_vllm_policies_on_simulator_streams(tmp_path: Path, scenario: str) -> None:
    """The same equality on simulator streams (restart: a publisher restart clears both)."""
    path = _simulator_event_file(tmp_path, scenario)
    configs = [Config(c, p, n) for c in (64, 1024) for p in POLICIES for n in (1, 2)]
    for config, out in zip(configs, replay_configs(path, configs), strict=True):
        mine = (out.looked_up_blocks, out.hit_blocks, out.stored_blocks, out.never_loaded_blocks)
        assert out.looked_up_blocks > 0
        assert mine == oracle.replay(
            path, config.capacity_blocks, config.policy, config.store_threshold
        ), config


@pytest.mark.parametrize("name", CAPTURES)
def test_tier_below_equals_vllm_tiering_rules_on_real_captures(tmp_path: Path, name: str) -> None:
    """An fs tier under the CPU tier: the what-if equals the oracle's transcription of the tiering
    manager (promotion through prepare_write, cascade on every store), and at a contended size the
    tier serves hits the CPU tier alone misses; at a size that holds it all it adds none."""
    path = _file(tmp_path, name)
    configs = [Config(c, p, 1, below=True) for c in (300, 2000, 1 << 20) for p in POLICIES]
    alone = replay_configs(path, [Config(300), Config(1 << 20)])
    outcomes = replay_configs(path, configs)
    for config, out in zip(configs, outcomes, strict=True):
        mgr = oracle.replay_manager(
            path, oracle.Manager(config.capacity_blocks, config.policy, 1, 64_000, below=True)
        )
        mine = (out.looked_up_blocks, out.hit_blocks, out.stored_blocks, out.never_loaded_blocks)
        assert (mine, out.tier_hit_blocks) == (mgr.result(), mgr.promoted), config
    small, whole = outcomes[0], outcomes[4]
    assert small.hit_blocks > alone[0].hit_blocks and small.tier_hit_blocks > 0
    assert whole.tier_hit_blocks == 0 and whole.hit_blocks == alone[1].hit_blocks
