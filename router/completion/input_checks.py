"""The router's input limits (RouterConfig's `max_*` fields) and the model's length limit, checked before any
work is done for a call. Each refusal is an InvalidArgumentError naming the public field it is about."""

from __future__ import annotations

from collections.abc import Sequence

from common.errors import InvalidArgumentError
from common.sampling_params import SamplingParams
from router.config import RouterConfig
from router.tokenizer.tokenizer_pool import ChatMessage

_PRINTABLE_ASCII = frozenset(range(0x21, 0x7F))


class InputChecks:
    """Checks of a Generate or Tokenize call's fields against `config`'s limits and the model's `max_model_len`."""

    def __init__(self, config: RouterConfig, max_model_len: int) -> None:
        self._config = config
        self._max_model_len = max_model_len

    def check_ids(self, request_id: str, cache_salt: str | None) -> None:
        """request_id: at most max_id_chars of printable ASCII (it lands in logs); cache_salt: at most max_id_chars."""
        limit = self._config.max_id_chars
        if len(request_id) > limit:
            raise InvalidArgumentError("request_id", f"must be at most {limit} characters, got {len(request_id)}")
        if not _PRINTABLE_ASCII.issuperset(request_id.encode()):
            raise InvalidArgumentError("request_id", "must be printable ASCII without spaces")
        if cache_salt is not None and not 0 < len(cache_salt) <= limit:
            raise InvalidArgumentError("cache_salt", f"must be 1 to {limit} characters when set, got {len(cache_salt)}")

    def check_params(self, params: SamplingParams) -> None:
        """n, best_of and the stop strings; SamplingParams checked every other range itself."""
        config = self._config
        if params.n > config.max_n:
            raise InvalidArgumentError("sampling_params.n", f"must be <= {config.max_n}, got {params.n}")
        if params.num_samples > config.max_n:
            raise InvalidArgumentError("sampling_params.best_of", f"must be <= {config.max_n}, got {params.best_of}")
        if len(params.stop) > config.max_stop_strings:
            raise InvalidArgumentError(
                "sampling_params.stop", f"at most {config.max_stop_strings} stop strings, got {len(params.stop)}"
            )
        longest = max(map(len, params.stop), default=0)
        if longest > config.max_stop_string_chars:
            raise InvalidArgumentError(
                "sampling_params.stop",
                f"each stop string must be at most {config.max_stop_string_chars} characters, got one of {longest}",
            )

    def check_prompt_bytes(self, text: str | None, messages: Sequence[ChatMessage] | None) -> None:
        """A text or chat prompt is at most max_prompt_bytes of UTF-8, checked before it is tokenized; a chat has at
        most max_model_len messages (the template spends at least one token on each)."""
        if messages is not None:
            field = "messages"
            if len(messages) > self._max_model_len:
                raise InvalidArgumentError(
                    field, f"at most {self._max_model_len} messages (max_model_len), got {len(messages)}"
                )
            size = sum(
                len(m.role.encode())
                + len(m.content.encode())
                + sum(len(p.encode()) for p in m.parts if isinstance(p, str))
                for m in messages
            )
        else:
            field = "text"
            size = len(text.encode()) if text is not None else 0
        if size > self._config.max_prompt_bytes:
            raise InvalidArgumentError(
                field, f"prompt of {size} bytes exceeds the limit of {self._config.max_prompt_bytes} bytes"
            )

    def check_length(self, prompt_field: str, num_prompt_tokens: int, max_tokens: int) -> None:
        """The prompt leaves room for one token (else `prompt_field` is named), and prompt + max_tokens fit."""
        limit = self._max_model_len
        if num_prompt_tokens >= limit:
            raise InvalidArgumentError(
                prompt_field, f"prompt of {num_prompt_tokens} tokens leaves no room in max_model_len {limit}"
            )
        total = num_prompt_tokens + max_tokens
        if total > limit:
            raise InvalidArgumentError(
                "sampling_params.max_tokens",
                f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = {total} exceeds "
                f"max_model_len {limit}",
            )
