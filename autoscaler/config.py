"""`AutoscalerConfig`: the autoscaler's bounds, timing and load thresholds (one `--flag` per field through
`common.config.add_config_args`: `min_prefill` -> `--min-prefill`).

Each load measure has a high threshold (over it: scale out) and a low one (under it on every measure, for the
whole `scale_down_window_s`: a scale-in may follow); see autoscaler/planner.py for the policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.config import doc
from common.errors import InvalidArgumentError


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise InvalidArgumentError(field_name, message)


def _check_watermarks(config: AutoscalerConfig, low_name: str, high_name: str) -> None:
    low, high = getattr(config, low_name), getattr(config, high_name)
    _require(low >= 0, low_name, f"must be >= 0, got {low}")
    _require(high > low, high_name, f"must be > {low_name} ({low}), got {high}")


@dataclass(frozen=True, slots=True)
class AutoscalerConfig:
    """The autoscaler's settings; `Planner` reads every field but `autoscale_interval_s` (the driver's loop)."""

    min_prefill: int = field(default=1, metadata=doc("fewest prefill pods"))
    max_prefill: int = field(default=8, metadata=doc("most prefill pods"))
    min_decode: int = field(default=1, metadata=doc("fewest decode pods"))
    max_decode: int = field(default=8, metadata=doc("most decode pods"))
    autoscale_interval_s: float = field(default=10.0, metadata=doc("seconds between two planner decisions"))
    scale_down_window_s: float = field(
        default=300.0, metadata=doc("how long a role must stay under its low thresholds before it loses a pod")
    )
    action_timeout_s: float = field(
        default=600.0, metadata=doc("how long a change may take to show in the registry before the planner moves on")
    )
    prefill_waiting_high: float = field(default=8.0, metadata=doc("prefill: waiting requests per pod to scale out"))
    prefill_waiting_low: float = field(default=1.0, metadata=doc("prefill: waiting requests per pod to scale in"))
    prefill_tokens_per_s: float = field(
        default=8192.0, metadata=doc("prefill: one pod's measured throughput on uncached prompt tokens")
    )
    prefill_queue_high_s: float = field(
        default=1.0, metadata=doc("prefill: seconds of queued uncached prompt tokens per pod to scale out (TTFT)")
    )
    prefill_queue_low_s: float = field(
        default=0.25, metadata=doc("prefill: seconds of queued uncached prompt tokens per pod to scale in")
    )
    decode_kv_high: float = field(
        default=0.8, metadata=doc("decode: fraction of KV blocks held by admitted requests to scale out")
    )
    decode_kv_low: float = field(
        default=0.4, metadata=doc("decode: fraction of KV blocks held by admitted requests to scale in")
    )
    decode_requests_high: float = field(
        default=192.0, metadata=doc("decode: requests (running + waiting) per pod to scale out")
    )
    decode_requests_low: float = field(
        default=64.0, metadata=doc("decode: requests (running + waiting) per pod to scale in")
    )
    decode_tpot_slo_ms: float = field(
        default=0.0,
        metadata=doc("decode: the TPOT SLO (ms) the pods' time per step is held against; 0: that measure is off"),
    )
    decode_tpot_high: float = field(
        default=0.8, metadata=doc("decode: time per step as a fraction of decode_tpot_slo_ms to scale out")
    )
    decode_tpot_low: float = field(
        default=0.4, metadata=doc("decode: time per step as a fraction of decode_tpot_slo_ms to scale in")
    )
    max_total_pods: int = field(
        default=0,
        metadata=doc(
            "most pods of both roles together (a fixed set of GPUs, one pod each): a role over a high threshold with"
            " none free takes a GPU from the other role when that one can spare a pod; 0: no limit"
        ),
    )

    def __post_init__(self) -> None:
        for role in ("prefill", "decode"):
            low, high = getattr(self, f"min_{role}"), getattr(self, f"max_{role}")
            # NOTE: min >= 1: with no pod of a role the planner sees no load of it to scale out on.
            _require(low >= 1, f"min_{role}", f"must be >= 1, got {low}")
            _require(high >= low, f"max_{role}", f"must be >= min_{role} ({low}), got {high}")
        _require(self.autoscale_interval_s > 0, "autoscale_interval_s", f"must be > 0, got {self.autoscale_interval_s}")
        _require(self.scale_down_window_s >= 0, "scale_down_window_s", f"must be >= 0, got {self.scale_down_window_s}")
        _require(self.action_timeout_s > 0, "action_timeout_s", f"must be > 0, got {self.action_timeout_s}")
        _require(self.prefill_tokens_per_s > 0, "prefill_tokens_per_s", f"must be > 0, got {self.prefill_tokens_per_s}")
        for low_name, high_name in (
            ("prefill_waiting_low", "prefill_waiting_high"),
            ("prefill_queue_low_s", "prefill_queue_high_s"),
            ("decode_kv_low", "decode_kv_high"),
            ("decode_requests_low", "decode_requests_high"),
            ("decode_tpot_low", "decode_tpot_high"),
        ):
            _check_watermarks(self, low_name, high_name)
        _require(self.decode_kv_high <= 1, "decode_kv_high", f"must be <= 1, got {self.decode_kv_high}")
        _require(self.decode_tpot_slo_ms >= 0, "decode_tpot_slo_ms", f"must be >= 0, got {self.decode_tpot_slo_ms}")
        least = self.min_prefill + self.min_decode
        _require(
            self.max_total_pods == 0 or self.max_total_pods >= least,
            "max_total_pods",
            f"must be 0 (no limit) or >= min_prefill + min_decode ({least}), got {self.max_total_pods}",
        )


@dataclass(frozen=True, slots=True)
class ComposeConfig:
    """How `pdserve autoscale --connector compose` reaches the compose project whose `prefill` and `decode`
    services it scales (flags `--compose-command`, ...; variables `PDSERVE_COMPOSE_COMMAND`, ...)."""

    compose_command: str = field(
        default="",
        metadata=doc("the compose CLI, shell-split ('docker compose', 'docker-compose', ...); empty: the first found"),
    )
    compose_file: str = field(default="", metadata=doc("the compose file (-f); empty: the CLI's default"))
    compose_project: str = field(default="", metadata=doc("the compose project (-p); empty: the CLI's default"))
    compose_timeout_s: float = field(
        default=300.0, metadata=doc("how long one compose command may run (a scale-in waits for the pod's drain)")
    )

    def __post_init__(self) -> None:
        _require(self.compose_timeout_s > 0, "compose_timeout_s", f"must be > 0, got {self.compose_timeout_s}")
