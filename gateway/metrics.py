"""Prometheus metrics of the gateway, one registry per app, on ``GET /metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    """The gateway's counters, gauges and histograms (each: docs/gateway-semantics.md, "Metrics")."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gateway_requests",
            "Requests answered, by endpoint, route and HTTP status",
            ["endpoint", "route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "gateway_request_latency_seconds",
            "Time from request to end of answer",
            ["endpoint", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_ttft_seconds",
            "Time to the first upstream byte of a stream",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "gateway_upstream_in_flight", "Upstream calls in flight", ["route"], registry=r
        )
        self.worker_healthy = Gauge(
            "gateway_upstream_worker_healthy",
            "1 when a pool worker takes calls, else 0",
            ["route", "worker"],
            registry=r,
        )
        self.steps_recorded = Counter("gateway_steps_recorded", "Steps committed to the store", registry=r)
        self.telemetry_queue_depth = Gauge(
            "gateway_telemetry_queue_depth", "Records waiting for the writer", registry=r
        )
        self.telemetry_dropped = Counter(
            "gateway_telemetry_dropped", "Records dropped (best_effort mode)", registry=r
        )
        self.upstream_retries = Counter(
            "gateway_upstream_retries",
            "Upstream attempts retried before the first byte reached the client, by "
            "route and reason (status_<code>, connect_error, connect_timeout)",
            ["route", "reason"],
            registry=r,
        )
        self.synthetic_stops = Counter(
            "gateway_synthetic_stops", "Synthetic stop answers at max_steps", registry=r
        )
        self.idempotent_replays = Counter(
            "gateway_idempotent_replays",
            "Retries of a session's call answered with that call's answer (replayed "
            "or joined: no upstream call, no step), by endpoint",
            ["endpoint"],
            registry=r,
        )
        self.keepalives = Counter(
            "gateway_stream_keepalives",
            "SSE keep-alive comments sent to streaming clients while the upstream was idle",
            ["route"],
            registry=r,
        )
        self.error_responses = Counter(
            "gateway_error_responses",
            "Errors the gateway answered itself (auth, refused or malformed requests, "
            "unknown paths, gateway faults), by HTTP status and error code",
            ["status", "code"],
            registry=r,
        )

    def answer(self, endpoint: str, route: str, http_status: int, seconds: float | None = None) -> None:
        """Count one model call answered with ``http_status`` (and its latency, when given)."""
        self.requests.labels(endpoint, route, str(http_status)).inc()
        if seconds is not None:
            self.latency.labels(endpoint, route).observe(seconds)

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)
