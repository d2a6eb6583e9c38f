"""Router configuration: frozen dataclasses whose fields are the `pdserve router` flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.config import doc
from common.errors import InvalidArgumentError
from engine.config import DEFAULT_MODEL

_ADMISSION_COUNTS = (
    "max_waiting_requests_per_prefill_pod",
    "max_queued_prompt_tokens_per_prefill_pod",
    "max_streams_per_client",
    "max_queued_requests",
)


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise InvalidArgumentError(field_name, message)


@dataclass(frozen=True, slots=True)
class RouterConfig:
    host: str = field(default="127.0.0.1", metadata=doc("address the public gRPC server binds"))
    port: int = field(default=50051, metadata=doc("port of the public gRPC server (0 = a free port)"))
    http_port: int = field(
        default=0, metadata=doc("port of the OpenAI-compatible HTTP API on --host (0 = off); `pdserve up` serves 8000")
    )
    redis_url: str = field(
        default="redis://127.0.0.1:6379/0", metadata=doc("Redis holding the pod registry and the prefix directory")
    )
    model: str = field(
        default=DEFAULT_MODEL,
        metadata=doc("model folder or alias: the tokenizer, and the model id pods must be started with"),
    )
    tokenizer: str | None = field(
        default=None,
        metadata=doc(
            "folder with tokenizer.json, or a model alias, to tokenize with; default: the model's own "
            "(needed for config-only models such as shape:qwen3-8b)"
        ),
    )
    workers: int = field(
        default=0,
        metadata=doc(
            "router processes serving its ports together (SO_REUSEPORT; router.processes.supervisor); 0: one per 4 "
            "cores, at least 1, at most 8",
            env="PDSERVE_ROUTER_WORKERS",
        ),
    )
    tokenizer_pool_size: int = field(
        default=2,
        metadata=doc(
            "tokenizer worker processes of the whole router; with --workers N each process runs its share, at least one"
        ),
    )
    block_size: int = field(default=16, metadata=doc("tokens per KV block; must equal the pods' --block-size"))
    registry_refresh_s: float = field(default=1.0, metadata=doc("how often the live pod list is re-read"))
    max_message_bytes: int = field(
        default=16 * 1024 * 1024,
        metadata=doc("largest gRPC message the public server accepts (larger: RESOURCE_EXHAUSTED naming the limit)"),
    )
    max_prompt_bytes: int = field(
        default=1024 * 1024,
        metadata=doc("largest prompt in UTF-8 bytes (text, or all chat messages), refused before tokenizing"),
    )
    max_n: int = field(default=128, metadata=doc("most completions one Generate call may ask for (sampling_params.n)"))
    max_stop_strings: int = field(default=32, metadata=doc("most stop strings one request may carry"))
    max_stop_string_chars: int = field(default=512, metadata=doc("longest stop string, in characters"))
    max_id_chars: int = field(
        default=256, metadata=doc("longest request_id and cache_salt, in characters (printable ASCII for request_id)")
    )
    max_waiting_requests_per_prefill_pod: int = field(
        default=64,
        metadata=doc(
            "admission: Generate calls in flight to the prefill pods (sent on, first token not yet back), per live "
            "prefill pod; more wait in the router's queue (0: no limit)"
        ),
    )
    max_queued_prompt_tokens_per_prefill_pod: int = field(
        default=65536,
        metadata=doc(
            "admission: prompt tokens of the calls in flight to the prefill pods, per live prefill pod; more wait in "
            "the router's queue (0: no limit; a longer prompt goes alone)"
        ),
    )
    max_streams_per_client: int = field(
        default=512,
        metadata=doc(
            "admission: Generate streams one client may hold open, queued ones included, beyond which a call gets "
            "RESOURCE_EXHAUSTED + RetryInfo (0: no limit); the client is the call's x-client-id metadata value, "
            "else its peer address without the port"
        ),
    )
    max_queued_requests: int = field(
        default=1024,
        metadata=doc(
            "admission: Generate calls queued in the router (tokenizing, or waiting to be sent on), beyond which a "
            "call gets RESOURCE_EXHAUSTED + RetryInfo at once: a bound on the memory they hold (0: no limit)"
        ),
    )
    # NOTE: 30 s outlasts the momentary shortages the queue is for (a pod's restart seen within a registry refresh
    # and its TTL, a spell of full KV blocks while running calls finish: seconds) and stays within the minute that
    # clients commonly wait before they time out; a pod that loads for minutes (a scale from zero) outlasts it.
    max_queue_wait_s: float = field(
        default=30.0,
        metadata=doc(
            "admission: longest a call waits in the router's queue (for room in flight, a live pod, free KV blocks) "
            "before RESOURCE_EXHAUSTED (UNAVAILABLE with no live pod); a call whose predicted wait exceeds it is "
            "refused at once"
        ),
    )
    max_retry_s: float = field(default=5.0, metadata=doc("admission: most retry delay a refusal advertises"))
    max_pending_calls: int = field(
        default=16384,
        metadata=doc(
            "calls of a burst that gRPC holds until the router's event loop takes them up; gRPC itself "
            "cancels each one beyond (CANCELLED, unseen by admission; gRPC's default: 1000, then cancelling "
            "at random up to 3000)"
        ),
    )
    limit_mm_per_prompt: str = field(
        default="image=8",
        metadata=doc(
            "most images one prompt may hold, as MODALITY=N (vLLM's form; image is the one modality): more is "
            "INVALID_ARGUMENT naming messages"
        ),
    )
    max_image_bytes: int = field(
        default=8 * 1024 * 1024,
        metadata=doc("largest image (encoded bytes) a prompt may hold: INVALID_ARGUMENT past it"),
    )
    max_image_pixels: int = field(
        default=16 * 2**20, metadata=doc("largest image in pixels (width x height, read from its header)")
    )
    enable_remote_images: bool = field(
        default=False,
        metadata=doc("HTTP API: fetch image_url parts with http(s) URLs (off: only data: URLs are taken)"),
    )
    allowed_media_domains: str = field(
        default="",
        metadata=doc(
            "HTTP API, with --enable-remote-images: comma-separated hosts images may be fetched from (empty: any)"
        ),
    )
    remote_image_timeout_s: float = field(default=10.0, metadata=doc("HTTP API: longest fetch of one remote image"))
    drain_timeout_s: float = field(
        default=30.0,
        metadata=doc(
            "on SIGTERM, how long in-flight calls may finish while health says NOT_SERVING (DRAINING) and "
            "new Generate calls get UNAVAILABLE + RetryInfo"
        ),
    )

    def __post_init__(self) -> None:
        _require(0 <= self.port < 65536, "port", f"must be in [0, 65535], got {self.port}")
        _require(0 <= self.http_port < 65536, "http_port", f"must be in [0, 65535], got {self.http_port}")
        _require(self.tokenizer is None or bool(self.tokenizer), "tokenizer", "must not be empty")
        _require(self.workers >= 0, "workers", f"must be >= 0, got {self.workers}")
        _require(self.tokenizer_pool_size >= 1, "tokenizer_pool_size", f"must be >= 1, got {self.tokenizer_pool_size}")
        _require(
            self.block_size > 0 and self.block_size & (self.block_size - 1) == 0,
            "block_size",
            f"must be a power of two, got {self.block_size}",
        )
        _require(self.registry_refresh_s > 0, "registry_refresh_s", f"must be > 0, got {self.registry_refresh_s}")
        _require(
            0 < self.max_prompt_bytes < self.max_message_bytes,
            "max_prompt_bytes",
            f"must be in [1, max_message_bytes), got {self.max_prompt_bytes}",
        )
        for name in ("max_n", "max_stop_strings", "max_stop_string_chars", "max_id_chars"):
            _require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        for name in _ADMISSION_COUNTS:
            _require(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        _require(self.max_queue_wait_s > 0, "max_queue_wait_s", f"must be > 0, got {self.max_queue_wait_s}")
        _require(self.max_retry_s > 0, "max_retry_s", f"must be > 0, got {self.max_retry_s}")
        _require(self.max_pending_calls >= 1, "max_pending_calls", f"must be >= 1, got {self.max_pending_calls}")
        _require(self.drain_timeout_s >= 0, "drain_timeout_s", f"must be >= 0, got {self.drain_timeout_s}")
        _require(self.max_image_bytes >= 1, "max_image_bytes", f"must be >= 1, got {self.max_image_bytes}")
        _require(self.max_image_pixels >= 1, "max_image_pixels", f"must be >= 1, got {self.max_image_pixels}")
        self.max_images_per_prompt  # noqa: B018 (parses --limit-mm-per-prompt, raising for a bad one)

    @property
    def max_images_per_prompt(self) -> int:
        """--limit-mm-per-prompt's image count."""
        limits = {}
        for item in filter(None, (p.strip() for p in self.limit_mm_per_prompt.split(","))):
            modality, _, count = item.partition("=")
            _require(modality == "image", "limit_mm_per_prompt", f"unknown modality {modality!r} (image=N)")
            _require(count.isdigit(), "limit_mm_per_prompt", f"{item!r}: the count must be an integer >= 0")
            limits[modality] = int(count)
        return limits.get("image", 0)

    @property
    def media_domains(self) -> frozenset[str]:
        """--allowed-media-domains as a set (empty: any domain)."""
        return frozenset(d.strip().lower() for d in self.allowed_media_domains.split(",") if d.strip())


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    prefill_load_alpha: float = field(
        default=1.0,
        metadata=doc("cached prompt tokens one queued prefill token outweighs when picking the prefill pod"),
    )
    host_hit_weight: float = field(
        default=0.5,
        metadata=doc(
            "what a prompt block a prefill pod holds only in its host tier (--swap-space) counts for, a block in its "
            "device pool counting 1: it is copied back, cheaper than recomputed but not free"
        ),
    )
    prefill_max_imbalance_tokens: int = field(
        default=4096,
        metadata=doc("with no cached prefix, skip the rendezvous pick while its queue exceeds the shortest by this"),
    )
    max_attempts: int = field(
        default=4,
        metadata=doc(
            "failed legs (a pod gone, reset or out of its lease) a completion survives: each continues "
            "on other pods from the last streamed token"
        ),
    )
    retry_budget_per_s: float = field(
        default=10.0,
        metadata=doc(
            "retries per second the whole router may spend on failed legs (token bucket; with --workers N each "
            "process holds 1/N)"
        ),
    )
    retry_budget_burst: int = field(
        default=100, metadata=doc("retries the router's budget holds at most (with --workers N: 1/N per process)")
    )
    unavailable_cooldown_s: float = field(
        default=2.0,
        metadata=doc(
            "how long a pod whose call failed stays suspect (no new requests while other pods can serve) "
            "before a SERVING health check may clear it; a restart with a new generation clears it at once"
        ),
    )
    missing_pod_grace_s: float = field(
        default=3.0,
        metadata=doc(
            "how long a pod missing from a readable registry (e.g. a restarted Redis) is still routed to: "
            "one registry TTL, 3 x the pods' --heartbeat-s"
        ),
    )

    def __post_init__(self) -> None:
        _require(self.prefill_load_alpha >= 0, "prefill_load_alpha", f"must be >= 0, got {self.prefill_load_alpha}")
        _require(0 <= self.host_hit_weight <= 1, "host_hit_weight", f"must be in [0, 1], got {self.host_hit_weight}")
        _require(
            self.prefill_max_imbalance_tokens >= 0,
            "prefill_max_imbalance_tokens",
            f"must be >= 0, got {self.prefill_max_imbalance_tokens}",
        )
        _require(self.max_attempts >= 1, "max_attempts", f"must be >= 1, got {self.max_attempts}")
        _require(self.retry_budget_per_s >= 0, "retry_budget_per_s", f"must be >= 0, got {self.retry_budget_per_s}")
        _require(self.retry_budget_burst >= 1, "retry_budget_burst", f"must be >= 1, got {self.retry_budget_burst}")
        _require(
            self.unavailable_cooldown_s >= 0,
            "unavailable_cooldown_s",
            f"must be >= 0, got {self.unavailable_cooldown_s}",
        )
        _require(self.missing_pod_grace_s >= 0, "missing_pod_grace_s", f"must be >= 0, got {self.missing_pod_grace_s}")
