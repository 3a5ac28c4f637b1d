"""Deploying into what exists (issue #27, item 1), rendered by the real kubectl and validated as
deploy/kustomize's base is: the sidecar component added to a stand-in of production-stack's
vLLM Deployment changes that Deployment by the sidecar alone (the same container base's pod
gets), only the Deployment named; and the fleet's `serve --prometheus` Deployment, its Service,
PodMonitor and the generated rules. The sidecar's and the fleet's args are parsed by the CLI."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from kustomize_render import (
    KUSTOMIZE,
    MIN_KUSTOMIZE,
    ROOT,
    default_port,
    kubectl,
    kustomize_version,
    one,
    pod_containers,
    render,
    validate_all,
)

from kvoffload import __version__
from kvoffload.cli import cli
from kvoffload.mixin.config import MixinConfig

COMPONENT = KUSTOMIZE / "components" / "sidecar"
EXAMPLE = KUSTOMIZE / "examples" / "production-stack"
FLEET = KUSTOMIZE / "fleet"
STAND_IN = "vllm-llama3-deployment-vllm"
INJECT = "kvoffload.io/inject-sidecar"  # the component's annotation selector
POD_LABEL = "kvoffload.io/sidecar"  # the label it adds, which its PodMonitor selects


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    assert kustomize_version(kubectl()) >= MIN_KUSTOMIZE
    return {
        "example": render(EXAMPLE),
        "fleet": render(FLEET),
        "base": render(KUSTOMIZE / "overlays" / "without-kv-events"),
    }


def stand_in() -> dict[str, Any]:
    """The "existing" Deployment as its own file has it, before any kustomization."""
    doc: dict[str, Any] = yaml.safe_load((EXAMPLE / "vllm-deployment.yaml").read_text())
    return doc


def parse_serve(args: list[str]) -> dict[str, Any]:
    """The args as `kvoffload serve` parses them (every flag exists, every value converts),
    without running it."""
    assert args[0] == "serve"
    ctx = click.Context(cli)
    serve = cli.get_command(ctx, "serve")  # type: ignore[attr-defined]
    return serve.make_context("serve", list(args[1:]), parent=ctx).params


# -- the component on an existing Deployment -----------------------------------------------


def test_the_example_renders_and_validates(rendered) -> None:
    docs = rendered["example"]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("ConfigMap", "kvoffload-dashboard-fleet"),
        ("ConfigMap", "kvoffload-dashboard-overview"),
        ("Deployment", STAND_IN),
        ("PodMonitor", "kvoffload-sidecar"),
        ("PrometheusRule", "kvoffload"),
    ]
    validate_all(docs)


def test_the_sidecar_is_the_one_base_gives_its_own_pod(rendered) -> None:
    """One definition: the container an existing vLLM gets is base's, field for field, and
    comes last (vLLM stays the first container, kubectl's default for logs and exec)."""
    theirs = pod_containers(one(rendered["example"], "Deployment", STAND_IN))
    ours = pod_containers(one(rendered["base"], "Deployment", "vllm"))
    assert list(theirs) == ["vllm", "kvoffload"]
    assert theirs["kvoffload"] == ours["kvoffload"]
    name, _, tag = theirs["kvoffload"]["image"].rpartition(":")
    assert name == "kvoffload" and tag == __version__


def test_the_existing_deployment_changes_by_the_sidecar_alone(rendered) -> None:
    """Its containers, volumes, selector and every other field are what the file says; the
    sidecar, the annotation that chose it and the pod label the PodMonitor selects are all
    that is added."""
    after = copy.deepcopy(one(rendered["example"], "Deployment", STAND_IN))
    assert after["metadata"]["annotations"].pop(INJECT) == "true"
    if not after["metadata"]["annotations"]:
        del after["metadata"]["annotations"]
    pod = after["spec"]["template"]
    assert pod["metadata"]["labels"].pop(POD_LABEL) == "true"
    assert pod["spec"]["containers"].pop()["name"] == "kvoffload"
    assert after == stand_in()


def test_the_sidecar_reads_the_limit_of_a_container_that_exists(rendered) -> None:
    """A resourceFieldRef naming no container of the pod is refused by the API server; the
    one named is the vLLM container, whose memory limit the CPU tier counts against."""
    c = pod_containers(one(rendered["example"], "Deployment", STAND_IN))
    env = {e["name"]: e for e in c["kvoffload"]["env"]}
    ref = env["KVOFFLOAD_MEMORY_LIMIT"]["valueFrom"]["resourceFieldRef"]
    assert ref == {"containerName": "vllm", "resource": "limits.memory"}
    assert c[ref["containerName"]]["resources"]["limits"]["memory"] == "48Gi"
    # The sidecar scrapes vLLM's own port (production-stack's container-port).
    (target,) = [a for a in c["kvoffload"]["args"] if a.startswith("--target=")]
    (vllm_port,) = [p for p in c["vllm"]["ports"] if p["name"] == "container-port"]
    assert target == f"--target=http://$(POD_IP):{vllm_port['containerPort']}/metrics"


def test_only_the_deployment_named_gets_the_sidecar(rendered, tmp_path: Path) -> None:
    """Another Deployment next to it (a router, another model) is left exactly as it is, and
    the sidecar's PodMonitor selects the patched pods, not its."""
    other = copy.deepcopy(stand_in())
    other["metadata"]["name"] = "vllm-router"
    for labels in (
        other["metadata"]["labels"],
        other["spec"]["selector"]["matchLabels"],
        other["spec"]["template"]["metadata"]["labels"],
    ):
        labels["model"] = "router"
    shutil.copy(EXAMPLE / "vllm-deployment.yaml", tmp_path / "vllm-deployment.yaml")
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    shutil.copytree(EXAMPLE / "target", tmp_path / "target")
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": ["vllm-deployment.yaml", "other.yaml"],
                # kustomize takes components by relative path only
                "components": ["target", os.path.relpath(COMPONENT, tmp_path)],
            }
        )
    )
    docs = render(tmp_path)
    validate_all(docs)
    assert one(docs, "Deployment", "vllm-router") == other
    patched = one(docs, "Deployment", STAND_IN)
    assert list(pod_containers(patched)) == ["vllm", "kvoffload"]
    selector = one(docs, "PodMonitor", "kvoffload-sidecar")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= patched["spec"]["template"]["metadata"]["labels"].items()
    assert not selector.items() <= other["spec"]["template"]["metadata"]["labels"].items()


def test_the_podmonitor_leaves_release_to_the_user(rendered) -> None:
    """The component's PodMonitor carries no `release` label (that is the user's Prometheus'
    selector); the example sets one, on it and on the PrometheusRule, and the PodMonitor
    scrapes the sidecar's port as the job the rules select."""
    monitor = yaml.safe_load((COMPONENT / "podmonitor.yaml").read_text())
    assert "release" not in monitor["metadata"]["labels"]
    docs = rendered["example"]
    rendered_monitor = one(docs, "PodMonitor", "kvoffload-sidecar")
    assert rendered_monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert one(docs, "PrometheusRule")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = rendered_monitor["spec"]["podMetricsEndpoints"]
    sidecar = pod_containers(one(docs, "Deployment", STAND_IN))["kvoffload"]
    assert endpoint["port"] == sidecar["ports"][0]["name"]
    (job,) = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
    assert MixinConfig().sidecar_selector == f'job="{job["replacement"]}"'


def test_the_sidecar_args_parse_with_the_cli(rendered, monkeypatch) -> None:
    c = pod_containers(one(rendered["example"], "Deployment", STAND_IN))["kvoffload"]
    monkeypatch.setenv("KVOFFLOAD_MEMORY_LIMIT", str(48 * 2**30))
    params = parse_serve(c["args"])
    assert params["targets"] == ("http://$(POD_IP):8000/metrics",)
    assert params["memory_limit"] == 48 * 2**30
    assert c["ports"] == [{"name": "kvoffload", "containerPort": default_port()}]


# -- the fleet -----------------------------------------------------------------------------


def test_the_fleet_renders_and_validates(rendered) -> None:
    docs = rendered["fleet"]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("ConfigMap", "kvoffload-dashboard-fleet"),
        ("ConfigMap", "kvoffload-dashboard-overview"),
        ("Deployment", "kvoffload-fleet"),
        ("PodMonitor", "kvoffload-fleet"),
        ("PrometheusRule", "kvoffload"),
        ("Service", "kvoffload-fleet"),
    ]
    validate_all(docs)
    rule_file = ROOT / "alerts" / "kubernetes" / "kvoffload-prometheusrule.yaml"
    generated = yaml.safe_load(rule_file.read_text())
    assert one(docs, "PrometheusRule")["spec"] == generated["spec"]


def test_the_fleet_is_one_serve_prometheus_reached_by_its_service_and_monitor(
    rendered,
) -> None:
    docs = rendered["fleet"]
    deployment = one(docs, "Deployment", "kvoffload-fleet")
    assert deployment["spec"]["replicas"] == 1  # two would publish every engine twice
    (container,) = pod_containers(deployment).values()
    params = parse_serve(container["args"])
    assert params["prometheus_url"] == "http://prometheus-operated.monitoring.svc:9090"
    assert params["selector"] == '{job="vllm"}'  # the vLLM series the rules select
    assert MixinConfig().vllm_selector in params["selector"]
    assert params["range_seconds"] == 3600 and params["interval"] == 60
    assert not params["targets"]  # no scraping: the fleet is read from Prometheus
    image, _, tag = container["image"].rpartition(":")
    assert image == "kvoffload" and tag == __version__
    port = default_port()
    assert container["ports"] == [{"name": "kvoffload", "containerPort": port}]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = one(docs, "Service", "kvoffload-fleet")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "kvoffload", "port": port, "targetPort": "kvoffload"}
    ]
    monitor = one(docs, "PodMonitor", "kvoffload-fleet")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "kvoffload"
    (job,) = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
    # Its series stand in for the sidecars' (a `target` per engine): the rules read them so.
    assert MixinConfig().sidecar_selector == f'job="{job["replacement"]}"'


# -- a Helm-installed vLLM: the post-renderer ----------------------------------------------


def test_the_helm_post_renderer_adds_the_sidecar_to_what_helm_rendered(
    rendered, tmp_path: Path
) -> None:
    """post-render.sh as Helm runs it: the rendered manifests on stdin (the stand-in and a
    Service of the chart's), the same manifests on stdout with the sidecar added to the
    Deployment named, exactly as the component's example adds it."""
    shutil.copytree(KUSTOMIZE, tmp_path / "kustomize")  # the script writes next to itself
    script = tmp_path / "kustomize" / "examples" / "helm-post-renderer" / "post-render.sh"
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "vllm-llama3-engine-service"},
        "spec": {
            "selector": {"model": "llama3"},
            "ports": [{"name": "service-port", "port": 80, "targetPort": "container-port"}],
        },
    }
    helm_output = yaml.safe_dump_all([stand_in(), service])
    env = {**os.environ, "PATH": f"{Path(kubectl()).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(
        [str(script)], input=helm_output, capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    validate_all(docs)
    assert one(docs, "Service") == service
    example = one(rendered["example"], "Deployment", STAND_IN)
    assert one(docs, "Deployment", STAND_IN) == example
    assert one(docs, "PodMonitor", "kvoffload-sidecar")
