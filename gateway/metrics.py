"""Prometheus metrics of the gateway (prometheus-client), one registry per app instance."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    """Counters, gauges and histograms exposed on ``GET /metrics``. Latencies are seconds."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("gateway_requests", "Requests answered, by endpoint, route and HTTP status",
                                ["endpoint", "route", "status"], registry=r)
        self.latency = Histogram("gateway_request_latency_seconds", "Time from request to end of answer",
                                 ["endpoint", "route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("gateway_ttft_seconds", "Time to the first upstream byte of a stream",
                              ["route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("gateway_upstream_in_flight", "Upstream calls in flight", ["route"], registry=r)
        self.steps_recorded = Counter("gateway_steps_recorded", "Steps committed to the store", registry=r)
        self.telemetry_queue_depth = Gauge("gateway_telemetry_queue_depth", "Records waiting for the writer",
                                           registry=r)
        self.telemetry_dropped = Counter("gateway_telemetry_dropped", "Records dropped (best_effort mode)",
                                         registry=r)
        self.upstream_retries = Counter("gateway_upstream_retries",
                                        "Upstream attempts retried before the first byte reached the client, by "
                                        "route and reason (status_<code>, connect_error, connect_timeout)",
                                        ["route", "reason"], registry=r)
        self.synthetic_stops = Counter("gateway_synthetic_stops", "Synthetic stop answers at max_steps",
                                       registry=r)

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)
