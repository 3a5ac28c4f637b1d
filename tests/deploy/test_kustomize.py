"""deploy/kustomize renders with the real kubectl and every object it renders is valid: built-in
kinds against Kubernetes' own schemas (kubernetes-validate, strict), the Prometheus Operator's
against its CRD schemas (vendored in schemas/: prometheus-operator v0.93.0). And it says what
the rest of the repository says: the sidecar's flags, port and environment are the CLI's, the
PodMonitor's job labels are the rules' selectors, the PrometheusRule and the dashboards are
the generated files."""

from __future__ import annotations

import copy
import json
import shutil
from typing import Any

import click
import jsonschema
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from kustomize_render import (
    K8S_VERSIONS,
    KUSTOMIZE,
    MIN_KUSTOMIZE,
    OPERATOR_GROUP,
    ROOT,
    default_port,
    kubectl,
    kustomize_version,
    one,
    render,
    validate_operator_object,
)

from kvoffload import __version__
from kvoffload.cli import cli
from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.kustomize import DASHBOARD_LABEL

OVERLAYS = ("without-kv-events", "with-kv-events")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    version = kustomize_version(kubectl())
    assert version >= MIN_KUSTOMIZE, (
        f"{kubectl()}: kustomize {version} is too old (need v5: kubectl ≥ 1.27)"
    )
    return {name: render(KUSTOMIZE / "overlays" / name) for name in OVERLAYS}


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    spec = one(docs, "Deployment", "vllm")["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"]}


# -- rendering and schemas -----------------------------------------------------------------


def test_each_overlay_renders_the_same_set_of_objects(rendered) -> None:
    kinds = {
        name: sorted((d["kind"], d["metadata"]["name"]) for d in docs)
        for name, docs in rendered.items()
    }
    assert (
        kinds["with-kv-events"]
        == kinds["without-kv-events"]
        == [
            ("ConfigMap", "kvoffload-dashboard-fleet"),
            ("ConfigMap", "kvoffload-dashboard-overview"),
            ("Deployment", "vllm"),
            ("PodMonitor", "kvoffload-sidecar"),
            ("PodMonitor", "vllm"),
            ("PrometheusRule", "kvoffload"),
            ("Service", "vllm"),
        ]
    )


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_builtin_objects_are_valid_kubernetes(rendered, version: str) -> None:
    for docs in rendered.values():
        for doc in docs:
            if doc["apiVersion"] == OPERATOR_GROUP:
                continue
            kubernetes_validate.validate(doc, version, strict=True)


def test_operator_objects_are_valid_for_its_crds(rendered) -> None:
    for docs in rendered.values():
        operator = [d for d in docs if d["apiVersion"] == OPERATOR_GROUP]
        assert {d["kind"] for d in operator} == {"PodMonitor", "PrometheusRule"}
        for doc in operator:
            validate_operator_object(doc)


def test_the_crd_schemas_catch_a_misspelt_or_wrong_field(rendered) -> None:
    monitor = one(rendered["without-kv-events"], "PodMonitor", "vllm")
    typo = copy.deepcopy(monitor)
    typo["spec"]["podMetricEndpoints"] = typo["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError):
        validate_operator_object(typo)
    bad_action = copy.deepcopy(monitor)
    bad_action["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["action"] = "rename"
    with pytest.raises(jsonschema.ValidationError):
        validate_operator_object(bad_action)
    rule = copy.deepcopy(one(rendered["without-kv-events"], "PrometheusRule"))
    del rule["spec"]["groups"][0]["rules"][0]["expr"]
    with pytest.raises(jsonschema.ValidationError):
        validate_operator_object(rule)


def test_kubernetes_validate_catches_a_wrong_field(rendered) -> None:
    deployment = copy.deepcopy(one(rendered["without-kv-events"], "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][1]["envv"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


# -- what the manifests say agrees with the rest of the repository -------------------------


def test_the_rule_and_dashboards_are_the_generated_files(rendered) -> None:
    rule_file = ROOT / "alerts" / "kubernetes" / "kvoffload-prometheusrule.yaml"
    generated = yaml.safe_load(rule_file.read_text())
    provisioning = {
        p.name: p.read_text() for p in (ROOT / "dashboards/provisioning").glob("*.json")
    }
    for docs in rendered.values():
        assert one(docs, "PrometheusRule")["spec"] == generated["spec"]
        maps = [d for d in docs if d["kind"] == "ConfigMap"]
        found = {}
        for m in maps:
            assert DASHBOARD_LABEL.items() <= m["metadata"]["labels"].items()
            assert len(m["data"]) == 1
            found |= m["data"]
            size = sum(len(v.encode()) for v in m["data"].values())
            assert size < 200_000, "client-side kubectl apply annotates up to 256 KiB"
        assert found == provisioning


def test_the_sidecar_runs_the_cli_as_it_is(rendered) -> None:
    port = default_port()
    for name, docs in rendered.items():
        c = containers(docs)
        assert list(c) == ["vllm", "kvoffload"]  # the KV-event overlay patches by index
        sidecar = c["kvoffload"]
        args = sidecar["args"]
        assert args[0] == "serve"
        result = CliRunner().invoke(cli, [*args, "--help"])  # every flag exists
        assert result.exit_code == 0, (name, result.output)
        # The port is --web.listen-address's default: the args leave it alone.
        assert not any(a.startswith("--web.listen-address") for a in args)
        assert sidecar["ports"] == [{"containerPort": port, "name": "kvoffload"}]
        service = one(docs, "Service", "vllm")
        (svc_port,) = [p for p in service["spec"]["ports"] if p["name"] == "kvoffload"]
        assert svc_port == {"name": "kvoffload", "port": port, "targetPort": "kvoffload"}
        image, _, tag = sidecar["image"].rpartition(":")
        assert image == "kvoffload" and tag == __version__


def test_the_memory_check_reads_the_vllm_containers_limit(rendered, monkeypatch) -> None:
    """KVOFFLOAD_MEMORY_LIMIT from the Downward API is --memory-limit: the vllm container's
    limit, which the pinned CPU tier counts against, not the sidecar's own."""
    for docs in rendered.values():
        c = containers(docs)
        env = {e["name"]: e for e in c["kvoffload"]["env"]}
        ref = env["KVOFFLOAD_MEMORY_LIMIT"]["valueFrom"]["resourceFieldRef"]
        assert ref == {"containerName": "vllm", "resource": "limits.memory"}
        assert c["vllm"]["resources"]["limits"]["memory"] == "48Gi"
        # The target's address is the pod's IP, as Prometheus names vLLM's instance.
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert "--target=http://$(POD_IP):8000/metrics" in c["kvoffload"]["args"]
    # What the Downward API puts there (bytes, as a decimal string) is what the CLI reads.
    monkeypatch.setenv("KVOFFLOAD_MEMORY_LIMIT", str(48 * 2**30))
    ctx = click.Context(cli)
    serve = cli.get_command(ctx, "serve")  # type: ignore[attr-defined]
    sub = serve.make_context("serve", ["--target", "http://127.0.0.1:8000/metrics"], parent=ctx)
    assert sub.params["memory_limit"] == 48 * 2**30


def test_kv_events_only_in_their_overlay(rendered) -> None:
    plain = containers(rendered["without-kv-events"])
    assert not any("kv-events" in a for c in plain.values() for a in c.get("args", []))
    c = containers(rendered["with-kv-events"])
    (config_arg,) = [a for a in c["vllm"]["args"] if a.startswith("--kv-events-config=")]
    config = json.loads(config_arg.split("=", 1)[1])
    assert config["enable_kv_cache_events"] is True and config["publisher"] == "zmq"
    ports = {k: config[k].rsplit(":", 1)[1] for k in ("endpoint", "replay_endpoint")}
    args = dict(a.split("=", 1) for a in c["kvoffload"]["args"][1:])
    assert args["--kv-events"] == f"tcp://127.0.0.1:{ports['endpoint']}"
    assert args["--kv-events-replay"] == f"tcp://127.0.0.1:{ports['replay_endpoint']}"
    # --state-dir is a mounted volume (the root filesystem is read-only).
    mounts = {m["mountPath"]: m["name"] for m in c["kvoffload"]["volumeMounts"]}
    volumes = one(rendered["with-kv-events"], "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert mounts[args["--state-dir"]] in {v["name"] for v in volumes}
    assert c["kvoffload"]["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_podmonitors_scrape_what_the_rules_select(rendered) -> None:
    """Base's PodMonitor scrapes vLLM, the component's the sidecar: each port once, with the
    job label the rules select, from pods they select."""
    cfg = MixinConfig()
    wanted = {
        "http": cfg.vllm_selector,  # job="vllm"
        "kvoffload": cfg.sidecar_selector,  # job="kvoffload"
    }
    for docs in rendered.values():
        pod = one(docs, "Deployment", "vllm")["spec"]["template"]
        labels = pod["metadata"]["labels"]
        assert one(docs, "Service")["spec"]["selector"].items() <= labels.items()
        port_names = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        scraped = []
        for monitor in [d for d in docs if d["kind"] == "PodMonitor"]:
            assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
            for endpoint in monitor["spec"]["podMetricsEndpoints"]:
                assert endpoint["port"] in port_names
                (job,) = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
                assert wanted[endpoint["port"]] == f'job="{job["replacement"]}"'
                scraped.append(endpoint["port"])
        assert sorted(scraped) == sorted(wanted)


def test_every_image_is_pinned(rendered) -> None:
    for docs in rendered.values():
        for c in containers(docs).values():
            name, _, tag = c["image"].rpartition(":")
            assert name and tag and tag != "latest", c["image"]


def test_regenerated_rules_and_dashboards_flow_into_the_manifests(rendered, tmp_path) -> None:
    """`kvoffload generate --out DIR` for other labels writes alerts/ and dashboards/ as
    kustomize bases: deploy/kustomize next to them renders the regenerated files."""
    from kvoffload.mixin.generate import generate

    generate(tmp_path, selector='job="llm", namespace="prod"', dashboard_uid_prefix="llm")
    shutil.copytree(KUSTOMIZE, tmp_path / "deploy" / "kustomize")
    docs = render(tmp_path / "deploy" / "kustomize" / "overlays" / "without-kv-events")
    rule = yaml.safe_dump(one(docs, "PrometheusRule")["spec"])
    assert 'job="llm", namespace="prod"' in rule and 'job="vllm"' not in rule
    maps = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap")
    assert maps == ["llm-dashboard-fleet", "llm-dashboard-overview"]


def test_no_service_link_variables_reach_vllm(rendered) -> None:
    """A Service named `vllm` makes Kubernetes inject VLLM_PORT=tcp://IP:8000, which vLLM
    reads as its own setting and rejects at start (a crash loop): the pod turns service links
    off, and no VLLM_* variable is set by hand either."""
    for name, docs in rendered.items():
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        pod = deployment["spec"]["template"]["spec"]
        assert pod.get("enableServiceLinks") is False, name
        assert one(docs, "Service", "vllm")  # the name that needs it
        for container in pod["containers"]:
            env = [e["name"] for e in container.get("env", [])]
            assert not [e for e in env if e.startswith("VLLM_PORT")], (name, env)
