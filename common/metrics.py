"""Prometheus metrics of a router, prefill or decode process, vLLM-compatible under the `pdserve:` prefix.

Names, meanings and histogram buckets follow vLLM's `vllm:` metrics; the disaggregation ones (KV transfer, prefix
directory, router) are pdserve's own. Every series carries `role` (router | prefill | decode). Each role calls the
methods of the events it sees:
- router: observe_first_token, observe_output_tokens, observe_finished (client-visible latencies),
  observe_directory_lookup / count_directory_error, count_router_retry, count_router_rejection,
  observe_tokenizer_queue_time;
- prefill: observe_first_token, observe_finished (queue and prefill time), set_engine_state, set_host_tier,
  observe_kv_transfer / count_kv_transfer_failure, count_kv_lease_expiry;
- decode: observe_output_tokens, observe_finished (decode time), set_engine_state, set_host_tier, set_spec_totals,
  count_kv_lease_expiry.
Methods are thread-safe (e.g. set_engine_state from the engine's on_step hook).

A router with several processes (`--workers N`) runs them in prometheus_client's multiprocess mode: each process
writes its values to files under PROMETHEUS_MULTIPROC_DIR (set by the router's supervisor before they start), and
`multiprocess_registry` over that folder is the whole router's: counters and histograms summed over every process
(exited ones too, so they never go back), gauges summed over the live ones. A pod (one process, no such variable)
keeps every value in its own registry; the gauges' `multiprocess_mode` means nothing there.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess, start_http_server

from common.telemetry_config import Role

PREFIX = "pdserve:"

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TOKEN_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
KV_TRANSFER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
FAST_LOOKUP_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Redis directory lookups and tokenizer-pool queueing: sub-millisecond when healthy."""


class ServiceMetrics:
    """One process's metrics in its own registry (tests create several per process)."""

    def __init__(self, role: Role) -> None:
        self.role = role
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._totals = dict.fromkeys(
            (
                "prefix_queries",
                "prefix_hits",
                "host_prefix_hits",
                "recompute_preemptions",
                "swap_preemptions",
                "swapped_out",
                "swapped_in",
                "spec_draft",
                "spec_accepted",
            ),
            0,
        )
        self._server: WSGIServer | None = None
        self._register_vllm_metrics()
        self._register_disaggregation_metrics()
        self._register_spec_metrics()
        self._register_host_tier_metrics()

    def _register_vllm_metrics(self) -> None:
        """vLLM's request latencies, engine state and token counts."""
        self._ttft = self._histogram("time_to_first_token_seconds", "Time to first token (s).", TTFT_BUCKETS)
        self._itl = self._histogram("inter_token_latency_seconds", "Inter-token latency (s).", TOKEN_LATENCY_BUCKETS)
        self._tpot = self._histogram(
            "request_time_per_output_token_seconds",
            "Per request: decode time / (output tokens - 1) (s).",
            TOKEN_LATENCY_BUCKETS,
        )
        self._e2e = self._histogram("e2e_request_latency_seconds", "End-to-end request latency (s).")
        self._queue_time = self._histogram("request_queue_time_seconds", "Time waiting to be scheduled (s).")
        self._prefill_time = self._histogram("request_prefill_time_seconds", "First schedule to first token (s).")
        self._decode_time = self._histogram("request_decode_time_seconds", "Decode: first token to last token (s).")

        self._num_running = self._gauge("num_requests_running", "Requests in the engine's running batch.")
        self._num_waiting = self._gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self._kv_usage = self._gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0 to 1).")

        self._prompt_tokens = self._counter("prompt_tokens", "Prompt tokens processed.")
        self._generation_tokens = self._counter("generation_tokens", "Tokens generated.")
        self._prefix_queries = self._counter("prefix_cache_queries", "Prefix cache lookups, in tokens.")
        self._prefix_hits = self._counter("prefix_cache_hits", "Prefix cache hits, in tokens.")
        preemptions = self._counter("num_preemptions", "Requests preempted, by mode (recompute or swap).", "mode")
        self._recompute_preemptions = preemptions.labels(self.role, "recompute")
        self._swap_preemptions = preemptions.labels(self.role, "swap")
        self._success = self._counter("request_success", "Finished requests by finish reason.", "finished_reason")
        self._success_by_reason: dict[str, Counter] = {}
        """The role's child of `_success` per finish reason, looked up once (a labels() call costs a lock and a
        tuple of label values on every finished request)."""

    def _register_disaggregation_metrics(self) -> None:
        """pdserve's own: KV transfer, prefix directory and router."""
        self._kv_duration = self._histogram(
            "kv_transfer_duration_seconds",
            "One request's KV transfer, first block to last ack (s).",
            KV_TRANSFER_BUCKETS,
            "backend",
        )
        self._kv_bytes = self._counter("kv_transfer_bytes", "KV bytes moved prefill -> decode.", "backend")
        self._kv_failures = self._counter("kv_transfer_failures", "Failed KV transfers.", "backend")
        self._kv_lease_expiries = self._counter("kv_lease_expiries", "KV leases or reservations that lapsed.")

        self._directory_lookups = self._counter("directory_lookups", "Prefix directory lookups (failed ones too).")
        self._directory_hits = self._counter("directory_hits", "Directory lookups that found a cached prefix.")
        self._directory_errors = self._counter("directory_errors", "Directory lookups that failed (Redis down).")
        self._directory_latency = self._histogram(
            "directory_lookup_latency_seconds", "Prefix directory lookup latency (s).", FAST_LOOKUP_BUCKETS
        )
        self._router_retries = self._counter("router_retries", "Requests retried on another pod.")
        self._rejections = self._counter(
            "router_rejections", "Requests the router refused, by gRPC status code.", "code"
        )
        self._tokenizer_queue_time = self._histogram(
            "tokenizer_pool_queue_time_seconds", "Wait for a tokenizer pool worker (s).", FAST_LOOKUP_BUCKETS
        )

    def _register_spec_metrics(self) -> None:
        """Speculative decoding on the decode pod (all zero with it off)."""
        self._spec_draft = self._counter("spec_draft_tokens", "Proposed tokens verified by the target model.")
        self._spec_accepted = self._counter("spec_accepted_tokens", "Proposed tokens accepted (kept as output).")
        self._spec_acceptance = self._gauge("spec_acceptance_rate", "Accepted / proposed tokens so far (0 to 1).")
        self._spec_accepted_length = self._gauge(
            "spec_mean_accepted_length", "Tokens emitted per verify step so far (accepted proposals + 1)."
        )

    def _register_host_tier_metrics(self) -> None:
        """The host KV tier (`--swap-space`; all zero without one)."""
        self._swapped_out = self._counter("kv_swapped_out_blocks", "KV blocks copied to the host tier by preemption.")
        self._swapped_in = self._counter("kv_swapped_in_blocks", "Swapped-out KV blocks copied back to the device.")
        self._host_prefix_hits = self._counter(
            "host_prefix_cache_hits", "Prefix cache hits found in the host tier, in tokens (part of prefix_cache_hits)."
        )
        self._cpu_cache_usage = self._gauge("cpu_cache_usage_perc", "Fraction of host tier slots in use (0 to 1).")
        blocks = self._gauge("host_kv_cache_blocks", "Host tier slots by state (swapped, cached, free).", "state")
        self._host_blocks = {state: blocks.labels(self.role, state) for state in ("swapped", "cached", "free")}

    def set_host_tier(
        self,
        *,
        num_blocks_swapped_out: int,
        num_blocks_swapped_in: int,
        host_prefix_cache_hits: int,
        num_slots: int,
        num_swapped_slots: int,
        num_cached_slots: int,
    ) -> None:
        """The host tier after a step: the first three are running totals (the counters advance by the change), the
        slots set the usage gauges."""
        with self._lock:
            self._swapped_out.inc(self._advance("swapped_out", num_blocks_swapped_out))
            self._swapped_in.inc(self._advance("swapped_in", num_blocks_swapped_in))
            self._host_prefix_hits.inc(self._advance("host_prefix_hits", host_prefix_cache_hits))
        num_used = num_swapped_slots + num_cached_slots
        self._cpu_cache_usage.set(num_used / num_slots if num_slots else 0.0)
        self._host_blocks["swapped"].set(num_swapped_slots)
        self._host_blocks["cached"].set(num_cached_slots)
        self._host_blocks["free"].set(num_slots - num_used)

    def set_spec_totals(self, *, draft_tokens: int, accepted_tokens: int, verify_steps: int) -> None:
        """The engine's speculation running totals (LLMEngine.spec_stats): counters advance by the change, the two
        derived figures are set from the totals."""
        with self._lock:
            self._spec_draft.inc(self._advance("spec_draft", draft_tokens))
            self._spec_accepted.inc(self._advance("spec_accepted", accepted_tokens))
        self._spec_acceptance.set(accepted_tokens / draft_tokens if draft_tokens else 0.0)
        self._spec_accepted_length.set(1.0 + accepted_tokens / verify_steps if verify_steps else 0.0)

    def observe_first_token(self, ttft_s: float, num_prompt_tokens: int) -> None:
        """The first token left (router: to the client; prefill: to the router): TTFT, the prompt, one token."""
        self._ttft.observe(ttft_s)
        self._prompt_tokens.inc(num_prompt_tokens)
        self._generation_tokens.inc()

    def observe_output_tokens(self, num_tokens: int, inter_token_latency_s: float | None = None) -> None:
        """Tokens after the first one, with the time since the previous ones (None: the first of a decode)."""
        self._generation_tokens.inc(num_tokens)
        if inter_token_latency_s is not None:
            self._itl.observe(inter_token_latency_s)

    def observe_finished(
        self,
        finish_reason: str,
        e2e_s: float,
        num_output_tokens: int,
        *,
        queue_s: float | None = None,
        prefill_s: float | None = None,
        decode_s: float | None = None,
    ) -> None:
        """A request ended ("stop", "length", "abort"): its latencies; the phases this role saw (None: not seen).
        With `decode_s` and more than one output token, time per output token = decode_s / (tokens - 1)."""
        success = self._success_by_reason.get(finish_reason)
        if success is None:
            success = self._success_by_reason[finish_reason] = self._success.labels(self.role, finish_reason)
        success.inc()
        self._e2e.observe(e2e_s)
        for histogram, seconds in ((self._queue_time, queue_s), (self._prefill_time, prefill_s)):
            if seconds is not None:
                histogram.observe(seconds)
        if decode_s is not None:
            self._decode_time.observe(decode_s)
            if num_output_tokens > 1:
                self._tpot.observe(decode_s / (num_output_tokens - 1))

    def set_engine_state(
        self,
        *,
        num_running: int,
        num_waiting: int,
        kv_cache_usage: float,
        prefix_cache_queries: int,
        prefix_cache_hits: int,
        num_preemptions: int,
        num_swap_preemptions: int = 0,
    ) -> None:
        """The engine's state after a step. The last four are the engine's running totals (e.g.
        kv_cache_manager.stats.queries/hits, scheduler.num_preemptions, of which the swapper's swap-outs): the
        counters advance by the change; preemptions count by mode."""
        self._num_running.set(num_running)
        self._num_waiting.set(num_waiting)
        self._kv_usage.set(kv_cache_usage)
        with self._lock:
            self._prefix_queries.inc(self._advance("prefix_queries", prefix_cache_queries))
            self._prefix_hits.inc(self._advance("prefix_hits", prefix_cache_hits))
            self._recompute_preemptions.inc(
                self._advance("recompute_preemptions", num_preemptions - num_swap_preemptions)
            )
            self._swap_preemptions.inc(self._advance("swap_preemptions", num_swap_preemptions))

    def observe_kv_transfer(self, backend: str, num_bytes: int, duration_s: float) -> None:
        """One request's KV moved completely (count it on the sending side only)."""
        self._kv_duration.labels(self.role, backend).observe(duration_s)
        self._kv_bytes.labels(self.role, backend).inc(num_bytes)

    def count_kv_transfer_failure(self, backend: str) -> None:
        self._kv_failures.labels(self.role, backend).inc()

    def count_kv_lease_expiry(self) -> None:
        self._kv_lease_expiries.inc()

    def observe_directory_lookup(self, latency_s: float, hit: bool) -> None:
        """A directory lookup answered; `hit`: some pod holds a cached prefix of the prompt."""
        self._directory_lookups.inc()
        self._directory_latency.observe(latency_s)
        if hit:
            self._directory_hits.inc()

    def count_directory_error(self) -> None:
        """A directory lookup failed (routing fell back to rendezvous hashing); counts as a lookup too."""
        self._directory_lookups.inc()
        self._directory_errors.inc()

    def count_router_retry(self) -> None:
        self._router_retries.inc()

    def count_router_rejection(self, code: str) -> None:
        """A request the router answered with an error; `code` is the status name, e.g. "RESOURCE_EXHAUSTED"."""
        self._rejections.labels(self.role, code).inc()

    def observe_tokenizer_queue_time(self, seconds: float) -> None:
        self._tokenizer_queue_time.observe(seconds)

    def start_http_server(self, port: int | None, host: str = "0.0.0.0") -> int | None:
        """Serve /metrics on `host:port` (0: a free port) from a daemon thread; returns the bound port.
        `port` None (metrics endpoint off): serves nothing, returns None."""
        if port is None:
            return None
        self._server = serve_metrics(self.registry, port, host)
        return int(self._server.server_port)

    def close(self) -> None:
        """Stop the /metrics endpoint, if one runs."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _advance(self, key: str, total: int) -> int:
        """How much the running `total` grew since the last call; a total that went down started over."""
        last, self._totals[key] = self._totals[key], total
        return total - last if total >= last else total

    def _histogram(
        self, name: str, documentation: str, buckets: Sequence[float] = REQUEST_LATENCY_BUCKETS, label: str = ""
    ) -> Histogram:
        """The role's child of a histogram; with `label`, the family (children per label value, made on use)."""
        family = Histogram(
            PREFIX + name,
            documentation,
            ["role", label] if label else ["role"],
            registry=self.registry,
            buckets=buckets,
        )
        return family.labels(self.role) if not label else family

    def _gauge(self, name: str, documentation: str, label: str = "") -> Gauge:
        """The role's child of a gauge; with `label`, the family."""
        family = Gauge(
            PREFIX + name,
            documentation,
            ["role", label] if label else ["role"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        return family.labels(self.role) if not label else family

    def _counter(self, name: str, documentation: str, label: str = "") -> Counter:
        """The role's child of a counter (exposed as `<name>_total`); with `label`, the family."""
        family = Counter(PREFIX + name, documentation, ["role", label] if label else ["role"], registry=self.registry)
        return family.labels(self.role) if not label else family


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> WSGIServer:
    """Serve `registry` on http://host:port/metrics (0: a free port) from a daemon thread; `shutdown()` and
    `server_close()` stop it."""
    server, _ = start_http_server(port, host, registry=registry)
    return server


def multiprocess_registry(path: Path) -> CollectorRegistry:
    """A registry that collects, at each scrape, the metrics every process wrote under `path` (the processes'
    PROMETHEUS_MULTIPROC_DIR), merged as the module docstring says."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(path))
    return registry


def forget_process(pid: int, path: Path) -> None:
    """A process that wrote metrics under `path` exited: its live gauges no longer count (its counters and
    histograms still do)."""
    multiprocess.mark_process_dead(pid, str(path))
