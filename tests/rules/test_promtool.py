"""promtool on every generated rule file, and the alert unit tests of alerts/tests/."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from kvoffload.mixin.alerts import ALERT_NAMES

from promtool_cases import TEST_FILE, all_cases, build
from rules_procs import PROMTOOL, need

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "alerts"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    need(PROMTOOL)
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, timeout=240, check=False
    )


@pytest.mark.parametrize("name", ["rules/kvoffload-rules.yaml", "rules/kvoffload-alerts.yaml"])
def test_promtool_check_rules(name: str) -> None:
    result = promtool("check", "rules", str(ALERTS / name))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_prometheusrule_holds_both_files_and_checks(tmp_path: Path) -> None:
    obj = yaml.safe_load((ALERTS / "kubernetes" / "kvoffload-prometheusrule.yaml").read_text())
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert obj["kind"] == "PrometheusRule"
    assert obj["metadata"]["name"] and obj["metadata"]["labels"]
    files = [
        yaml.safe_load((ALERTS / n).read_text())["groups"]
        for n in ("rules/kvoffload-rules.yaml", "rules/kvoffload-alerts.yaml")
    ]
    assert obj["spec"]["groups"] == files[0] + files[1]
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(obj["spec"]))
    result = promtool("check", "rules", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", TEST_FILE.name, cwd=TEST_FILE.parent)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "SUCCESS" in result.stdout


def test_unit_test_file_is_up_to_date() -> None:
    assert TEST_FILE.read_text() == build(), (
        "alerts/tests is stale: run `python tests/rules/promtool_cases.py`"
    )


def test_every_alert_is_tested_firing_quiet_escaped_and_across_resets() -> None:
    cases = all_cases()
    for alert in ALERT_NAMES:
        mine = [c for c in cases if c.alert == alert]
        assert any(c.fires for c in mine), f"{alert}: no case where it fires"
        assert any(not c.fires for c in mine), f"{alert}: no case where it stays quiet"
        sidecar_only = (
            "KVOffloadExporterTargetDown",
            "KVOffloadSlowerThanRecompute",
            "KVOffloadHostMemoryNearLimit",
            "KVOffloadSidecarDown",
        )
        if alert in sidecar_only:
            continue  # reads only the sidecar's own series: no vLLM names, no vLLM counters
        series = [s["series"] for c in mine for s in c.series]
        assert any(
            s.startswith("vllm_") for c in mine if c.fires for s in (i["series"] for i in c.series)
        ), f"{alert}: no escaped-name case"
        assert any("reset" in c.name for c in mine), f"{alert}: no counter-reset case"
        assert any(s.startswith("vllm:") for s in series), f"{alert}: no vllm: names"
    transfer_alerts = (
        "KVOffloadLowPrefixReuse",
        "KVOffloadBufferOversized",
        "KVOffloadTransferSlow",
    )
    for alert in transfer_alerts:
        legacy_only = [
            c
            for c in cases
            if c.alert == alert
            and c.fires
            and any("transfer_type" in s["series"] for s in c.series)
            and not any("kv_offload_store_bytes_total" in s["series"] for s in c.series)
        ]
        assert legacy_only, f"{alert}: no firing case on deprecated transfer_type names only"
