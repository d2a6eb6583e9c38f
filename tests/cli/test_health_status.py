"""`pdserve status` and `pdserve health` output from given values (the exact table, JSON and health lines), and
what the CLI imports."""

from __future__ import annotations

import json
import subprocess
import sys

from cli.health import HealthCheck
from cli.status import ClusterStatus, RouterStatus, to_json, to_table
from common.pod_registry import PodInfo

DECODE = PodInfo(
    pod_id="decode-0",
    role="decode",
    address="10.0.0.7:40001",
    model="smollm2-135m",
    generation=17,
    kv_endpoint="10.0.0.7:40002",
    num_running=12,
    num_waiting=3,
    num_free_blocks=100,
    num_total_blocks=512,
)
PREFILL = PodInfo(
    pod_id="prefill-0",
    role="prefill",
    address="10.0.0.8:40003",
    model="smollm2-135m",
    generation=18,
    draining=True,
    num_running=1,
    num_free_blocks=512,
    num_total_blocks=512,
)
ROUTER = RouterStatus("10.0.0.9:50051", "serving")


def test_the_table_aligns_one_row_per_pod_then_the_routers() -> None:
    status = ClusterStatus((DECODE, PREFILL), (ROUTER, RouterStatus("10.0.0.10:50051", "unreachable")))
    assert to_table(status).splitlines() == [
        "POD        ROLE     STATE     ADDRESS         RUNNING  WAITING  FREE/TOTAL BLOCKS  KV USED",
        "decode-0   decode   serving   10.0.0.7:40001       12        3            100/512    80.5%",
        "prefill-0  prefill  draining  10.0.0.8:40003        1        0            512/512     0.0%",
        "",
        "ROUTER           STATE",
        "10.0.0.9:50051   serving",
        "10.0.0.10:50051  unreachable",
    ]


def test_the_table_says_when_no_pod_is_registered_and_shows_no_router_section_without_routers() -> None:
    assert to_table(ClusterStatus((), ())) == "no pods registered"
    assert to_table(ClusterStatus((), (ROUTER,))).splitlines() == [
        "no pods registered",
        "",
        "ROUTER          STATE",
        "10.0.0.9:50051  serving",
    ]


def test_a_pod_without_blocks_shows_no_kv_usage() -> None:
    pod = PodInfo("prefill-1", "prefill", "10.0.0.8:40005", "m", 1)
    assert to_table(ClusterStatus((pod,), ())).splitlines()[1].endswith("0/0        -")
    assert json.loads(to_json(ClusterStatus((pod,), ())))["pods"][0]["kv_usage"] is None


def test_the_json_has_the_documented_keys_and_values() -> None:
    assert json.loads(to_json(ClusterStatus((DECODE, PREFILL), (ROUTER,)))) == {
        "pods": [
            {
                "pod_id": "decode-0",
                "role": "decode",
                "address": "10.0.0.7:40001",
                "state": "serving",
                "num_running": 12,
                "num_waiting": 3,
                "num_free_blocks": 100,
                "num_total_blocks": 512,
                "kv_usage": 0.8047,
                "generation": 17,
                "model": "smollm2-135m",
            },
            {
                "pod_id": "prefill-0",
                "role": "prefill",
                "address": "10.0.0.8:40003",
                "state": "draining",
                "num_running": 1,
                "num_waiting": 0,
                "num_free_blocks": 512,
                "num_total_blocks": 512,
                "kv_usage": 0.0,
                "generation": 18,
                "model": "smollm2-135m",
            },
        ],
        "routers": [{"address": "10.0.0.9:50051", "state": "serving"}],
    }
    assert json.loads(to_json(ClusterStatus((), ()))) == {"pods": [], "routers": []}


def test_a_health_check_describes_itself_in_one_line() -> None:
    assert HealthCheck("h:1", "", "SERVING").describe() == "h:1: SERVING"
    assert HealthCheck("h:1", "pdserve.v1.DecodeService", "NOT_SERVING").describe() == (
        "h:1 pdserve.v1.DecodeService: NOT_SERVING"
    )
    assert HealthCheck("h:1", "", "UNREACHABLE", "UNAVAILABLE: refused").describe() == (
        "h:1: UNREACHABLE (UNAVAILABLE: refused)"
    )
    assert [HealthCheck("h:1", "", s).serving for s in ("SERVING", "NOT_SERVING", "UNKNOWN")] == [True, False, False]


def test_the_cli_imports_no_torch_no_transformers_and_no_redis_client() -> None:
    """`pdserve health` runs as a container healthcheck or a Kubernetes probe: its start must stay light."""
    heavy = ("torch", "transformers", "redis")
    code = f"import sys, cli.main\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {heavy}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
