"""`pdserve bench` (also `python -m bench`): the workloads of docs/workloads.md.

Offline, with the engine in this process: w1 decode-bs1, w2 ttft, w3 nano, w4 grid, idle (GPU idle time between
decode steps) and w10 (decode with speculation on vs off). w6: KV transfer between two processes over tcp, cuda_ipc
or nccl. Online, through the router of a real cluster: w2online (router TTFT vs the colocated engine), w5, w7-w9,
w12 (the autoscaler moving GPUs between prefill and decode under a steady load).
`pdserve bench --workload NAME --help` lists that workload's flags. The figures are printed as JSON (--json:
also written to a file).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from typing import Any

# NOTE: module names, imported once the workload is known: the online workloads need the services' packages (grpc
# health, redis), which a GPU machine running only the offline ones may lack.
WORKLOAD_MODULES: dict[str, str] = (
    dict.fromkeys(("w1", "w2", "w3", "w4", "idle"), "bench.offline.cli")
    | {"w6": "bench.kv_transfer.w6"}
    | {"w10": "bench.offline.w10"}
    | dict.fromkeys(("w2online", "w5", "w7", "w8", "w9", "w12"), "bench.online.cli")
)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Any]:
    """The workload's flags, known once --workload is: each workload module adds its own."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--workload", choices=list(WORKLOAD_MODULES))
    known, _ = pre.parse_known_args(argv)
    parser = argparse.ArgumentParser(prog="pdserve bench", description=__doc__)
    parser.add_argument("--workload", choices=list(WORKLOAD_MODULES), required=True)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    module = importlib.import_module(WORKLOAD_MODULES[known.workload]) if known.workload else None
    if module is not None:
        module.add_arguments(parser)
    return parser.parse_args(argv), module


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args, module = parse_args(argv)
    try:
        result = module.run(args)
    except KeyboardInterrupt:
        # NOTE: SIGINT, or SIGTERM while a cluster of the run's own was up (it has been stopped by now).
        print("pdserve bench: interrupted; no figures", file=sys.stderr)
        return 130
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
