"""The batch-1 decode floor of an MoE model counts the routed experts only."""

from __future__ import annotations

import json

from bench.reporting.limits import active_decode_bytes_per_step
from engine.models.arch_config import ArchConfig
from engine.models.shapes import MODEL_SHAPES


def test_qwen3_30b_a3b_reads_its_eight_experts_per_layer() -> None:
    arch = ArchConfig.from_dict(json.loads(json.dumps(MODEL_SHAPES["qwen3-30b-a3b"])))
    attention = 48 * 2048 * (2 * 32 * 128 + 2 * 4 * 128)
    experts = 48 * (128 * 2048 + 8 * 3 * 2048 * 768)
    head_and_row = 151937 * 2048
    assert active_decode_bytes_per_step(arch, 2, 0) == 2 * (attention + experts + head_and_row) == 6_083_317_760
    assert active_decode_bytes_per_step(arch, 2, 10) - active_decode_bytes_per_step(arch, 2, 0) == 10 * 2 * 48 * 2 * 512
