"""The gateway's Prometheus metrics, recorded (names and labels: gateway/metrics.py).

A registry per gateway (not the global one) keeps several gateways in one test process apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from glm_operator.gateway.metrics import (
    BASE_LABELS,
    COMPLETION_TOKENS_TOTAL,
    KV_CACHE_USAGE_RATIO,
    LONG_CONTEXT_WAKES_TOTAL,
    OVERFLOW_OUTCOMES,
    OVERFLOW_TOTAL,
    PROMPT_TOKENS_TOTAL,
    RATE_LIMIT_STORE_ERRORS_TOTAL,
    RATE_LIMIT_STORE_UP,
    READY,
    REFUSALS_TOTAL,
    REQUEST_DURATION,
    REQUESTS_IN_FLIGHT,
    REQUESTS_OVERDUE,
    REQUESTS_QUEUED,
    REQUESTS_TOTAL,
    TIME_TO_FIRST_TOKEN,
)
from glm_operator.gateway.policy.outcomes import request_outcome

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0, 600.0)
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                30.0, 60.0)


@dataclass
class GatewayMetrics:
    registry: CollectorRegistry
    requests: Counter
    duration: Histogram
    ttft: Histogram
    prompt_tokens: Counter
    completion_tokens: Counter
    in_flight: Gauge
    overdue: Gauge
    queued: Gauge
    overflow: Counter
    refusals: Counter
    wakes: Counter
    ready: Gauge
    kv_cache_usage: Gauge
    store_errors: Counter
    store_up: Gauge
    labels: dict[str, str]
    # Labelled children of the request metrics, cached: labels() costs a lock and a tuple
    # build, and record() runs once per request.
    _request_children: dict[tuple[str, int, bool, str], tuple[Counter, Histogram]] = field(
        default_factory=dict, init=False, repr=False)
    _ttft_children: dict[str, Histogram] = field(default_factory=dict, init=False, repr=False)
    _prompt_tokens: Counter = field(init=False, repr=False)
    _completion_tokens: Counter = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._prompt_tokens = self.prompt_tokens.labels(**self.labels)
        self._completion_tokens = self.completion_tokens.labels(**self.labels)

    def record(self, endpoint: str, status: int, duration_seconds: float, stream: bool,
               ttft_seconds: float | None = None, prompt_tokens: int | None = None,
               completion_tokens: int | None = None, outcome: str | None = None) -> None:
        """Record one finished request: its code and how it ended (policy/outcomes.py), its
        duration, its time to first token (streams that got one) and the tokens it used. The
        only place that does. Without `outcome`, the one its status says."""
        if outcome is None:
            outcome = request_outcome(status, None, ttft_seconds is not None)
        key = (endpoint, status, stream, outcome)
        series = self._request_children.get(key)
        if series is None:
            series = (
                self.requests.labels(**self.labels, endpoint=endpoint, code=str(status),
                                     outcome=outcome),
                self.duration.labels(**self.labels, endpoint=endpoint,
                                     stream="true" if stream else "false"),
            )
            self._request_children[key] = series
        series[0].inc()
        series[1].observe(duration_seconds)
        if ttft_seconds is not None:
            ttft = self._ttft_children.get(endpoint)
            if ttft is None:
                ttft = self._ttft_children[endpoint] = self.ttft.labels(**self.labels,
                                                                        endpoint=endpoint)
            ttft.observe(ttft_seconds)
        if prompt_tokens:
            self._prompt_tokens.inc(prompt_tokens)
        if completion_tokens:
            self._completion_tokens.inc(completion_tokens)

    def record_refusal(self, status: int, reason: str) -> None:
        """One refusal of the HTTP server's own (wire/server.py `on_refusal`)."""
        self.refusals.labels(**self.labels, code=str(status), reason=reason).inc()

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
            requests=counter(REQUESTS_TOTAL,
                             "Requests answered, by endpoint, HTTP status code and how they "
                             "ended (outcome).", ("endpoint", "code", "outcome")),
            duration=Histogram(REQUEST_DURATION,
                               "Time from request received to last byte sent.",
                               [*BASE_LABELS, "endpoint", "stream"], registry=registry,
                               buckets=DURATION_BUCKETS),
            ttft=Histogram(TIME_TO_FIRST_TOKEN,
                           "Streaming requests: time from request received to the first "
                           "chunk from the engine.",
                           [*BASE_LABELS, "endpoint"], registry=registry, buckets=TTFT_BUCKETS),
            prompt_tokens=counter(PROMPT_TOKENS_TOTAL, "Prompt tokens processed."),
            completion_tokens=counter(COMPLETION_TOKENS_TOTAL,
                                      "Completion tokens generated."),
            in_flight=gauge(REQUESTS_IN_FLIGHT,
                            "Requests being answered now (queued ones included)."),
            overdue=gauge(REQUESTS_OVERDUE,
                          "Requests running longer than they may: no first token within "
                          "--first-token-overdue, or longer than --request-overdue."),
            queued=gauge(REQUESTS_QUEUED,
                         "Requests waiting: beyond the engine's slots, or held while the "
                         "long-context pool wakes."),
            overflow=counter(OVERFLOW_TOTAL,
                             "Requests too long for this pool's context, by outcome.",
                             ("outcome",)),
            refusals=counter(REFUSALS_TOTAL,
                             "Requests and connections the HTTP server refused itself, before "
                             "any handler, by HTTP status code and reason.",
                             ("code", "reason")),
            wakes=counter(LONG_CONTEXT_WAKES_TOTAL,
                          "Scale-from-zero calls made for the long-context pool."),
            ready=gauge(READY, "1 when /readyz answers 200."),
            kv_cache_usage=gauge(KV_CACHE_USAGE_RATIO,
                                 "Share of the engine's KV cache held by requests being "
                                 "answered, 0..1 (absent until the engine first answers)."),
            store_errors=counter(RATE_LIMIT_STORE_ERRORS_TOTAL,
                                 "Calls to the shared rate-limit store that failed, by reason "
                                 "(timeout, connection, error).", ("reason",)),
            store_up=gauge(RATE_LIMIT_STORE_UP,
                           "1 while the shared rate-limit store answers, 0 while the "
                           "gateway falls back (gateway.rateLimit.store.onUnavailable)."),
            labels=labels,
        )
        for outcome in OVERFLOW_OUTCOMES:
            metrics.overflow.labels(**labels, outcome=outcome)
        metrics.wakes.labels(**labels)
        return metrics
