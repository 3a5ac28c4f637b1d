"""The example configurations are valid for the real tools."""

import shutil
import subprocess
from pathlib import Path

import yaml

EXAMPLES = Path(__file__).parents[1] / "examples"


def test_prometheus_example_config_and_its_rule_files_check(promtool):
    r = subprocess.run(
        [promtool, "check", "config", str(EXAMPLES / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr and "rules found" in r.stdout + r.stderr


def test_alertmanager_example_config_checks():
    amtool = shutil.which("amtool")
    assert amtool, "make test installs Debian's prometheus-alertmanager (amtool)"
    r = subprocess.run(
        [amtool, "check-config", str(EXAMPLES / "alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_compose_example_runs_the_sidecar_with_real_flags():
    """(tests/deploy/ checks the compose file whole, the Kubernetes manifests and the image.)"""
    from click.testing import CliRunner

    from kvoffload.cli import cli

    compose = yaml.safe_load((EXAMPLES / "docker-compose.yml").read_text())
    args = compose["services"]["kvoffload"]["command"]
    assert args[0] == "serve"
    # Every flag the example uses exists: --help parses them without running the server.
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0, result.output
