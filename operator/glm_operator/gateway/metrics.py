"""The gateway's Prometheus metrics. Names and labels are a contract: the HPA (through
prometheus-adapter) and the canary analysis query them; docs/gateway.md lists them.

Every series carries `service`, `model_version` and `pool`. A registry per gateway (not the
global one) keeps several gateways in one test process apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BASE_LABELS = ("service", "model_version", "pool")
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0, 600.0)
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                30.0, 60.0)
OVERFLOW_OUTCOMES = ("routed", "no_pool", "wake_timeout", "failed")


@dataclass
class GatewayMetrics:
    registry: CollectorRegistry
    requests: Counter
    duration: Histogram
    ttft: Histogram
    prompt_tokens: Counter
    completion_tokens: Counter
    in_flight: Gauge
    queued: Gauge
    overflow: Counter
    wakes: Counter
    ready: Gauge
    labels: dict[str, str]

    @classmethod
    def create(cls, service: str, model_version: str, pool: str) -> GatewayMetrics:
        registry = CollectorRegistry()
        labels = {"service": service, "model_version": model_version, "pool": pool}

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*BASE_LABELS, *extra], registry=registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, BASE_LABELS, registry=registry)

        metrics = cls(
            registry=registry,
            requests=counter("glm_gateway_requests_total",
                             "Requests answered, by endpoint and HTTP status code.",
                             ("endpoint", "code")),
            duration=Histogram("glm_gateway_request_duration_seconds",
                               "Time from request received to last byte sent.",
                               [*BASE_LABELS, "endpoint", "stream"], registry=registry,
                               buckets=DURATION_BUCKETS),
            ttft=Histogram("glm_gateway_time_to_first_token_seconds",
                           "Streaming requests: time from request received to the first "
                           "chunk from the engine.",
                           [*BASE_LABELS, "endpoint"], registry=registry, buckets=TTFT_BUCKETS),
            prompt_tokens=counter("glm_gateway_prompt_tokens_total", "Prompt tokens processed."),
            completion_tokens=counter("glm_gateway_completion_tokens_total",
                                      "Completion tokens generated."),
            in_flight=gauge("glm_gateway_requests_in_flight",
                            "Requests being answered now (queued ones included)."),
            queued=gauge("glm_gateway_requests_queued",
                         "Requests waiting: beyond the engine's slots, or held while the "
                         "long-context pool wakes."),
            overflow=counter("glm_gateway_overflow_total",
                             "Requests too long for this pool's context, by outcome.",
                             ("outcome",)),
            wakes=counter("glm_gateway_long_context_wakes_total",
                          "Scale-from-zero calls made for the long-context pool."),
            ready=gauge("glm_gateway_ready", "1 when /readyz answers 200."),
            labels=labels,
        )
        for outcome in OVERFLOW_OUTCOMES:
            metrics.overflow.labels(**labels, outcome=outcome)
        metrics.prompt_tokens.labels(**labels)
        metrics.completion_tokens.labels(**labels)
        metrics.wakes.labels(**labels)
        return metrics
