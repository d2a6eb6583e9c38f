"""TokenizerPool: the same ids as the model's tokenizer in-process, chat template applied, errors mapped."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from common.errors import InvalidArgumentError, UnavailableError
from router.tokenizer.tokenizer_pool import ChatMessage, TokenizerPool

pytestmark = pytest.mark.anyio

TEXTS = [
    "Hello world",
    " leading space and trailing space ",
    "Héllo ✓ 日本語 — emoji 🙂 and tabs\tnew\nlines",
    "<|im_start|>user\nspecial tokens in plain text<|im_end|>",
    "a" * 3000,
]


@pytest.fixture(scope="module")
def reference(smollm2_path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer as the engine's offline API loads it."""
    loaded: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(smollm2_path)
    return loaded


async def test_encodes_exactly_like_the_tokenizer_in_process(
    tokenizer_pool: TokenizerPool, reference: PreTrainedTokenizerBase
) -> None:
    encoded = await asyncio.gather(*(tokenizer_pool.encode(text) for text in TEXTS))
    assert encoded == [reference.encode(text) for text in TEXTS]
    assert encoded[0] == [19556, 905]


async def test_applies_the_chat_template_with_the_generation_prompt(
    tokenizer_pool: TokenizerPool, reference: PreTrainedTokenizerBase
) -> None:
    messages = [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Héllo ✓"),
        ChatMessage("assistant", "Hi."),
        ChatMessage("user", "Again?"),
    ]
    ids = await tokenizer_pool.encode_chat(messages)
    as_dicts = [{"role": m.role, "content": m.content} for m in messages]
    expected = reference.apply_chat_template(as_dicts, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids == list(expected)
    assert reference.decode(ids).endswith("<|im_start|>user\nAgain?<|im_end|>\n<|im_start|>assistant\n")
    # the template adds its default system prompt when there is none
    ids = await tokenizer_pool.encode_chat([ChatMessage("user", "hi")])
    assert reference.decode(ids).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


async def test_template_errors_are_invalid_arguments_naming_messages(smollm2_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    for path in smollm2_path.iterdir():
        if path.name != "model.safetensors":
            (folder / path.name).symlink_to(path)
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.jinja").write_text("{{ raise_exception('roles must alternate') }}")
    pool = TokenizerPool(folder, size=1)
    await pool.start()
    try:
        with pytest.raises(InvalidArgumentError, match="roles must alternate") as info:
            await pool.encode_chat([ChatMessage("user", "hi")])
        assert info.value.field == "messages"
        assert await pool.encode("Hello world") == [19556, 905]
    finally:
        await pool.aclose()


async def test_a_dead_worker_fails_its_requests_and_is_replaced(smollm2_path: Path) -> None:
    pool = TokenizerPool(smollm2_path, size=1)
    await pool.start()
    try:
        pid = pool.worker_pids[0]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(UnavailableError):
            for _ in range(200):  # bounded: the kill lands within a few event-loop turns
                await pool.encode("x")
                await asyncio.sleep(0.01)
        for _ in range(500):
            if pool.worker_pids not in ([], [pid]):
                break
            await asyncio.sleep(0.02)
        assert pool.worker_pids[0] != pid
        assert await pool.encode("Hello world") == [19556, 905]
    finally:
        await pool.aclose()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.mark.slow
async def test_a_worker_returns_to_its_baseline_memory_after_a_huge_prompt(smollm2_path: Path) -> None:
    pool = TokenizerPool(smollm2_path, size=1)
    await pool.start()
    try:
        (pid,) = pool.worker_pids
        await pool.encode("Hello world")
        baseline = _rss_kib(pid)
        huge = " ".join(f"word{i % 997} token{i % 89}" for i in range(125_000))
        assert len(huge) > 1_900_000
        num_tokens = len(await pool.encode(huge))
        assert pool.worker_pids == [pid]
        after = _rss_kib(pid)
    finally:
        await pool.aclose()
    assert num_tokens > 400_000
    # NOTE: without the trim, one 2 MB prompt left the worker about 130 MiB above its baseline, for good.
    assert after < baseline + 16 * 1024, (baseline, after)
