"""The simulator's secondary tier (scenario `tiered`): vLLM's tiering series, consistent with
the CPU tier's own and with the prompt tokens by source."""

from __future__ import annotations

from dataclasses import replace

from kvoffload.analysis.tiering import secondary_tier_verdict
from kvoffload.sim import SimServer, scenarios

from sim_helpers import names, parse, total

T = "vllm:kv_offload_tiering_"


def _samples(name: str = "tiered", at: float = 600.0, **changes: object) -> dict:
    sim = SimServer(replace(scenarios.get(name), **changes), seed=0)
    sim.advance_to(at)
    return parse(sim.render())[1]


def test_every_completed_store_is_cascaded_to_the_tier_below() -> None:
    s = _samples()
    stored = total(s, "vllm:kv_offload_store_bytes_total")
    assert stored > 0
    assert total(s, T + "write_bytes_total", tier="1:fs") == stored
    assert total(s, T + "write_time_total") > 0


def test_promoted_chunks_are_the_disk_tokens_and_the_tiers_hits() -> None:
    s = _samples()
    read = total(s, T + "read_bytes_total", tier="1:fs")
    disk = total(s, "vllm:prompt_tokens_cached_by_source_total", source="disk")
    assert read > 0 and disk > 0
    bytes_per_token = scenarios.get("tiered").model.kv_bytes_per_token
    assert read == disk * bytes_per_token
    hits = total(s, T + "chunk_hits_total", tier="1:fs")
    assert read == hits * bytes_per_token * scenarios.get("tiered").block_size
    assert 0 < hits <= total(s, T + "chunk_queries_total", tier="1:fs")
    # the CPU tier is looked up first, for every chunk until one is in neither tier
    primary = total(s, T + "chunk_queries_total", tier="0:primary")
    assert primary >= total(s, T + "chunk_hits_total", tier="0:primary") + hits


def test_without_a_secondary_tier_there_is_no_tiering_series() -> None:
    s = _samples("buffer-too-small")
    assert not {n for n in names(s) if n.startswith(T)}
    assert total(s, "vllm:prompt_tokens_cached_by_source_total", source="disk") == 0


def test_the_tier_pays_when_fast_and_not_when_slow() -> None:
    from kvoffload.analysis.analyze import analyze_window
    from kvoffload.analysis.window import Window
    from kvoffload.ingest.catalog import WANTED_FAMILIES, extract, wanted
    from kvoffload.ingest.parse import parse_text

    def verdict(read_gbps: float) -> bool | None:
        sc = replace(scenarios.get("tiered"), secondary_read_gbps=read_gbps)
        sim, win = SimServer(sc, seed=0), Window(None)
        for t in (300.0, 600.0):
            sim.advance_to(t)
            win.update(extract(parse_text(sim.render(), wanted, WANTED_FAMILIES), t, "s"))
        (group,) = analyze_window(win)
        return secondary_tier_verdict(group["figures"]).pays

    assert verdict(6.0) is True
    assert verdict(0.5) is False
