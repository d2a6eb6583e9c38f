"""The Grafana dashboard is valid and queries only metrics that ServiceMetrics exports; Prometheus scrapes every
role; the provisioning files point at the dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from common.metrics import ServiceMetrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "pdserve-dashboard.json"
METRIC_NAME = re.compile(r"\bpdserve:[a-zA-Z0-9_:]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _exported() -> tuple[set[str], set[str]]:
    """(series names PromQL can select, histogram base names) of a ServiceMetrics registry."""
    names: set[str] = set()
    histograms: set[str] = set()
    for family in ServiceMetrics("router").registry.collect():
        if family.type == "histogram":
            histograms.add(family.name)
        names.add(f"{family.name}_total" if family.type == "counter" else family.name)
    return names, histograms


def _resolve(name: str, histograms: set[str]) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in histograms:
            return name.removesuffix(suffix)
    return name


def test_dashboard_has_grafana_keys_and_a_prometheus_datasource_variable(dashboard: dict[str, Any]) -> None:
    assert {"uid", "title", "schemaVersion", "panels", "templating", "time", "refresh"} <= dashboard.keys()
    assert dashboard["schemaVersion"] >= 36
    (variable,) = dashboard["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == ("datasource", "datasource", "prometheus")


def test_panels_have_unique_ids_a_place_and_targets_on_the_variable(dashboard: dict[str, Any]) -> None:
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    graphs = [panel for panel in panels if panel["type"] != "row"]
    assert len(graphs) == 17
    for panel in panels:
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys(), panel["title"]
    for panel in graphs:
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
            assert METRIC_NAME.search(target["expr"]), target["expr"]


def test_every_metric_in_the_queries_is_exported(dashboard: dict[str, Any]) -> None:
    exported, histograms = _exported()
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    used = {_resolve(name, histograms) for expr in exprs for name in METRIC_NAME.findall(expr)}
    assert used - exported == set()
    quantiled = {_resolve(n, histograms) for e in exprs if "histogram_quantile" in e for n in METRIC_NAME.findall(e)}
    assert quantiled <= histograms
    assert {"pdserve:time_to_first_token_seconds", "pdserve:inter_token_latency_seconds"} <= quantiled


def test_prometheus_scrapes_every_role_in_compose_and_locally() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {
        job["job_name"]: sorted(t for group in job["static_configs"] for t in group["targets"])
        for job in config["scrape_configs"]
    }
    assert targets == {
        "pdserve-router": ["localhost:9100", "router:9100"],
        "pdserve-prefill": ["localhost:9101", "prefill:9100"],
        "pdserve-decode": ["decode:9100", "localhost:9102"],
    }


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus() -> None:
    provisioning = DEPLOY / "grafana" / "provisioning"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "pdserve.yaml").read_text())["providers"]
    assert (provider["type"], provider["options"]["path"]) == ("file", "/var/lib/grafana/dashboards/pdserve")
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert (datasource["type"], datasource["url"]) == ("prometheus", "http://prometheus:9090")
