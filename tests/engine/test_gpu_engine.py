"""The engine on a GPU (Triton attention, CUDA graphs): greedy output identical to transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.engine.model_factory import NEW_TOKENS, hf_greedy, make_prompts, save_tiny_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def tiny_gpu_case(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[list[int]], list[list[int]]]:
    path = save_tiny_model(request.param, tmp_path_factory.mktemp(f"gpu-{request.param}"))
    prompts = make_prompts(vocab_size=512)
    return path, prompts, hf_greedy(path, prompts, NEW_TOKENS, device="cuda")


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["cuda-graphs", "eager"])
@pytest.mark.parametrize("chunk", [None, 48], ids=["unchunked", "chunk-3-blocks"])
def test_greedy_matches_transformers_on_gpu(
    tiny_gpu_case: tuple[Path, list[list[int]], list[list[int]]], enforce_eager: bool, chunk: int | None
) -> None:
    path, prompts, expected = tiny_gpu_case
    kwargs = {"long_prefill_token_threshold": chunk} if chunk else {}
    engine = LLMEngine(
        engine_config(
            str(path),
            device="cuda",
            dtype="float32",
            num_blocks=1024,
            max_num_seqs=32,
            enforce_eager=enforce_eager,
            **kwargs,
        )
    )
    assert (engine.runner.cuda_graphs is None) == enforce_eager
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.req_id].extend(out.new_token_ids)
    mismatched = [i for i, ref in enumerate(expected) if outputs[str(i)] != ref]
    assert not mismatched


def test_bf16_prompt_logits_within_tolerance(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    path = save_tiny_model("qwen3", tmp_path / "qwen3")
    prompt = make_prompts(vocab_size=512, seed=3)[-1]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    with torch.no_grad():
        expected = hf(torch.tensor([prompt], device="cuda")).logits[0].float()
    engine = LLMEngine(engine_config(str(path), device="cuda", dtype="bfloat16", num_blocks=64, enforce_eager=True))
    kv = engine.kv_cache_manager
    kv.allocate_slots("logits", len(prompt))
    from engine.scheduler_output import ScheduledRequest, SchedulerOutput

    step = SchedulerOutput(
        [
            ScheduledRequest(
                "logits", prompt, 0, kv.get_block_ids("logits"), SamplingParams(temperature=0), False, prompt, []
            )
        ]
    )
    inputs = engine.runner.prepare_inputs(step)
    with torch.inference_mode():
        hidden = engine.runner.model(inputs.input_ids, inputs.positions, engine.runner.kv_caches, inputs.metadata)
        actual = engine.runner.model.compute_logits(hidden).float()
    scale = expected.abs().max().item()
    assert (actual - expected).abs().max().item() <= 0.05 * scale
