"""What a prefill pod checks of a Prefill call before it starts: the input, and that its KV target fits this pod."""

from __future__ import annotations

from collections.abc import Container

from common.errors import InvalidArgumentError
from common.sampling_params import SamplingParams
from engine.runtime_info import RuntimeInfo
from kv_transfer.layout import KVLayout, check_transfer_layouts
from kv_transfer.target import KVTarget


class PrefillChecks:
    """Raises InvalidArgumentError naming the bad field, or LayoutMismatchError for a foreign KV layout. (A transfer
    id the sender still remembers is refused by the engine core, which holds the sender.)"""

    def __init__(self, info: RuntimeInfo, layout: KVLayout, backend: str) -> None:
        self._info = info
        self._layout = layout
        self._backend = backend

    def check(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        target: KVTarget,
        open_transfer_ids: Container[str],
    ) -> None:
        self._info.validate(prompt_token_ids, params)
        if target.backend != self._backend:
            raise InvalidArgumentError(
                "kv_target.backend", f"this pod sends over {self._backend!r}, not {target.backend!r}"
            )
        check_transfer_layouts(self._layout, target.layout)
        num_blocks = -(-len(prompt_token_ids) // self._info.block_size)
        if len(target.block_ids) != num_blocks:
            raise InvalidArgumentError(
                "kv_target.block_ids",
                f"{len(target.block_ids)} block ids for {len(prompt_token_ids)} prompt tokens; expected {num_blocks}",
            )
        if not target.transfer_id or target.transfer_id in open_transfer_ids:
            raise InvalidArgumentError("kv_target.transfer_id", f"{target.transfer_id!r} is empty or already used")
