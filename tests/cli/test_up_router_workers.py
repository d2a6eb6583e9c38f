"""`pdserve up --router-workers N`: the router of the local cluster runs with `--workers N` (left out: the router's
own default)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cli.cluster import LocalCluster
from cli.cluster_config import ClusterConfig
from cli.main import main
from cli.service_process import ClusterError

_SHOW_ARGS = (sys.executable, "-c", "import sys; print('ARGS', *sys.argv[1:])")
_WAIT = (sys.executable, "-c", "import time; time.sleep(60)")
"""The pods wait (they are stopped with the cluster): the router, printing its flags, is the one that exits."""


@pytest.mark.parametrize(("router_workers", "expected"), [(3, ["--workers", "3"]), (None, [])])
def test_the_cluster_passes_the_worker_count_to_the_router(
    tmp_path: Path, router_workers: int | None, expected: list[str]
) -> None:
    config = ClusterConfig(
        redis_url="redis://127.0.0.1:1/0",
        metrics_port=None,
        log_dir=tmp_path,
        router_workers=router_workers,
        entry_points={"router": _SHOW_ARGS, "prefill": _WAIT, "decode": _WAIT},
        startup_timeout_s=30,
    )
    with pytest.raises(ClusterError, match="router exited with code 0 while starting"):
        LocalCluster(config).start()
    args = (tmp_path / "router.log").read_text().split()
    assert args[:3] == ["ARGS", "--host", "127.0.0.1"]
    assert [arg for i, arg in enumerate(args) if arg == "--workers" or args[i - 1] == "--workers"] == expected


def test_pdserve_up_names_the_flag_of_a_bad_worker_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--router-workers", "-1"]) == 2
    assert capsys.readouterr().err == "pdserve up: --router-workers: must be >= 0, got -1\n"
