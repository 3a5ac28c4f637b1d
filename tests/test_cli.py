"""The command line as a user runs it: exit codes, one-line errors, record → analyze → promtool."""

import json
import subprocess
import sys
import time

import pytest

from helpers import SAMPLE, free_port

KVO = [sys.executable, "-m", "kvoffload"]
CONTRACT_FIGURES = {
    "offload_hit_ratio",
    "gpu_prefix_hit_ratio",
    "load_gbps",
    "store_gbps",
    "reuse_ratio",
    "wasted_bytes",
    "kv_bytes_per_token",
    "recompute_tokens_per_second",
    "load_tokens_per_second",
    "speedup",
    "cpu_capacity_tokens",
    "gpu_capacity_tokens",
}


def kvo(*args, timeout=60):
    return subprocess.run([*KVO, *args], capture_output=True, text=True, timeout=timeout)


def journal_scrapes(journal) -> int:
    """How many scrapes a recording journal holds so far: its distinct sample timestamps."""
    if not journal.exists():
        return 0
    lines = journal.read_text(errors="replace").splitlines()[:-1]  # the last may be cut
    return len({ln.rsplit(" ", 1)[-1] for ln in lines if ln and not ln.startswith("#")})


def test_analyze_sample_report():
    r = kvo("analyze", str(SAMPLE))
    assert r.returncode == 0, r.stderr
    assert "12.62 GB/s" in r.stdout
    assert "recommendation: KEEP" in r.stdout


def test_analyze_json_contract():
    r = kvo("analyze", str(SAMPLE), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    (group,) = doc["groups"]
    assert group["labels"]["model_name"] == "Qwen/Qwen3-Reranker-0.6B"
    assert group["offloading"] is True
    assert set(group["figures"]) >= CONTRACT_FIGURES
    rec = group["recommendation"]
    # The text report's KEEP, in the JSON's words (any action of the table would say nothing).
    assert rec["action"] == "keep" and rec["reasons"]
    assert set(rec) >= {"action", "kv_offloading_size_gib", "reasons"}


@pytest.fixture
def garbage_files(tmp_path):
    (tmp_path / "binary.om").write_bytes(bytes(range(256)) * 10)
    (tmp_path / "empty.om").write_text("")
    (tmp_path / "truncated.om").write_text('vllm:prompt_tokens_total{engine="0"} 1 100.0\n')
    (tmp_path / "broken.prom").write_text('vllm:prompt_tokens_total{engine="0" 1\n')
    (tmp_path / "html.prom").write_text("<html>502 Bad Gateway</html>\n")
    return tmp_path


@pytest.mark.parametrize(
    "name, words",
    [
        ("missing.om", "no such file"),
        ("binary.om", "not a text file"),
        ("empty.om", "empty file"),
        ("truncated.om", "truncated recording"),
        ("broken.prom", "unterminated label set"),
        ("html.prom", "not a metric line"),
    ],
)
def test_bad_files_exit_2_with_one_line(garbage_files, name, words):
    r = kvo("analyze", str(garbage_files / name))
    assert r.returncode == 2
    assert words in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bad_arguments_exit_2():
    for args in (
        ["analyze"],
        ["analyze", str(SAMPLE), "--window", "soon"],
        ["analyze", "--target", f"http://127.0.0.1:{free_port()}/metrics"],
        ["serve", "--target", "not-a-url"],
    ):
        r = kvo(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr


def test_record_then_analyze_then_promtool_backfill(fixtures_http, promtool, tmp_path):
    out = tmp_path / "rec.om"
    r = kvo(
        "record",
        "--target",
        f"{fixtures_http}/{SAMPLE.name}",
        "--interval",
        "0.3s",
        "--duration",
        "1s",
        "-o",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert text.endswith("# EOF\n") and not (tmp_path / "rec.om.partial").exists()
    first_sample = next(line for line in text.splitlines() if not line.startswith("#"))
    assert 'instance="127.0.0.1:' in first_sample and 'job="vllm"' in first_sample
    assert len(first_sample.rsplit(" ", 2)) == 3  # value and timestamp

    r = kvo("analyze", str(out), "--json")
    assert r.returncode == 0, r.stderr
    (group,) = json.loads(r.stdout)["groups"]
    assert group["figures"]["cpu_capacity_tokens"] == 4672
    assert group["figures"]["loaded_bytes"] == 0  # a static body: nothing moved in between

    r = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(out), str(tmp_path / "tsdb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "NUM SAMPLES" in r.stdout


def test_analyze_live_target(fixtures_http):
    r = kvo(
        "analyze",
        "--target",
        f"{fixtures_http}/{SAMPLE.name}",
        "--duration",
        "0.6s",
        "--interval",
        "0.3s",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    (group,) = json.loads(r.stdout)["groups"]
    assert group["labels"]["instance"].startswith("127.0.0.1:")


@pytest.mark.slow
def test_demo_prints_live_figures():
    r = kvo("demo", "--duration", "7s", "--every", "2s", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "sidecar:" in r.stdout and "/metrics" in r.stdout
    lines = [line for line in r.stdout.splitlines() if "advice:" in line]
    assert lines, r.stdout
    assert "hit 0.2" in lines[-1] and "load 12.6" in lines[-1] and "advice: keep" in lines[-1]


def test_sim_records_a_scenario_that_analyze_reads(tmp_path):
    out = tmp_path / "nr.om"
    r = kvo("sim", "--scenario", "no-reuse", "--record", str(out), "--duration", "20m")
    assert r.returncode == 0, r.stderr
    r = kvo("analyze", str(out), "--json")
    assert r.returncode == 0, r.stderr
    (group,) = json.loads(r.stdout)["groups"]
    assert group["recommendation"]["action"] == "store_threshold"
    assert group["window_seconds"] == pytest.approx(1200)


def test_sim_unknown_scenario_is_a_one_line_error():
    r = kvo("sim", "--scenario", "nope")
    assert r.returncode == 2 and "laptop-eviction" in r.stderr and "Traceback" not in r.stderr
    r = kvo("sim", "--list")
    assert r.returncode == 0 and "buffer-too-small" in r.stdout


def test_thresholds_file_changes_the_advice_and_bad_values_are_one_line_errors(tmp_path):
    good = tmp_path / "thresholds.yaml"
    # 10e9 has no dot: YAML 1.1 reads it as a string, which is still a number to a user
    good.write_text("min_requests: 10\nassumed_load_bytes_per_second: 10e9\n")
    r = kvo("analyze", str(SAMPLE), "--thresholds", str(good))
    assert r.returncode == 0, r.stderr
    # the sample's 27 requests are judged now: one snapshot cannot measure its tier's few ms
    assert "recommendation: KEEP" in r.stdout and "too little data" not in r.stdout
    assert "no measurable TTFT effect" in r.stdout
    good.write_text("min_requests: 10\nlow_reuse_ratio: 0.6\n")
    r = kvo("analyze", str(SAMPLE), "--thresholds", str(good))
    assert "recommendation: STORE_THRESHOLD" in r.stdout  # its reuse ratio 0.30 is under 0.6
    bad = tmp_path / "bad.yaml"
    bad.write_text("min_ttft_saving_seconds: fast\n")
    r = kvo("analyze", str(SAMPLE), "--thresholds", str(bad))
    assert r.returncode == 2 and "threshold 'min_ttft_saving_seconds' must be a number" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_record_closes_the_file_on_sigterm_and_a_killed_one_stays_readable(laptop_sim, tmp_path):
    """SIGTERM (a pod stopping, a driver) ends the recording like Ctrl-C: the journal becomes
    the OpenMetrics file. After SIGKILL the journal (OUT.partial) is what is left: analyze
    reads its complete scrapes and says what it is, `record --finalize` makes the file, and
    both give the same JSON."""
    import signal

    for sig, name in ((signal.SIGTERM, "term.om"), (signal.SIGKILL, "kill.om")):
        out = tmp_path / name
        journal = tmp_path / (name + ".partial")
        rec = subprocess.Popen(
            [
                *KVO,
                "record",
                "--target",
                laptop_sim,
                "--interval",
                "0.2s",
                "--duration",
                "1h",
                "-o",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        # Signalled once more than three scrapes have landed (its SIGTERM handler is in
        # place by then): polled, since a loaded machine can take seconds to start Python.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and journal_scrapes(journal) <= 4:
            time.sleep(0.1)
        assert journal_scrapes(journal) > 4, "record wrote too few scrapes in 60 s"
        rec.send_signal(sig)
        rec.wait(timeout=20)
        assert out.exists() == (sig == signal.SIGTERM)
        assert journal.exists() == (sig == signal.SIGKILL)
        if sig == signal.SIGTERM:
            assert out.read_text().endswith("# EOF\n")
            r = kvo("analyze", str(out), "--json")
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout)["groups"]
            continue
        r = kvo("analyze", str(out))
        assert r.returncode == 2 and f"{journal} is there" in r.stderr, r.stderr
        from_journal = kvo("analyze", str(journal), "--json")
        assert from_journal.returncode == 0, from_journal.stderr
        assert "is the journal of a recording that did not finish" in from_journal.stderr
        assert "complete scrapes" in from_journal.stderr
        # A new recording to the same file must not overwrite the only copy of the data.
        r = kvo("record", "--target", laptop_sim, "-o", str(out))
        assert r.returncode == 2 and "still running or was killed" in r.stderr
        r = kvo("record", "--finalize", str(journal))
        assert r.returncode == 0, r.stderr
        assert out.read_text().endswith("# EOF\n") and not journal.exists()
        from_file = kvo("analyze", str(out), "--json")
        assert from_file.returncode == 0, from_file.stderr
        a, b = json.loads(from_journal.stdout), json.loads(from_file.stdout)
        a.pop("source")
        b.pop("source")
        assert a == b and a["scrapes"] > 3


def test_the_cli_starts_without_the_network_stacks() -> None:
    """`analyze FILE` (and --help, --version) import neither aiohttp, requests nor asyncio: the
    commands that talk to a target or a Prometheus import them when they run (0.5 → 0.2 s a
    start here; a large journal's analyze starts one worker per core besides)."""
    code = (
        "import sys, kvoffload.cli\n"
        "print(sorted({'aiohttp', 'requests', 'asyncio', 'zmq'} & set(sys.modules)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


@pytest.mark.timing
def test_analyze_target_of_non_vllm_metrics_fails_at_once(tmp_path):
    """A node-exporter-like body: one line naming what it found and exit 2 after the first
    scrape, not a report after the whole --duration; progress goes to stderr."""
    (tmp_path / "metrics").write_text(
        '# TYPE node_cpu_seconds counter\nnode_cpu_seconds_total{cpu="0"} 12\n# EOF\n'
    )
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
         "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 20
        while True:
            t0 = time.monotonic()
            r = kvo("analyze", "--target", url, "--duration", "10m", "--interval", "1s")
            if "cannot connect" not in r.stderr or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.returncode == 2, r.stderr
        assert time.monotonic() - t0 < 60  # far from the 10 minutes asked for
        assert "no vLLM metrics" in r.stderr and "Traceback" not in r.stderr
        assert r.stdout == ""
    finally:
        server.terminate()
        server.wait(10)
