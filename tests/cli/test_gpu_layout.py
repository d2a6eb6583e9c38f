"""`pdserve up --gpus`: the pods' GPU layout (exact ids per pod), the ids accepted, the GPUs visible by default, and
the CUDA_VISIBLE_DEVICES each started pod process gets."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from cli.cluster import LocalCluster
from cli.cluster_config import ClusterConfig, parse_gpus, visible_gpus
from cli.gpu_slots import GpuSlots
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


def test_pods_added_later_take_the_least_held_gpu_and_a_drained_pods_gpu_is_free_once_it_exits() -> None:
    config = ClusterConfig(num_prefill=1, num_decode=1, gpus=("0", "1", "2"))
    assert [config.visible_devices(index) for index in range(3)] == ["0,1,2", "1,2,0", "2,0,1"]
    slots = GpuSlots(config)
    live = ["prefill-0", "decode-0"]
    assert [slots.take(pod_id, live) for pod_id in live] == ["0,1,2", "1,2,0"]
    assert slots.next_is_free(live)
    live.append("decode-1")
    assert slots.take("decode-1", live) == "2,0,1"
    assert not slots.next_is_free(live)  # every GPU holds a pod: the next would share GPU 0
    # prefill-0 drains: it holds GPU 0 while it lives; once it exited (released), GPU 0 is free again.
    assert slots.taken(live) == [0, 1, 2]
    live.remove("prefill-0")
    slots.release("prefill-0")
    assert slots.next_is_free(live) and slots.take("decode-2", live) == "0,1,2"
    assert GpuSlots(ClusterConfig()).take("prefill-0", []) is None and ClusterConfig().next_gpu([]) is None


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
    first; a pod that failed to start holds no GPU, so the next one gets the same."""
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
        "decode-0": "GPU 3,5 PCI_BUS_ID\n",
        "decode-1": "GPU 3,5 PCI_BUS_ID\n",
    }
