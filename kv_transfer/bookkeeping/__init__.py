"""The bookkeeping every KV transfer backend shares: who owns which blocks, under which lease, until when.

`send_ledger` (prefill side: transfer records, leases renewed by acks), `reservation_table` (decode side:
reservations, leases, writable chunks), `housekeeper` (the thread that reaps lapsed leases) and `rank_join` (how the
per-rank transfers of one parallel transfer end together).
"""
