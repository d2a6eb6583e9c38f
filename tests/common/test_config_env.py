"""Configuration from the environment: `PDSERVE_<FLAG>` variables, flags winning over them, and errors naming
the variable (common.config, through the pods', the router's and the local cluster's entry points)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.child_env import PER_PROCESS_VARIABLES, ChildEnvironment
from common.config import ConfigValueError, add_config_args, config_from_args
from engine.config import CacheConfig, SchedulerConfig
from pod.config import KVReceiverConfig, PodServerConfig, RegistryConfig, parse_pod_config
from router.__main__ import parse_args as parse_router_args
from router.config import RouterConfig, RoutingConfig

REPO_ROOT = Path(__file__).resolve().parents[2]


def _config(cls: type, argv: list[str], environ: dict[str, str]) -> object:
    parser = argparse.ArgumentParser()
    add_config_args(parser, cls)
    return config_from_args(cls, parser.parse_args(argv), environ=environ)


def test_a_variable_sets_its_field_and_a_flag_wins_over_it() -> None:
    environ = {"PDSERVE_NUM_BLOCKS": "64", "PDSERVE_KV_CACHE_MEMORY_GIB": "0.5", "PDSERVE_BLOCK_SIZE": "32"}
    assert _config(CacheConfig, [], environ) == CacheConfig(num_blocks=64, kv_cache_memory_gib=0.5, block_size=32)
    assert _config(CacheConfig, ["--num-blocks", "8"], environ) == CacheConfig(
        num_blocks=8, kv_cache_memory_gib=0.5, block_size=32
    )
    assert _config(CacheConfig, [], {}) == CacheConfig()


@pytest.mark.parametrize(
    ("raw", "expected"), [("1", True), ("TRUE", True), ("Yes", True), ("0", False), ("false", False), ("NO", False)]
)
def test_bool_variables(raw: str, expected: bool) -> None:
    assert _config(CacheConfig, [], {"PDSERVE_ENABLE_PREFIX_CACHING": raw}) == CacheConfig(
        enable_prefix_caching=expected
    )
    assert _config(CacheConfig, ["--no-enable-prefix-caching"], {"PDSERVE_ENABLE_PREFIX_CACHING": raw}) == CacheConfig(
        enable_prefix_caching=False
    )


def test_an_empty_variable_of_an_optional_field_is_none() -> None:
    environ = {"PDSERVE_ASYNC_SCHEDULING": "", "PDSERVE_LONG_PREFILL_TOKEN_THRESHOLD": "", "PDSERVE_POLICY": "priority"}
    assert _config(SchedulerConfig, [], environ) == SchedulerConfig(policy="priority")
    assert _config(SchedulerConfig, [], {"PDSERVE_ASYNC_SCHEDULING": "no"}) == SchedulerConfig(async_scheduling=False)


@pytest.mark.parametrize(
    ("cls", "name", "raw", "description"),
    [
        (CacheConfig, "PDSERVE_NUM_BLOCKS", "abc", "invalid int value 'abc'"),
        (CacheConfig, "PDSERVE_GPU_MEMORY_UTILIZATION", "most", "invalid float value 'most'"),
        (
            CacheConfig,
            "PDSERVE_ENABLE_PREFIX_CACHING",
            "on",
            "invalid bool value 'on' (one of 1, true, yes, 0, false, no)",
        ),
        (CacheConfig, "PDSERVE_BLOCK_SIZE", "", "invalid int value ''"),
        (CacheConfig, "PDSERVE_BLOCK_SIZE", "24", "must be a power of two, got 24"),
        (PodServerConfig, "PDSERVE_HOST", "", "must not be empty"),
    ],
)
def test_a_bad_variable_is_named(cls: type, name: str, raw: str, description: str) -> None:
    with pytest.raises(ConfigValueError) as info:
        _config(cls, [], {name: raw})
    assert (str(info.value), info.value.source, info.value.description) == (f"{name}: {description}", name, description)


def test_a_bad_flag_is_named_even_with_its_variable_set() -> None:
    with pytest.raises(ConfigValueError) as info:
        _config(CacheConfig, ["--block-size", "24"], {"PDSERVE_BLOCK_SIZE": "16"})
    assert str(info.value) == "--block-size: must be a power of two, got 24"


def test_pods_read_their_variables_and_exit_2_naming_a_bad_one(capsys: pytest.CaptureFixture[str]) -> None:
    environ = {
        "PDSERVE_REDIS_URL": "redis://r:1/0",
        "PDSERVE_POD_ID": "decode-env",
        "PDSERVE_KV_PORT": "7000",
        "PDSERVE_NUM_BLOCK": "typo, ignored",
    }
    decode = parse_pod_config("decode", ["--pod-id", "decode-flag"], with_receiver=True, environ=environ)
    assert (decode.registry, decode.receiver) == (
        RegistryConfig(redis_url="redis://r:1/0", pod_id="decode-flag"),
        KVReceiverConfig(kv_port=7000),
    )
    prefill = parse_pod_config("prefill", [], with_receiver=False, environ=environ)
    assert (prefill.registry.pod_id, prefill.receiver) == ("decode-env", None)
    with pytest.raises(SystemExit) as info:
        parse_pod_config("prefill", [], with_receiver=False, environ={"PDSERVE_KV_LEASE_S": "-1"})
    assert info.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1] == "pdserve prefill: error: PDSERVE_KV_LEASE_S: must be > 0, got -1.0"
    )


def test_the_router_reads_its_variables_and_help_names_them(capsys: pytest.CaptureFixture[str]) -> None:
    environ = {"PDSERVE_PORT": "6000", "PDSERVE_MAX_ATTEMPTS": "5", "PDSERVE_METRICS_PORT": ""}
    config, routing, telemetry, _ = parse_router_args(["--port", "0"], environ)
    assert (config, routing, telemetry.metrics_port) == (RouterConfig(port=0), RoutingConfig(max_attempts=5), None)
    with pytest.raises(SystemExit) as info:
        parse_router_args(["--help"], {})
    assert info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(env PDSERVE_REGISTRY_REFRESH_S; default: 1.0)" in help_text
    assert "(env PDSERVE_METRICS_PORT; default: None)" in help_text


def test_the_router_workers_variable_is_named_for_the_router(capsys: pytest.CaptureFixture[str]) -> None:
    config, _, _, _ = parse_router_args([], {"PDSERVE_ROUTER_WORKERS": "3", "PDSERVE_WORKERS": "5"})
    assert config.workers == 3
    assert parse_router_args(["--workers", "2"], {"PDSERVE_ROUTER_WORKERS": "3"})[0].workers == 2
    with pytest.raises(SystemExit):
        parse_router_args([], {"PDSERVE_ROUTER_WORKERS": "-1"})
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: PDSERVE_ROUTER_WORKERS: must be >= 0, got -1")
    with pytest.raises(SystemExit):
        parse_router_args(["--help"], {})
    assert "(env PDSERVE_ROUTER_WORKERS; default: 0)" in " ".join(capsys.readouterr().out.split())


def test_a_real_router_process_names_a_bad_variable() -> None:
    env = {**os.environ, "PDSERVE_REGISTRY_REFRESH_S": "soon"}
    result = subprocess.run(
        [sys.executable, "-m", "router"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert (
        result.stderr.splitlines()[-1]
        == "pdserve router: error: PDSERVE_REGISTRY_REFRESH_S: invalid float value 'soon'"
    )


def test_the_local_cluster_keeps_per_process_variables_from_its_processes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in PER_PROCESS_VARIABLES:
        monkeypatch.setenv(name, "7000")
    monkeypatch.setenv("PDSERVE_NUM_BLOCKS", "64")
    child_env = ChildEnvironment({}, num_pods=2)
    env = child_env.for_process([])
    assert PER_PROCESS_VARIABLES == ("PDSERVE_PORT", "PDSERVE_POD_ID", "PDSERVE_KV_PORT", "PDSERVE_METRICS_PORT")
    assert [name for name in PER_PROCESS_VARIABLES if name in env] == []
    assert env["PDSERVE_NUM_BLOCKS"] == "64"
    monkeypatch.setenv("PDSERVE_MODEL", "x")
    child_env.for_process(["--host", "127.0.0.1", "--model", "m", "--model", "m"])
    child_env.for_process(["--model", "m"])
    assert [r.getMessage() for r in caplog.records] == [
        "PDSERVE_MODEL is ignored: the cluster passes its processes --model (flags win)"
    ]
