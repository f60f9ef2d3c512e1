"""Prometheus metrics of one app, in its own registry (several apps may live in one process).

Gauges are read from the engine when scraped; counters and histograms are fed by the completions.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from inferno.engine import Engine
from inferno.serve.running import Observer

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Metrics(Observer):
    """The server's metrics; `engine` gives the engine once the model is loaded (None before)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine: Callable[[], Engine | None]) -> None:
        self.registry = r = CollectorRegistry()

        def read(fn: Callable[[Engine], int]) -> Callable[[], float]:
            return lambda: float(fn(e)) if (e := engine()) is not None else 0.0

        Gauge("inferno_requests_running", "Sequences holding a KV slot", registry=r).set_function(
            read(lambda e: e.running))
        Gauge("inferno_requests_waiting", "Requests waiting for KV slots", registry=r).set_function(
            read(lambda e: e.waiting))
        Gauge("inferno_slots_busy", "KV slots in use", registry=r).set_function(
            read(lambda e: e.slots.n_slots - e.free_slots))
        Gauge("inferno_slots_total", "KV slots", registry=r).set_function(read(lambda e: e.slots.n_slots))
        Gauge("inferno_prefix_cache_queries", "Prompt tokens looked up in the prefix cache (vLLM's "
              "prefix_cache_queries)", registry=r).set_function(read(lambda e: e.stats.prefix_cache_queries))
        Gauge("inferno_prefix_cache_hits", "Prompt tokens found in the prefix cache, not prefilled again "
              "(vLLM's prefix_cache_hits)", registry=r).set_function(
                  read(lambda e: e.stats.prefix_cache_hits))
        # Speculative decoding: llama.cpp's and vLLM's counters (vLLM's spec_decode_num_* names).
        Gauge("inferno_spec_decode_num_drafts", "Rounds that verified drafts", registry=r).set_function(
            read(lambda e: e.stats.speculation.rounds))
        Gauge("inferno_spec_decode_num_draft_tokens", "Tokens drafted", registry=r).set_function(
            read(lambda e: e.stats.speculation.drafted))
        Gauge("inferno_spec_decode_num_accepted_tokens", "Drafted tokens accepted", registry=r).set_function(
            read(lambda e: e.stats.speculation.accepted))
        self._engine = engine
        self._per_position = Gauge("inferno_spec_decode_num_accepted_tokens_per_pos", "Drafted tokens "
                                   "accepted, by draft position (0: the first); with _drafted_per_pos, the "
                                   "acceptance rate per position", ["position"], registry=r)
        self._drafted_per_position = Gauge("inferno_spec_decode_num_drafted_tokens_per_pos", "Tokens drafted "
                                           "by draft position", ["position"], registry=r)
        self.prompt_tokens = Counter("inferno_prompt_tokens", "Prompt tokens of admitted requests",
                                     registry=r)
        self.generation_tokens = Counter("inferno_generation_tokens", "New tokens generated", registry=r)
        self.ttft = Histogram("inferno_time_to_first_token_seconds", "From the request to a choice's first "
                              "token", buckets=_TTFT_BUCKETS, registry=r)
        self.itl = Histogram("inferno_inter_token_latency_seconds", "Between consecutive tokens of a choice",
                             buckets=_ITL_BUCKETS, registry=r)
        self.duration = Histogram("inferno_request_duration_seconds", "HTTP request duration, to the last "
                                  "byte", ["path"], buckets=_DURATION_BUCKETS, registry=r)
        self.requests = Counter("inferno_http_requests", "HTTP requests by route and status",
                                ["path", "status"], registry=r)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def next_token(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def tokens(self, n: int) -> None:
        self.generation_tokens.inc(n)

    def request(self, path: str, status: int, seconds: float) -> None:
        self.requests.labels(path, str(status)).inc()
        self.duration.labels(path).observe(seconds)

    def render(self) -> bytes:
        engine = self._engine()
        if engine is not None:  # the per-position gauges: as many positions as have been drafted
            stats = engine.stats.speculation
            for i, (drafted, accepted) in enumerate(zip(stats.drafted_at, stats.accepted_at, strict=True)):
                self._drafted_per_position.labels(str(i)).set(drafted)
                self._per_position.labels(str(i)).set(accepted)
        return generate_latest(self.registry)
