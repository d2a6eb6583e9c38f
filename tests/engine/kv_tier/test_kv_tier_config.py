"""Bad host-tier settings are InvalidArgumentErrors naming their field."""

from __future__ import annotations

from typing import Any

import pytest

from common.errors import InvalidArgumentError
from engine.llm import engine_config
from router.config import RoutingConfig


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"swap_space": -1.0}, "swap_space"),
        ({"swap_min_tokens": -1}, "swap_min_tokens"),
        ({"cpu_offload_gb": -0.5}, "cpu_offload_gb"),
        ({"swap_space": 1.0, "tensor_parallel_size": 2}, "swap_space"),
        ({"cpu_offload_gb": 1.0, "pipeline_parallel_size": 2}, "cpu_offload_gb"),
    ],
)
def test_bad_engine_settings_name_their_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        engine_config("m", **kwargs)
    assert raised.value.field == field


def test_host_hit_weight_is_a_fraction() -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        RoutingConfig(host_hit_weight=1.5)
    assert raised.value.field == "host_hit_weight"
