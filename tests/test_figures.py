"""The derived figures on vLLM's real exposition: the sample file and the H200 captures."""

import io

import pytest

from kvoffload.analysis.analyze import analyze_window, window_from_expositions
from kvoffload.ingest.catalog import WANTED_FAMILIES, wanted
from kvoffload.ingest.parse import iter_openmetrics, parse_text

from helpers import SAMPLE, h200_scrapes, recording_text, restarted


def figures_of(expositions, window=None):
    win, _n, lifetime = window_from_expositions(expositions, window)
    (group,) = analyze_window(win, lifetime=lifetime)
    return group


def sample_group():
    return figures_of([parse_text(SAMPLE.read_text(), wanted, WANTED_FAMILIES)])


def test_sample_reproduces_the_laptop_measurement():
    g = sample_group()
    f = g["figures"]
    assert g["offloading"] is True
    assert f["load_gbps"] == pytest.approx(12.6, rel=0.01)
    assert f["store_gbps"] == pytest.approx(11.9, rel=0.01)
    assert f["kv_bytes_per_token"] == 114_688
    assert f["load_tokens_per_second"] == pytest.approx(110_000, rel=0.01)
    assert 4.5 < f["speedup"] < 6.0  # 110k / 19.7k; the article's 23k gives 4.8
    assert f["cpu_capacity_tokens"] == 4_672
    assert f["gpu_capacity_tokens"] == 2_336
    assert f["offload_hit_ratio"] == pytest.approx(7_440 / 32_267)
    assert f["reuse_ratio"] == pytest.approx(0.3025, abs=1e-3)
    assert f["wasted_bytes"] == 2_820_407_296 - 853_278_720


def test_created_samples_are_never_added_to_values():
    # A probe that summed every vllm:kv_offload* sample reported a phantom 5.37 GB of loads.
    f = sample_group()["figures"]
    assert f["loaded_bytes"] == 853_278_720


def _drop_flat(text: str) -> str:
    """The same server as a 0.23 release would show it: only the transfer_type names."""
    flat = ("vllm:kv_offload_load_", "vllm:kv_offload_store_")
    keep = []
    for line in text.splitlines():
        name = line.split()[2] if line.startswith("# ") and len(line.split()) > 2 else line
        if name.startswith(flat):
            continue
        keep.append(line)
    return "\n".join(keep) + "\n"


def test_legacy_names_give_the_same_figures_and_are_never_added_twice():
    flat = sample_group()["figures"]
    legacy_group = figures_of([parse_text(_drop_flat(SAMPLE.read_text()), wanted, WANTED_FAMILIES)])
    assert legacy_group["naming"] == "legacy"
    legacy = legacy_group["figures"]
    for key in ("load_gbps", "store_gbps", "loaded_bytes", "stored_bytes", "reuse_ratio"):
        assert legacy[key] == pytest.approx(flat[key]), key


def test_flat_family_without_samples_is_zero_so_far_not_legacy():
    # Flat families declared but no child yet, legacy series at 0: nothing moved yet.
    text = (
        "# TYPE vllm:kv_offload_load_bytes_total counter\n"
        "# TYPE vllm:kv_offload_total_bytes_total counter\n"
        'vllm:kv_offload_total_bytes_total{engine="0",model_name="m",'
        'transfer_type="CPU_to_GPU"} 5e9\n'
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 100\n'
    )
    g = figures_of([parse_text(text, wanted, WANTED_FAMILIES)])
    assert g["naming"] == "flat"
    assert g["offloading"] is True
    # Nothing measured under the flat names yet: undefined (the formula's Rate of a key with no
    # series), and never the legacy 5e9.
    assert g["figures"]["loaded_bytes"] is None


def test_offloading_off_gives_undefined_not_zero():
    body = h200_scrapes("8b-nooffload")[-1][1]
    g = figures_of([parse_text(body, wanted, WANTED_FAMILIES)])
    f = g["figures"]
    assert g["offloading"] is False
    for key in ("offload_hit_ratio", "load_gbps", "reuse_ratio", "wasted_bytes", "speedup"):
        assert f[key] is None, key
    assert f["gpu_capacity_tokens"] == 2_336
    assert f["gpu_prefix_hit_ratio"] == pytest.approx(0.198, abs=0.01)


def _h200_expositions(restart_at: int | None = None):
    scrapes = h200_scrapes("8b-offload")
    parsed = [(ts, parse_text(body)) for ts, body in scrapes]
    if restart_at is not None:
        base_ts, base = parsed[restart_at]
        parsed = parsed[: restart_at + 1] + [
            (ts, restarted(expo, base, base_ts + 0.01)) for ts, expo in parsed[restart_at + 1 :]
        ]
    text = recording_text(parsed)
    return list(iter_openmetrics(io.StringIO(text), wanted, WANTED_FAMILIES))


def test_h200_recording_figures():
    g = figures_of(_h200_expositions())
    f = g["figures"]
    # 5 reloads of 93 blocks × 16 tokens × 147,456 B, less what the first scrape had seen.
    assert f["kv_bytes_per_token"] == pytest.approx(147_456, rel=0.01)
    assert 25 < f["load_gbps"] < 40  # ~32.5 GB/s measured per job on the H200
    assert f["gpu_capacity_tokens"] == 2_336
    assert f["speedup"] > 1.0
    assert g["window_seconds"] == pytest.approx(7.7, abs=0.5)


@pytest.mark.parametrize("restart_at", [3, 11, 20])
def test_counter_reset_inside_the_window_changes_nothing(restart_at):
    plain = figures_of(_h200_expositions())["figures"]
    reset = figures_of(_h200_expositions(restart_at))["figures"]
    for key, value in plain.items():
        if key.endswith("since_start"):
            continue  # "since the engine started": a restart rightly starts it over
        if value is None:
            assert reset[key] is None, key
        else:
            assert reset[key] == pytest.approx(value, rel=1e-9), key


def test_window_keeps_only_the_last_part():
    full = figures_of(_h200_expositions())
    last = figures_of(_h200_expositions(), window=2.0)
    assert last["window_seconds"] < full["window_seconds"]
    assert 1.5 <= last["window_seconds"] <= 2.5


def test_nan_and_inf_samples_are_absent_not_poison():
    import json

    from kvoffload.analysis.window import Window
    from kvoffload.ingest.catalog import extract

    win = Window(30.0)
    for t in range(0, 120, 10):
        usage = "NaN" if t == 20 else "+Inf" if t == 30 else "0.5"
        tokens = "NaN" if t == 40 else t
        body = (
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {usage}\n'
            f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} {tokens}\n'
        )
        win.update(extract(parse_text(body, wanted, WANTED_FAMILIES), 1000.0 + t, "i"))
    (group,) = analyze_window(win)
    assert group["figures"]["gpu_kv_usage_ratio"] == 0.5
    assert group["figures"]["prompt_tokens_per_second"] == pytest.approx(1.0)
    json.dumps(group, allow_nan=False)


def test_tiering_secondary_tier_series_do_not_hide_the_cpu_tier():
    text = SAMPLE.read_text().replace(
        'vllm:kv_offload_config_info{cpu_blocks_per_chunk="1"',
        'vllm:kv_offload_config_info{cpu_blocks_per_chunk="",cpu_kv_cache_size_bytes="",'
        'cpu_kv_cache_size_tokens="",cpu_num_chunks="",engine="0",'
        'model_name="Qwen/Qwen3-Reranker-0.6B",tier="1:fs"} 1.0\n'
        'vllm:kv_offload_config_info{cpu_blocks_per_chunk="1",tier="0:primary"',
    )
    f = figures_of([parse_text(text, wanted, WANTED_FAMILIES)])["figures"]
    assert f["cpu_capacity_tokens"] == 4_672 and f["cpu_capacity_bytes"] == 535_822_336


def test_request_gauges_are_summed_over_engines_ratios_averaged():
    from kvoffload.analysis.window import Window
    from kvoffload.ingest.catalog import extract

    win = Window(None)
    for t in (0, 60):
        body = "".join(
            f'vllm:num_requests_waiting_by_reason{{engine="{e}",model_name="m",'
            f'reason="capacity"}} 4\nvllm:kv_cache_usage_perc{{engine="{e}",model_name="m"}} '
            f'{0.2 * (e + 1)}\nvllm:prompt_tokens_total{{engine="{e}",model_name="m"}} {t}\n'
            for e in (0, 1)
        )
        win.update(extract(parse_text(body, wanted, WANTED_FAMILIES), 1000.0 + t, "i"))
    (group,) = analyze_window(win)
    assert group["figures"]["waiting_for_capacity"] == 8
    assert group["figures"]["gpu_kv_usage_ratio"] == pytest.approx(0.3)


def test_engines_are_those_of_the_latest_scrape():
    from kvoffload.analysis.window import Window
    from kvoffload.ingest.catalog import extract

    win = Window(None)
    for t, engines in ((0, (0, 1)), (60, (0, 1)), (120, (0,))):  # DP 2 → 1
        body = "".join(
            f'vllm:prompt_tokens_total{{engine="{e}",model_name="m"}} {t}\n' for e in engines
        )
        win.update(extract(parse_text(body, wanted, WANTED_FAMILIES), 1000.0 + t, "i"))
    (group,) = analyze_window(win)
    assert group["engines"] == ["0"]
