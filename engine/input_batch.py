"""Turns a scheduled step into the model's device inputs with a few bulk host-to-device copies.

Host side, per request: a persistent block-table row (rewritten on admission, appended to as blocks are added),
so a step costs O(requests) Python plus numpy, not O(blocks). The step's arrays are written into pinned staging
buffers and copied into persistent device buffers; CUDA graphs are captured on slices of those device buffers,
so a replay needs no further copies. Staging is double-buffered: with async scheduling the host fills step N+1
while step N's copies may still be queued on the device.

A token that is a placeholder (sampled by the previous step, not yet seen by the host) is gathered on the device
from that step's sampled-token tensor.

A verify step replayed from a graph (`query_len` > 1) lays each request out on `query_len` token rows: its real
tokens, then padding tokens at the following positions that write their K/V nowhere (slot -1) and are not sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention.backend import AttentionMetadata
from engine.scheduler_output import PLACEHOLDER_TOKEN_ID, SchedulerOutput


@dataclass(slots=True)
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    logits_indices: torch.Tensor  # rows of the hidden states to sample from, in scheduled order


@dataclass(slots=True)
class _HostStep:
    """What filling a step's host arrays found out: its sizes, each request's table row, and the token positions
    to sample from and to fill from the previous step's sample."""

    num_tokens: int
    rows: np.ndarray
    logits_indices: list[int]
    fill_dst: list[int]
    fill_src: list[int]


@dataclass(slots=True)
class PreviousSample:
    """The previous step's sampled token ids (device) and each sampled request's row in them."""

    token_ids: torch.Tensor
    rows: dict[str, int]


class StepBuffers:
    """One set of flat int buffers for a step's inputs, on one device (pinned when on the host for a GPU)."""

    def __init__(self, max_num_tokens: int, max_num_reqs: int, max_blocks: int, device: torch.device, pin: bool):
        def make(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin)

        self.input_ids = make((max_num_tokens,), torch.int64)
        self.positions = make((max_num_tokens,), torch.int64)
        self.slot_mapping = make((max_num_tokens,), torch.int64)
        self.query_start_loc = make((max_num_reqs + 1,), torch.int32)
        self.seq_lens = make((max_num_reqs,), torch.int32)
        # NOTE: a staging set fills the first rows * width entries as a compact [rows, width] table; the device set
        # keeps the fixed row stride that CUDA graphs are captured with, and lands the compact copy in `scratch`.
        self.block_table = make((max_num_reqs, max_blocks), torch.int32)
        self.scratch = make((max_num_reqs * max_blocks,), torch.int32)
        # [logits indices | placeholder destinations in input_ids | their rows in the previous sample]; a request
        # verifying proposed tokens samples after each of its tokens, so there are at most max_num_tokens logits.
        self.aux = make((max_num_tokens + 2 * max_num_reqs,), torch.int64)


class InputBatch:
    def __init__(
        self,
        block_size: int,
        max_num_reqs: int,
        max_num_tokens: int,
        max_model_len: int,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.max_num_reqs = max_num_reqs
        self.max_blocks = -(-max_model_len // block_size)
        self.device = device
        on_gpu = device.type == "cuda"
        args = (max_num_tokens, max_num_reqs, self.max_blocks)
        self.device_buffers = StepBuffers(*args, device, pin=False)
        # NOTE: on the CPU the "device" buffers are filled directly; no staging, no copies.
        self._staging = [StepBuffers(*args, torch.device("cpu"), pin=True) for _ in range(2)] if on_gpu else []
        self._flip = 0
        self._table = np.zeros((max(max_num_reqs, 1) * 2, self.max_blocks), dtype=np.int32)
        self._rows: dict[str, int] = {}
        self._row_num_blocks: dict[str, int] = {}
        self._free_rows: list[int] = list(range(self._table.shape[0] - 1, -1, -1))

    def drop(self, req_ids: frozenset[str]) -> None:
        """Forget finished requests' rows."""
        for req_id in req_ids:
            row = self._rows.pop(req_id, None)
            if row is not None:
                self._row_num_blocks.pop(req_id)
                self._free_rows.append(row)

    def _row(self, req_id: str, block_ids: list[int], new_admission: bool) -> int:
        row = self._rows.get(req_id)
        if row is not None and not new_admission and len(block_ids) == self._row_num_blocks[req_id]:
            return row
        if row is None:
            if not self._free_rows:
                self._grow()
            row = self._rows[req_id] = self._free_rows.pop()
            new_admission = True
        known = 0 if new_admission else self._row_num_blocks[req_id]
        if len(block_ids) < known:  # rejected speculative tokens gave blocks back
            self._row_num_blocks[req_id] = len(block_ids)
        elif len(block_ids) > known:
            self._table[row, known : len(block_ids)] = block_ids[known:]
            self._row_num_blocks[req_id] = len(block_ids)
        return row

    def _grow(self) -> None:
        old = self._table.shape[0]
        self._table = np.concatenate([self._table, np.zeros_like(self._table)])
        self._free_rows.extend(range(2 * old - 1, old - 1, -1))

    def prepare(
        self,
        scheduler_output: SchedulerOutput,
        graph_batch_size: int | None,
        previous: PreviousSample | None,
        query_len: int = 1,
    ) -> ModelInput:
        """Device inputs of the step; with `graph_batch_size`, padded to that many rows of `query_len` tokens."""
        if self._staging:
            self._flip ^= 1
            host = self._staging[self._flip]
        else:
            host = self.device_buffers
        step = self._fill_requests(host, scheduler_output, previous, query_len)
        num_reqs = len(scheduler_output.scheduled)
        padded = num_reqs if graph_batch_size is None else graph_batch_size
        width = self._fill_block_table(host, step, padded)
        num_tokens = step.num_tokens if graph_batch_size is None else graph_batch_size * query_len
        if graph_batch_size is not None:
            self._fill_padding(host, num_reqs, step.num_tokens, graph_batch_size, query_len)
        num_sampled, num_fill = len(step.logits_indices), len(step.fill_dst)
        aux = host.aux.numpy()
        aux[: num_sampled + 2 * num_fill] = step.logits_indices + step.fill_dst + step.fill_src
        dev = self._upload(host, num_tokens, padded, width, num_sampled + 2 * num_fill)
        if num_fill:
            assert previous is not None
            dst = dev.aux[num_sampled : num_sampled + num_fill]
            src = dev.aux[num_sampled + num_fill : num_sampled + 2 * num_fill]
            dev.input_ids.index_copy_(0, dst, previous.token_ids.index_select(0, src))
        qsl, seq_lens = host.query_start_loc.numpy()[: num_reqs + 1], host.seq_lens.numpy()[:num_reqs]
        metadata = AttentionMetadata(
            query_start_loc=dev.query_start_loc[: padded + 1],
            seq_lens=dev.seq_lens[:padded],
            block_table=dev.block_table[:padded],
            slot_mapping=dev.slot_mapping[:num_tokens],
            max_query_len=int(np.diff(qsl).max()),
            max_seq_len=int(seq_lens.max()),
            query_start_loc_cpu=qsl.tolist(),
            seq_lens_cpu=seq_lens.tolist(),
        )
        return ModelInput(dev.input_ids[:num_tokens], dev.positions[:num_tokens], metadata, dev.aux[:num_sampled])

    def _fill_requests(
        self, host: StepBuffers, scheduler_output: SchedulerOutput, previous: PreviousSample | None, query_len: int
    ) -> _HostStep:
        """Token ids, positions, slots, query starts and context lengths of the scheduled requests (each padded to
        `query_len` tokens when that is > 1)."""
        ids, positions, slots = host.input_ids.numpy(), host.positions.numpy(), host.slot_mapping.numpy()
        qsl, seq_lens = host.query_start_loc.numpy(), host.seq_lens.numpy()
        scheduled = scheduler_output.scheduled
        step = _HostStep(0, np.empty(len(scheduled), dtype=np.int64), [], [], [])
        padding: list[tuple[int, int]] = []
        qsl[0] = 0
        for i, req in enumerate(scheduled):
            step.rows[i] = self._row(req.req_id, req.block_ids, req.new_admission)
            start, token_ids, begin = req.num_computed_tokens, req.token_ids, step.num_tokens
            end = begin + len(token_ids)
            if end - begin == 1:  # a decode: scalar stores are ~10x cheaper than slice stores
                ids[begin], positions[begin] = token_ids[0], start
            else:
                ids[begin:end] = token_ids
                positions[begin:end] = np.arange(start, start + end - begin)
            if token_ids[-1] == PLACEHOLDER_TOKEN_ID:
                if previous is None:
                    raise RuntimeError(f"{req.req_id}: a placeholder token but no previous sample")
                ids[end - 1] = 0
                step.fill_dst.append(end - 1)
                step.fill_src.append(previous.rows[req.req_id])
            if req.sample:
                step.logits_indices.extend(range(end - 1 - len(req.draft_token_ids), end))
            if query_len > 1:
                padding.append((end, begin + query_len))
                ids[end : begin + query_len] = 0
                positions[end : begin + query_len] = np.arange(start + end - begin, start + query_len)
                end = begin + query_len
            step.num_tokens = qsl[i + 1] = end
            seq_lens[i] = start + end - begin
        pos = positions[: step.num_tokens]
        token_rows = np.repeat(step.rows, np.diff(qsl[: len(scheduled) + 1]))
        bs = self.block_size
        slots[: step.num_tokens] = self._table[token_rows, pos // bs].astype(np.int64) * bs + pos % bs
        for pad_begin, pad_end in padding:
            slots[pad_begin:pad_end] = -1
        return step

    def _fill_block_table(self, host: StepBuffers, step: _HostStep, num_rows: int) -> int:
        """The requests' block-table rows (then zero rows up to `num_rows`), as wide as the longest needs; the width."""
        num_reqs = len(step.rows)
        width = -(-int(host.seq_lens.numpy()[:num_reqs].max()) // self.block_size)
        if host is self.device_buffers:
            table = host.block_table.numpy()[:num_rows, :width]
        else:
            table = host.block_table.view(-1)[: num_rows * width].view(num_rows, width).numpy()
        table[:num_reqs] = self._table[step.rows, :width]
        table[num_reqs:] = 0
        return width

    @staticmethod
    def _fill_padding(host: StepBuffers, num_reqs: int, num_tokens: int, graph_batch_size: int, query_len: int) -> None:
        """Padding rows up to a captured batch size attend over `query_len` tokens of block 0 and write their K/V
        nowhere."""
        end, num_padded_tokens = graph_batch_size, graph_batch_size * query_len
        host.input_ids.numpy()[num_tokens:num_padded_tokens] = 0
        host.positions.numpy()[num_tokens:num_padded_tokens] = 0
        host.slot_mapping.numpy()[num_tokens:num_padded_tokens] = -1
        host.query_start_loc.numpy()[num_reqs + 1 : end + 1] = np.arange(num_reqs + 1, end + 1) * query_len
        host.seq_lens.numpy()[num_reqs:end] = query_len

    def _upload(self, host: StepBuffers, num_tokens: int, num_rows: int, width: int, num_aux: int) -> StepBuffers:
        dev = self.device_buffers
        if host is dev:
            return dev
        for name, count in (
            ("input_ids", num_tokens),
            ("positions", num_tokens),
            ("slot_mapping", num_tokens),
            ("query_start_loc", num_rows + 1),
            ("seq_lens", num_rows),
            ("aux", num_aux),
        ):
            getattr(dev, name)[:count].copy_(getattr(host, name)[:count], non_blocking=True)
        scratch = dev.scratch[: num_rows * width]
        scratch.copy_(host.block_table.view(-1)[: num_rows * width], non_blocking=True)
        dev.block_table[:num_rows, :width].copy_(scratch.view(num_rows, width))
        return dev
