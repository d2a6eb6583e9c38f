from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.block_hash import block_extra_keys, hash_block_tokens, hash_prompt_blocks

REPO_ROOT = Path(__file__).resolve().parents[2]
BLOCK_SIZE = 4
TOKENS = [1, 15043, 3186, 29892, 920, 526, 366, 29973, 151_642, 0, 7, 7, 42, 2]  # 3 full blocks + 2


@pytest.mark.parametrize("hash_seed", ["0", "4242"])
def test_digests_identical_across_processes(hash_seed: str) -> None:
    code = (
        "from common.block_hash import hash_prompt_blocks\n"
        f"print(','.join(h.hex() for h in hash_prompt_blocks({TOKENS!r}, {BLOCK_SIZE}, ('m', 'salt'))))"
    )
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=30, check=True
    )
    expected = ",".join(h.hex() for h in hash_prompt_blocks(TOKENS, BLOCK_SIZE, ("m", "salt")))
    assert result.stdout.strip() == expected


def test_changing_block_zero_changes_every_later_hash() -> None:
    base = hash_prompt_blocks(TOKENS, BLOCK_SIZE)
    changed = hash_prompt_blocks([TOKENS[0] + 1, *TOKENS[1:]], BLOCK_SIZE)
    assert len(base) == len(changed) == 3
    assert all(a != b for a, b in zip(base, changed, strict=True))


def test_changing_block_two_keeps_earlier_hashes() -> None:
    base = hash_prompt_blocks(TOKENS, BLOCK_SIZE)
    tokens = list(TOKENS)
    tokens[9] += 1
    changed = hash_prompt_blocks(tokens, BLOCK_SIZE)
    assert changed[:2] == base[:2]
    assert changed[2] != base[2]


def test_partial_block_not_hashed() -> None:
    assert len(hash_prompt_blocks(TOKENS, BLOCK_SIZE)) == 3
    assert hash_prompt_blocks(TOKENS[:12], BLOCK_SIZE) == hash_prompt_blocks(TOKENS, BLOCK_SIZE)
    assert hash_prompt_blocks(TOKENS[:3], BLOCK_SIZE) == []


def test_chain_matches_block_by_block_hashing() -> None:
    parent = None
    for i, block_hash in enumerate(hash_prompt_blocks(TOKENS, BLOCK_SIZE, ("m",))):
        parent = hash_block_tokens(parent, TOKENS[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE], ("m",))
        assert block_hash == parent


def test_extra_keys_change_hashes() -> None:
    plain = hash_prompt_blocks(TOKENS, BLOCK_SIZE)
    model_a = hash_prompt_blocks(TOKENS, BLOCK_SIZE, block_extra_keys("model-a"))
    model_b = hash_prompt_blocks(TOKENS, BLOCK_SIZE, block_extra_keys("model-b"))
    salted = hash_prompt_blocks(TOKENS, BLOCK_SIZE, block_extra_keys("model-a", "tenant"))
    first_hashes = {plain[0], model_a[0], model_b[0], salted[0]}
    assert len(first_hashes) == 4
    # Key boundaries are encoded: ("ab", "c") and ("a", "bc") differ.
    assert hash_block_tokens(None, [1], ("ab", "c")) != hash_block_tokens(None, [1], ("a", "bc"))


def test_golden_digests() -> None:
    assert [h.hex() for h in hash_prompt_blocks(list(range(10)), 4, ("smollm2-135m",))] == [
        "69fb7aba1e4a5b846d7dd2d2eac90b1c",
        "898225cba8c9960c2d78cd4305bbc837",
    ]
    assert hash_block_tokens(None, [1, 2, 3, 4]).hex() == "2aa31fa8d5bf8340910ee2ade093393b"
