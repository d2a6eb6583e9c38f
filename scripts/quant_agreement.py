"""int8 weight-only against float32 on the packaged SmolLM2: the figures of docs/quantization.md.

Greedy agreement over 16 English prompts x 32 tokens, teacher-forced (int8 fed float32's tokens) and free-running
(position by position), and the mean prompt-logit error relative to the float32 logits' std.
Run from the repository root: `PYTHONPATH=$PWD:$PWD/protos python scripts/quant_agreement.py`.
"""

from __future__ import annotations

from common.sampling_params import SamplingParams
from engine.llm import LLM
from tests.engine.quant_support import TEXT_PROMPTS, prompt_logits

NEW_TOKENS = 32


def main() -> None:
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    reference = LLM("smollm2-135m", num_blocks=256)
    quantized = LLM("smollm2-135m", quantization="int8", num_blocks=256)
    prompts = [reference.tokenizer.encode(p) for p in TEXT_PROMPTS]
    ours = [o.outputs[0].token_ids for o in reference.generate(prompts, params, use_tqdm=False)]
    theirs = [o.outputs[0].token_ids for o in quantized.generate(prompts, params, use_tqdm=False)]
    forced, errors = 0, []
    for prompt, tokens in zip(prompts, ours, strict=True):
        expected = prompt_logits(reference.engine, prompt + tokens)
        actual = prompt_logits(quantized.engine, prompt + tokens)
        forced += sum(p == t for p, t in zip(actual[len(prompt) - 1 : -1].argmax(-1).tolist(), tokens, strict=True))
        errors.append(((actual - expected).abs().mean() / expected.std()).item())
    total = len(prompts) * NEW_TOKENS
    free = sum(a == b for x, y in zip(ours, theirs, strict=True) for a, b in zip(x, y, strict=True))
    print(f"teacher-forced greedy agreement {forced}/{total} = {forced / total:.3f}")
    print(f"free-running greedy agreement {free}/{total} = {free / total:.3f}")
    print(f"identical continuations {sum(x == y for x, y in zip(ours, theirs, strict=True))}/{len(prompts)}")
    print(f"mean |logit error| / std per prompt: {min(errors):.4f} .. {max(errors):.4f}")


if __name__ == "__main__":
    main()
