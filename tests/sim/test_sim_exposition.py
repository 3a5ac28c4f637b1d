"""/metrics bodies: vLLM's families, HELP, labels, buckets, eager and lazy series, versions."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kvoffload.sim import SimServer, scenarios

from sim_helpers import names, parse, total

# The format-exact 0.33 sample, copied into the repository's fixtures.
SAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.33-offload-sample.prom"
EPOCH = 1_795_000_000.0
FLAT = [f"vllm:kv_offload_{d}_{k}" for d in ("load", "store") for k in ("bytes", "time", "size")]


def _body(name: str, t: float, **overrides: object) -> bytes:
    sim = SimServer(replace(scenarios.get(name), **overrides), seed=0)
    sim.advance_to(t)
    return sim.render()


def test_033_matches_sample_file() -> None:
    ref_fams, ref_samples = parse(SAMPLE.read_bytes())
    fams, samples = parse(_body("laptop-eviction", 8.0))
    assert set(ref_fams) <= set(fams)
    for name, ref in ref_fams.items():
        fam = fams[name]
        assert fam.documentation == ref.documentation, name
        assert fam.type == ref.type, name
        ref_labels = {frozenset(s.labels) for s in ref.samples}
        got_labels = {frozenset(s.labels) for s in fam.samples}
        if ref_labels:
            assert ref_labels == got_labels, name
        ref_le = [s.labels["le"] for s in ref.samples if "le" in s.labels]
        got_le = [s.labels["le"] for s in fam.samples if "le" in s.labels]
        if ref_le:
            assert len(got_le) % len(set(ref_le)) == 0
            assert sorted(set(ref_le)) == sorted(set(got_le)), name
    # the laptop run is the sample's scenario: same transfer figures, block for block
    assert total(samples, "vllm:kv_offload_load_bytes_total") == total(
        ref_samples, "vllm:kv_offload_load_bytes_total"
    )
    assert total(samples, "vllm:prefix_cache_hits_total") == 7440
    assert total(samples, "vllm:external_prefix_cache_hits_total") == 7440


def test_lazy_flat_families_before_first_transfer() -> None:
    fams, samples = parse(_body("laptop-eviction", 0.0))
    present = names(samples)
    for fam in [
        *FLAT,
        "vllm:kv_offload_allocation_failure",
        "vllm:kv_offload_config_info",
        "vllm:kv_offload_cpu_cache_usage_perc",
    ]:
        base = fam
        assert base in fams, fam  # registered: HELP/TYPE lines
        assert not fams[base].samples, fam  # but no child yet
    # the deprecated mirrors exist at 0 from start-up, with the start time as _created
    for tt in ("CPU_to_GPU", "GPU_to_CPU"):
        assert total(samples, "vllm:kv_offload_total_bytes_total", transfer_type=tt) == 0
        assert total(samples, "vllm:kv_offload_total_bytes_created", transfer_type=tt) == EPOCH
    assert "vllm:prefix_cache_queries_total" in present
    assert total(samples, "vllm:prefix_cache_queries_created") == EPOCH


def test_store_lands_one_step_late() -> None:
    # A-cold is answered at ~0.378 s; its 93 chunks are pinned by the in-flight store
    _, just_after = parse(_body("laptop-eviction", 0.379))
    assert "vllm:kv_offload_store_bytes_total" not in names(just_after)
    write_usage = total(just_after, "vllm:kv_offload_cpu_cache_write_usage_perc")
    assert write_usage == pytest.approx(93 / 292)
    _, settled = parse(_body("laptop-eviction", 0.6))
    assert total(settled, "vllm:kv_offload_store_bytes_total") == 93 * 1_835_008
    assert total(settled, "vllm:kv_offload_total_bytes_total", transfer_type="GPU_to_CPU") == (
        93 * 1_835_008
    )
    assert total(settled, "vllm:kv_offload_cpu_cache_write_usage_perc") == 0
    created = total(settled, "vllm:kv_offload_store_bytes_created")
    assert EPOCH + 0.378 < created < EPOCH + 0.6
    assert "vllm:kv_offload_load_bytes_total" not in names(settled)


def test_legacy_023() -> None:
    _fams0, samples0 = parse(_body("legacy-0.23", 0.0))
    assert not any(n.startswith("vllm:kv_offload") for n in names(samples0))
    fams, samples = parse(_body("legacy-0.23", 600.0))
    offload = {n for n in names(samples) if n.startswith("vllm:kv_offload")}
    assert offload == {
        f"vllm:kv_offload_{k}"
        for k in (
            "total_bytes_total",
            "total_bytes_created",
            "total_time_total",
            "total_time_created",
            "size_bucket",
            "size_count",
            "size_sum",
            "size_created",
        )
    }
    assert (
        set(fams)
        & {
            "vllm:prompt_tokens_cached_by_source",
            "vllm:kv_offload_config_info",
            "vllm:num_requests_kv_fetch_by_stage",
        }
        == set()
    )
    (info,) = [s for s in fams["vllm:cache_config_info"].samples]
    assert "kv_cache_size_tokens" not in info.labels
    assert info.labels["calculate_kv_scales"] == "False"
    assert info.labels["kv_offloading_size"] == "16.0"


def test_offloading_off() -> None:
    fams, samples = parse(_body("laptop-eviction-nooffload", 8.0))
    assert not [f for f in fams if f.startswith("vllm:kv_offload")]
    assert total(samples, "vllm:external_prefix_cache_queries_total") == 0
    assert total(samples, "vllm:external_prefix_cache_hits_total") == 0
    assert total(samples, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert total(samples, "vllm:prompt_tokens_total") > 0
    (info,) = fams["vllm:cache_config_info"].samples
    assert info.labels["kv_offloading_size"] == "None"
    assert info.labels["kv_cache_size_tokens"] == "2336"


def test_stores_skipped_only_with_threshold() -> None:
    fams, _ = parse(_body("no-reuse", 10.0))
    assert "vllm:kv_offload_stores_skipped" not in fams
    fams, samples = parse(_body("no-reuse", 60.0, store_threshold=2))
    assert "vllm:kv_offload_stores_skipped" in fams
    assert total(samples, "vllm:kv_offload_stores_skipped_total") > 0


def test_dp_engines() -> None:
    fams, samples = parse(_body("dp2", 120.0))
    engines = {dict(lab)["engine"] for n, lab in samples if n == "vllm:prompt_tokens_total"}
    assert engines == {"0", "1"}
    infos = fams["vllm:cache_config_info"].samples
    assert {s.labels["engine"] for s in infos} == {"0", "1"}
    # num_gpu_blocks is the DP total on every engine's series; kv_cache_size_tokens per engine
    assert {s.labels["num_gpu_blocks"] for s in infos} == {str(2 * 910)}
    assert {s.labels["kv_cache_size_tokens"] for s in infos} == {str(910 * 16)}
    assert len(fams["vllm:kv_offload_config_info"].samples) == 2


def test_two_models_one_registry() -> None:
    _, samples = parse(_body("two-models", 60.0))
    models = {dict(lab)["model_name"] for n, lab in samples if n == "vllm:prompt_tokens_total"}
    assert models == {"Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B"}
    chat = total(samples, "vllm:external_prefix_cache_queries_total", model_name="Qwen/Qwen3-0.6B")
    assert chat == 0
    assert total(samples, "vllm:kv_offload_load_bytes_total", model_name="Qwen/Qwen3-0.6B") == 0


def test_restart_resets_everything() -> None:
    s = scenarios.get("restart")
    sim = SimServer(s, seed=0)
    sim.advance_to(899.0)
    _, before = parse(sim.render())
    sim.advance_to(900.0)
    fams, after = parse(sim.render())
    assert total(before, "vllm:prompt_tokens_total") > 1000
    assert total(after, "vllm:prompt_tokens_total") == 0
    assert total(after, "vllm:prompt_tokens_created") == EPOCH + 900.0
    for fam in FLAT:
        assert not fams[fam].samples
    sim.advance_to(960.0)
    _, later = parse(sim.render())
    assert 0 < total(later, "vllm:prompt_tokens_total") < total(before, "vllm:prompt_tokens_total")
    assert total(later, "vllm:kv_offload_store_bytes_created") > EPOCH + 900.0
    gt = sim.ground_truth()
    assert gt["restarts_s"] == [900.0]


def test_created_and_eager_series_per_engine() -> None:
    fams, samples = parse(_body("rag-hot-set-fits", 0.0))
    for src in ("device", "host", "p2p", "disk", "external_unspecified"):
        assert total(samples, "vllm:prompt_tokens_cached_by_source_total", source=src) == 0
    for reason in ("capacity", "deferred"):
        assert (
            "vllm:num_requests_waiting_by_reason",
            frozenset({("engine", "0"), ("model_name", "Qwen/Qwen3-8B"), ("reason", reason)}),
        ) in samples
    assert total(samples, "vllm:time_to_first_token_seconds_count") == 0
    assert len(fams["vllm:kv_offload_lookup_async_delay_seconds"].samples) == 0


def test_tensor_parallel_sums_over_ranks() -> None:
    # TP=2: each rank copies half of every block at its own link speed; counters add both
    # (128 MiB per GPU keeps the 146 blocks of the single-GPU run)
    s = replace(scenarios.get("laptop-eviction"), tp=2, kv_cache_memory_bytes=128 * 2**20)
    sim = SimServer(s, seed=0)
    sim.advance_to(1.6)  # after the first reload
    _, samples = parse(sim.render())
    load_bytes = total(samples, "vllm:kv_offload_load_bytes_total")
    load_time = total(samples, "vllm:kv_offload_load_time_total")
    assert load_bytes == 93 * 1_835_008
    assert total(samples, "vllm:kv_offload_load_size_count") == 2
    assert total(samples, "vllm:kv_offload_load_size_sum") == load_bytes
    assert load_bytes / load_time / 1e9 == pytest.approx(12.65, rel=0.01)  # per-rank GB/s
    reload = next(r for r in sim.records if r["label"] == "A-resent")
    assert reload["load_s"] == pytest.approx(load_time / 2)  # ranks copy in parallel
