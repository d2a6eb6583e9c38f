"""Contract: a prefill engine and a decode engine whose KV caches differ in dtype are refused at the transfer
handshake (in-process backend), before any byte moves; equal dtypes go through.

On CPU the KV dtype follows the model dtype (kv_cache_dtype="auto"), so float32 vs bfloat16 stands in for the
bf16 vs fp8 pair of a GPU: the descriptor compares the dtype name whatever it is (the fp8 layout case below).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from kv_transfer import KVLayout, LayoutMismatchError, TransferState, make_receiver, make_sender
from tests.engine.model_factory import save_tiny_model

WAIT_S = 10.0


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3"))


def _transfer(prefill: LLMEngine, decode: LLMEngine) -> tuple[TransferState, Exception | None, bool]:
    """Ship prefill block 0 into decode block 3, announcing the sender's own layout so that only the handshake
    compares the two pools: (sender's end state, its error, whether the decode pool changed)."""
    receiver = make_receiver("in_process", decode.kv_pool_views()[0])
    sender = make_sender("in_process", prefill.kv_pool_views()[0])
    try:
        prefill.runner.kv_cache[0].fill_(1.0)
        before = decode.runner.kv_cache.clone()
        receiver.expect("t1", [3], lease_s=5.0)
        sender.send("t1", receiver.endpoint, sender.layout, [0], [3], last=True)
        state = sender.wait("t1", WAIT_S)
        return state, sender.stats("t1").error, not torch.equal(decode.runner.kv_cache, before)
    finally:
        sender.close()
        receiver.close()


def test_pods_with_different_kv_dtypes_are_refused_at_the_handshake(tiny_qwen3: Path) -> None:
    prefill = LLMEngine(engine_config(str(tiny_qwen3), dtype="float32", num_blocks=8))
    decode = LLMEngine(engine_config(str(tiny_qwen3), dtype="bfloat16", num_blocks=8))
    state, error, changed = _transfer(prefill, decode)
    assert state is TransferState.FAILED
    assert isinstance(error, LayoutMismatchError) and error.fields == ("dtype",)
    assert str(error) == "KV layouts differ in dtype: 'float32' vs 'bfloat16'"
    assert not changed


def test_pods_with_equal_kv_dtypes_transfer(tiny_qwen3: Path) -> None:
    prefill = LLMEngine(engine_config(str(tiny_qwen3), dtype="bfloat16", num_blocks=8))
    decode = LLMEngine(engine_config(str(tiny_qwen3), dtype="bfloat16", num_blocks=8))
    state, error, changed = _transfer(prefill, decode)
    assert (state, error, changed) == (TransferState.DONE, None, True)


def test_an_fp8_kv_layout_differs_from_a_bf16_one_in_dtype_only() -> None:
    fp8, bf16 = KVLayout("float8_e4m3fn", 16, 36, 8, 128), KVLayout("bfloat16", 16, 36, 8, 128)
    assert fp8.block_nbytes * 2 == bf16.block_nbytes
    with pytest.raises(LayoutMismatchError, match=r"dtype: 'float8_e4m3fn' vs 'bfloat16'") as caught:
        fp8.check_compatible(bf16)
    assert caught.value.fields == ("dtype",)
