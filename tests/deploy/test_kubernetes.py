"""deploy/kubernetes: both overlays render with `kubectl kustomize`, keep pdserve's rules (separate scalers for
prefill and decode, probes on the serving ports, grace periods covering the drain, a PDB per role), and validate
against the Kubernetes schemas (kubernetes-validate; KEDA's CRDs are not in them)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from common.metrics import ServiceMetrics
from router.__main__ import parse_args as parse_router_args
from tests.deploy.helpers import DEFAULT_DRAIN_TIMEOUT_S, ROOT, ROUTER_DRAIN_S, flag_value, require_tool

KUSTOMIZE_ROOT = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "gpu")
ROLES = ("router", "prefill", "decode")
SCALED_ROLES = ("prefill", "decode")
SCHEMA_VERSION = "1.30.0"
"""The oldest Kubernetes the manifests target: native gRPC probes are GA from 1.27."""

Resource = dict[str, Any]


def _render(overlay: str) -> list[Resource]:
    result = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(KUSTOMIZE_ROOT / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[Resource]]:
    return request.param, _render(request.param)


def _of_kind(resources: list[Resource], kind: str) -> dict[str, Resource]:
    return {r["metadata"]["name"]: r for r in resources if r["kind"] == kind}


def _container(deployment: Resource) -> Resource:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _containers(resources: list[Resource]) -> Iterator[tuple[str, Resource]]:
    for name, deployment in _of_kind(resources, "Deployment").items():
        yield name, _container(deployment)


def test_every_role_has_a_deployment_and_a_service(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    deployments, services = _of_kind(resources, "Deployment"), _of_kind(resources, "Service")
    assert {*ROLES, "redis"} <= set(deployments)
    assert {*ROLES, "redis"} <= set(services)
    for name, service in services.items():
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items(), name


def test_prefill_and_decode_scale_independently(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    scalers = _of_kind(resources, "ScaledObject")
    targets = {s["spec"]["scaleTargetRef"]["name"]: s for s in scalers.values()}
    assert sorted(targets) == sorted(SCALED_ROLES), "one ScaledObject per scaled role, and only those"
    deployments = _of_kind(resources, "Deployment")
    metric_names = {family.name for family in ServiceMetrics("prefill").registry.collect()}
    for role, scaler in targets.items():
        assert role in deployments
        assert scaler["spec"]["minReplicaCount"] >= 1, "a role at 0 pods cannot serve the first request"
        assert scaler["spec"]["maxReplicaCount"] > scaler["spec"]["minReplicaCount"]
        for trigger in scaler["spec"]["triggers"]:
            assert trigger["type"] == "prometheus"
            query = trigger["metadata"]["query"]
            assert f'role="{role}"' in query, f"{role} scales on another role's load: {query}"
            assert any(name in query for name in metric_names), f"{query} names no pdserve metric"
            float(trigger["metadata"]["threshold"])


def test_probes_use_the_serving_ports(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    services = _of_kind(resources, "Service")
    for name, container in _containers(resources):
        if name not in ROLES:
            continue
        grpc_port = int(flag_value(container["args"], "--port") or 0)
        container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert container_ports["grpc"] == grpc_port, name
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == grpc_port, f"{name} {probe}"
        service_ports = {p["name"]: p for p in services[name]["spec"]["ports"]}
        for port_name, port in container_ports.items():
            assert service_ports[port_name]["targetPort"] in (port, port_name), f"{name} {port_name}"
            assert service_ports[port_name]["port"] == port, f"{name} {port_name}"
        if name == "decode":
            assert container_ports["kv"] == int(flag_value(container["args"], "--kv-port") or 0)


def test_grace_period_covers_prestop_and_drain(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    for name, deployment in _of_kind(resources, "Deployment").items():
        if name not in ROLES:
            continue
        spec = deployment["spec"]["template"]["spec"]
        container = _container(deployment)
        drain = (
            ROUTER_DRAIN_S
            if name == "router"
            else float(flag_value(container["args"], "--drain-timeout-s") or DEFAULT_DRAIN_TIMEOUT_S)
        )
        command = container["lifecycle"]["preStop"]["exec"]["command"]
        assert command[0] == "sleep", name
        assert spec["terminationGracePeriodSeconds"] >= float(command[1]) + drain, name


def test_a_disruption_budget_per_role(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    deployments = _of_kind(resources, "Deployment")
    budgets = list(_of_kind(resources, "PodDisruptionBudget").values())
    for role in ROLES:
        labels = deployments[role]["spec"]["template"]["metadata"]["labels"]
        matching = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(matching) == 1, f"{role}: {len(matching)} PodDisruptionBudgets"


def test_pods_are_scraped_on_their_metrics_port(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    for name, deployment in _of_kind(resources, "Deployment").items():
        if name not in ROLES:
            continue
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        container = _container(deployment)
        metrics_port = flag_value(container["args"], "--metrics-port")
        assert annotations["prometheus.io/scrape"] == "true", name
        assert annotations["prometheus.io/port"] == metrics_port, name
        assert {"name": "metrics", "containerPort": int(metrics_port or 0)} in container["ports"], name


def test_pods_advertise_their_pod_ip_and_read_the_redis_password_from_a_secret(
    overlay: tuple[str, list[Resource]],
) -> None:
    _, resources = overlay
    for name, container in _containers(resources):
        env = {e["name"]: e for e in container.get("env", [])}
        if name in SCALED_ROLES:
            assert flag_value(container["args"], "--host") == "0.0.0.0"
            assert flag_value(container["args"], "--advertise-host") == "$(POD_IP)"
            assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        if name in ROLES:
            assert flag_value(container["args"], "--redis-url") == "redis://:$(REDIS_PASSWORD)@redis:6379/0"
        if name in (*ROLES, "redis"):
            assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "pdserve-redis", "key": "password"}


def test_pdserve_containers_run_as_the_image_user(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    for name, deployment in _of_kind(resources, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert _container(deployment)["securityContext"]["allowPrivilegeEscalation"] is False, name


def test_overlay_images_and_gpus(overlay: tuple[str, list[Resource]]) -> None:
    name, resources = overlay
    for role, container in _containers(resources):
        if role not in ROLES:
            continue
        assert container["image"] == f"localhost/pdserve:{'cuda' if name == 'gpu' else 'cpu'}", role
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu")
        if role in SCALED_ROLES:
            assert env["PDSERVE_KV_TRANSFER_BACKEND"] == ("nccl" if name == "gpu" else "tcp"), role
            assert "--kv-transfer-backend=$(PDSERVE_KV_TRANSFER_BACKEND)" in container["args"], role
            assert gpus == (1 if name == "gpu" else None), role
        else:
            assert gpus is None, role


def test_manifests_match_the_kubernetes_schemas(overlay: tuple[str, list[Resource]]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    _, resources = overlay
    checked = 0
    for resource in resources:
        if resource["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: not in the Kubernetes schemas
        kubernetes_validate.validate(resource, SCHEMA_VERSION, strict=True)
        checked += 1
    assert checked >= 10


def test_the_router_runs_a_worker_per_requested_core(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    container = _container(_of_kind(resources, "Deployment")["router"])
    environment = {variable["name"]: variable.get("value") for variable in container["env"]}
    config, _, _, _ = parse_router_args([], {"PDSERVE_ROUTER_WORKERS": environment["PDSERVE_ROUTER_WORKERS"]})
    assert config.workers >= 2
    assert float(container["resources"]["requests"]["cpu"]) >= config.workers
