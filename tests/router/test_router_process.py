"""What a router process is among its siblings (router.processes.router_process): the default process count from the
cores, the run folder's paths and each process's share of the router's figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.processes.router_process import RouterProcess, default_num_workers, num_workers


@pytest.mark.parametrize(
    ("num_cpus", "expected"), [(1, 1), (2, 1), (7, 1), (8, 2), (12, 3), (16, 4), (31, 7), (32, 8), (128, 8)]
)
def test_the_default_is_one_process_per_four_cores_from_one_to_eight(num_cpus: int, expected: int) -> None:
    assert default_num_workers(num_cpus) == expected


def test_a_configured_count_is_kept() -> None:
    assert (num_workers(1), num_workers(3), num_workers(12)) == (1, 3, 12)


def test_a_process_knows_its_siblings_and_its_share(tmp_path: Path) -> None:
    process = RouterProcess(1, 3, tmp_path)
    assert process.grouped
    assert process.address() == f"unix:{tmp_path}/router-1.sock"
    assert process.sibling_addresses() == [f"unix:{tmp_path}/router-0.sock", f"unix:{tmp_path}/router-2.sock"]
    assert (process.counts_path, process.metrics_dir) == (tmp_path / "counts", tmp_path / "metrics")
    assert (process.share(10.0), process.share(100)) == (10.0 / 3, 100 / 3)
    assert [process.tokenizer_pool_size(total) for total in (1, 2, 3, 4, 7)] == [1, 1, 1, 2, 3]


def test_a_lone_process_has_everything_to_itself() -> None:
    alone = RouterProcess()
    assert (alone.grouped, alone.sibling_addresses(), alone.share(10.0), alone.tokenizer_pool_size(2)) == (
        False,
        [],
        10.0,
        2,
    )
    with pytest.raises(RuntimeError, match="no run folder"):
        alone.address()
