# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""A launch's programs meeting at a counter, so that the last to finish can combine what all of them wrote: one
launch where a kernel and its reduction were two (the launch and its gap cost more than the combining at batch-1
decode sizes).

The counter is an int32 in global memory, zero before the launch and left zero after it (the last program resets
it), so a buffer of counters serves every launch on a stream, CUDA-graph replays included.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def last_to_arrive(counter_ptr, expected):
    """Whether this program is the last of `expected` to arrive at the counter. Every store a program made before
    arriving is visible to the last one: a barrier across the program's threads, then one atomic increment with
    acquire-release order at GPU scope (release for the stores before it, acquire for the loads after). The last
    program should read the others' stores with the ".cg" cache modifier (from L2, not a stale L1 line)."""
    tl.debug_barrier()
    last = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == expected - 1
    if last:
        tl.store(counter_ptr, 0)
    return last
