"""Prometheus metrics of the serving path, named like vLLM's (DESIGN §5), in a registry per app."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _RouterCollector:
    """Reads the router's counters at scrape time, so the hot loop never touches Prometheus."""

    def __init__(self, async_router):
        self.async_router = async_router

    def collect(self):
        router = self.async_router.router
        stats = router.stats
        yield GaugeMetricFamily("specray_num_requests_running", "Sequences in the running batch",
                                value=len(router.running))
        yield GaugeMetricFamily("specray_num_requests_waiting", "Queued requests (queue depth)",
                                value=self.async_router.num_waiting)
        if hasattr(router, "reserved_tokens"):  # an autoregressive target's paged KV cache
            yield GaugeMetricFamily("specray_kv_cache_usage_perc", "Fraction of the target's KV cache slots "
                                    "reserved by running sequences (each its worst case: prompt + max_tokens)",
                                    value=router.reserved_tokens / router.config.kv_capacity_tokens)
        for name, doc, value in (
            ("specray_spec_decode_num_drafts", "Rounds with draft tokens to verify", stats.num_drafts),
            ("specray_spec_decode_num_draft_tokens", "Draft tokens verified", stats.num_draft_tokens),
            ("specray_spec_decode_num_accepted_tokens", "Draft tokens accepted", stats.num_accepted_tokens),
            ("specray_draft_fallbacks", "Rounds decoded target-only because the draft pool failed or was "
             "unavailable", getattr(stats, "draft_fallbacks", 0)),
            ("specray_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
             getattr(stats, "prefix_cache_queries", 0)),
            ("specray_prefix_cache_hits", "Prompt tokens found in the prefix cache (not computed)",
             getattr(stats, "prefix_cache_hits", 0)),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        if hasattr(stats, "model_calls"):  # a diffusion LM: model calls per token, static steps per call
            for name, doc, value in (
                ("specray_diffusion_model_calls", "Model calls (one a round, FreeDave's drafts included)",
                 stats.model_calls),
                ("specray_diffusion_steps", "Static decoding steps advanced", stats.diffusion_steps),
                ("specray_diffusion_tokens", "Tokens emitted", stats.tokens),
            ):
                yield CounterMetricFamily(name, doc, value=value)
        per_pos = CounterMetricFamily("specray_spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted draft tokens by draft position", labels=["position"])
        for pos, count in enumerate(stats.accepted_per_pos):
            per_pos.add_metric([str(pos)], count)
        yield per_pos


class ServingMetrics:
    def __init__(self, async_router):
        self.registry = CollectorRegistry()
        self.registry.register(_RouterCollector(async_router))
        self.requests = Counter("specray_request_success", "Requests answered in full, by their first choice's finish reason",
                                ["finish_reason"], registry=self.registry)
        self.failures = Counter("specray_request_failure", "Requests answered with an error, by HTTP status (gRPC codes mapped)",
                                ["status"], registry=self.registry)
        self.ttft = Histogram("specray_time_to_first_token_seconds", "Time to first token",
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.tpot = Histogram("specray_time_per_output_token_seconds", "Time per output token after the first",
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("specray_e2e_request_latency_seconds", "End-to-end request latency",
                             buckets=LATENCY_BUCKETS, registry=self.registry)

    def observe(self, start: float, first_token: float | None, end: float, num_tokens: int) -> None:
        """Latencies of one finished engine request."""
        self.e2e.observe(end - start)
        if first_token is not None:
            self.ttft.observe(first_token - start)
            if num_tokens > 1:
                self.tpot.observe((end - first_token) / (num_tokens - 1))

    def succeeded(self, finish_reason: str | None) -> None:
        """One API request answered in full (its first choice's finish reason labels it)."""
        self.requests.labels(finish_reason or "abort").inc()

    def failed(self, http_status: int) -> None:
        """One API request answered with an error (gRPC codes count by their HTTP status)."""
        self.failures.labels(str(http_status)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
