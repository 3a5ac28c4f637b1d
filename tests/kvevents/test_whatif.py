"""The store_threshold and eviction what-ifs (kvevents/whatif.py) equal an independent replay
(vLLM 0.26.0's own LRU/ARC policy classes under a line-for-line CPUOffloadingManager) exactly,
on the real H200 KV-event captures, at sizes from a contended tier to one that holds it all."""

import lzma
from pathlib import Path

import pytest
import vllm_tier_oracle as oracle

from kvoffload.kvevents.whatif import POLICIES, THRESHOLDS, Config, replay_configs, whatif_for_file

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
