from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors import safe_open

from common.errors import InvalidArgumentError
from engine import model_store
from engine.model_store import resolve_model

PROMPT = "The capital of France is"


def test_alias_resolves_to_complete_float32_folder(smollm2_path: Path) -> None:
    assert smollm2_path == model_store.cache_dir() / "models" / "SmolLM2-135M-Instruct"
    files = {p.name for p in smollm2_path.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    } <= files
    config = json.loads((smollm2_path / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["vocab_size"]) == ("llama", 30, 49152)
    with safe_open(str(smollm2_path / "model.safetensors"), framework="pt") as weights:
        dtypes = {weights.get_slice(name).get_dtype() for name in weights.keys()}  # noqa: SIM118
    assert dtypes == {"F32"}


def test_converted_model_greedy_continuation_and_chat_template(smollm2_path: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    model = LlamaForCausalLM.from_pretrained(smollm2_path)
    input_ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.inference_mode():
        output = model.generate(input_ids, max_new_tokens=3, do_sample=False)
    assert tokenizer.decode(output[0, input_ids.shape[1] :]) == " Paris.\n"
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_alias_uses_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    converted = tmp_path / "models" / "SmolLM2-135M-Instruct"
    converted.mkdir(parents=True)
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    assert resolve_model("smollm2-135m") == converted


def test_folder_with_config_resolves_to_itself(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda root: root / "missing", "is neither a packaged alias (smollm2-135m) nor an existing folder"),
        (lambda root: root, "has no config.json; expected a Hugging Face model folder"),
        (lambda root: _file(root / "weights.bin"), "is a file; expected a Hugging Face model folder or a .gguf file"),
    ],
)
def test_bad_model_names_raise_invalid_argument(tmp_path: Path, make: Callable[[Path], Path], expected: str) -> None:
    path = make(tmp_path)
    with pytest.raises(InvalidArgumentError) as caught:
        resolve_model(str(path))
    assert caught.value.field == "model"
    assert str(path) in caught.value.description
    assert caught.value.description.endswith(expected)


def _file(path: Path) -> Path:
    path.write_bytes(b"x")
    return path


def test_failed_conversion_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(gguf_path: Path, out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(model_store, "_convert_gguf", crash)
    with pytest.raises(RuntimeError, match="killed mid-conversion"):
        resolve_model("smollm2-135m")
    assert list((tmp_path / "models").iterdir()) == []


def test_incomplete_conversion_is_not_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def partial(gguf_path: Path, out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(model_store, "_convert_gguf", partial)
    with pytest.raises(RuntimeError, match=r"produced no model\.safetensors, tokenizer\.json, tokenizer_config\.json"):
        resolve_model("smollm2-135m")
    assert list((tmp_path / "models").iterdir()) == []


def test_concurrent_converter_wins_and_its_folder_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    final = tmp_path / "models" / "SmolLM2-135M-Instruct"

    def raced(gguf_path: Path, out_dir: Path) -> None:
        for name in model_store._REQUIRED_FILES:
            (out_dir / name).write_text("ours")
        final.mkdir()
        (final / "config.json").write_text("theirs")

    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(model_store, "_convert_gguf", raced)
    assert resolve_model("smollm2-135m") == final
    assert (final / "config.json").read_text() == "theirs"
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["SmolLM2-135M-Instruct"]


def test_import_engine_does_not_import_torch() -> None:
    code = (
        "import sys, engine, engine.model_store; "
        "assert engine.SamplingParams.__module__ == 'common.sampling_params'; "
        "loaded = {'torch', 'transformers'} & set(sys.modules); assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
