"""A tiny vision-language checkpoint folder the whole cluster can serve: the random-weight LLaVA of
tests/engine/multimodal/vlm_factory.py over SmolLM2's tokenizer, with an `<image>` token added and a chat template
that writes it where an image part stands."""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerFast

from tests.engine.multimodal.vlm_factory import save_tiny_llava, tiny_llava_config

IMAGE_TOKEN = "<image>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def save_tiny_vlm(folder: Path, tokenizer_folder: Path) -> Path:
    """The checkpoint (config, weights, preprocessor config) and its tokenizer in `folder`."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_folder)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    save_tiny_llava(folder, tiny_llava_config(vocab_size=len(tokenizer), image_token_id=image_token_id))
    return folder
