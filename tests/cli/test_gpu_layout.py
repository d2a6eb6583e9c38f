"""`pdserve up --gpus`: the pods' GPU layout (exact ids per pod), the ids accepted, the GPUs visible by default, and
the CUDA_VISIBLE_DEVICES each started pod process gets."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from cli.cluster import LocalCluster
from cli.cluster_config import ClusterConfig, parse_gpus, visible_gpus
from cli.main import main
from cli.service_process import ClusterError
from common.errors import InvalidArgumentError


@pytest.mark.parametrize(
    ("num_prefill", "num_decode", "gpus", "layout"),
    [
        (1, 1, ("0", "1"), {"prefill-0": "0", "decode-0": "1"}),
        (2, 2, ("0", "1"), {"prefill-0": "0", "prefill-1": "1", "decode-0": "0", "decode-1": "1"}),
        (1, 3, ("0", "1", "2", "3"), {"prefill-0": "0", "decode-0": "1", "decode-1": "2", "decode-2": "3"}),
        (3, 1, ("4", "6"), {"prefill-0": "4", "prefill-1": "6", "prefill-2": "4", "decode-0": "6"}),
        (1, 1, ("GPU-8f2a", "1"), {"prefill-0": "GPU-8f2a", "decode-0": "1"}),
        (2, 1, (), {}),
    ],
)
def test_pods_take_the_gpus_round_robin_prefill_first(
    num_prefill: int, num_decode: int, gpus: tuple[str, ...], layout: dict[str, str]
) -> None:
    config = ClusterConfig(num_prefill=num_prefill, num_decode=num_decode, gpus=gpus)
    assert config.gpu_layout() == layout


def test_pods_added_later_go_on_round_robin() -> None:
    config = ClusterConfig(num_prefill=1, num_decode=1, gpus=("0", "1", "2"))
    assert [config.pod_gpu(index) for index in range(2, 6)] == ["2", "0", "1", "2"]
    assert [config.pod_visible_devices(index) for index in range(3)] == ["0,1,2", "1,2,0", "2,0,1"]
    assert ClusterConfig().pod_gpu(5) is None and ClusterConfig().pod_visible_devices(5) is None


def test_gpu_ids_are_parsed() -> None:
    assert parse_gpus("0, 1,3") == ("0", "1", "3")
    assert parse_gpus("MIG-4b1c/1/0") == ("MIG-4b1c/1/0",)
    assert parse_gpus("none") == parse_gpus("") == ()


@pytest.mark.parametrize(
    ("text", "description"),
    [
        ("0,x", "not GPU ids (indices or GPU-/MIG- UUIDs): 'x'"),
        ("0,,1", "not GPU ids (indices or GPU-/MIG- UUIDs): ''"),
        ("-1", "not GPU ids (indices or GPU-/MIG- UUIDs): '-1'"),
        ("1,0,1", "a GPU is named twice: 1,0,1"),
    ],
)
def test_bad_gpu_ids_are_refused(text: str, description: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        parse_gpus(text)
    assert (caught.value.field, caught.value.description) == ("gpus", description)


def test_pdserve_up_names_the_flag_of_bad_gpu_ids(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--gpus", "0,gpu1"]) == 2
    assert capsys.readouterr().err == "pdserve up: --gpus: not GPU ids (indices or GPU-/MIG- UUIDs): 'gpu1'\n"


def test_visible_gpus_come_from_cuda_visible_devices_then_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '0\\n1\\n'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, str(fake)) == ("2", "3")
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, str(fake)) == ()
    assert visible_gpus({}, str(fake)) == ("0", "1")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert visible_gpus({}) == ()


def test_each_pod_process_gets_its_gpu(tmp_path: Path) -> None:
    """Pods that print their CUDA_VISIBLE_DEVICES and exit: each start fails (no SERVING), its log shows its GPU
    first."""
    show = (
        sys.executable,
        "-c",
        "import os; print('GPU', os.environ['CUDA_VISIBLE_DEVICES'], os.environ['CUDA_DEVICE_ORDER'])",
    )
    config = ClusterConfig(
        redis_url="redis://127.0.0.1:1/0",
        gpus=("3", "5"),
        metrics_port=None,
        log_dir=tmp_path,
        entry_points={"router": show, "prefill": show, "decode": show},
        startup_timeout_s=30,
    )
    cluster = LocalCluster(config)
    for role in ("prefill", "decode", "decode"):
        with pytest.raises(ClusterError, match="exited with code 0 while starting"):
            cluster.add_pod(role)
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in ("prefill-0", "decode-0", "decode-1")}
    assert logs == {
        "prefill-0": "GPU 3,5 PCI_BUS_ID\n",
        "decode-0": "GPU 5,3 PCI_BUS_ID\n",
        "decode-1": "GPU 3,5 PCI_BUS_ID\n",
    }
