"""The router's Prometheus metrics: what routing delivers, next to the pods' own
(gateway/metrics.py). Every series carries `service`; docs/routing.md reads them."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# labels version, code (the answer's real status; 499: the client left) and outcome (how it
# ended, the gateway's REQUEST_OUTCOMES: a stream the pod broke off went out as 200)
REQUESTS_TOTAL = "glm_router_requests_total"
# The HTTP server's own refusals, which reach no handler (a 401 of the key check on the
# head, 503 too many connections / bytes held / shutting down, 408, 431, 400 bad framing):
# labels code and reason (wire/messages.py REFUSAL_REASONS).
REFUSALS_TOTAL = "glm_router_refusals_total"
PICKS_TOTAL = "glm_router_picks_total"  # label reason (PICK_REASONS)
PICKER_FAILURES_TOTAL = "glm_router_picker_failures_total"  # label reason
PICK_DURATION = "glm_router_pick_duration_seconds"  # histogram: the picker's answer
WAITING = "glm_router_waiting_requests"  # held while a version wakes or has no ready pod
WAKES_TOTAL = "glm_router_wakes_total"  # label version: scaled from zero by this router
PROMPT_TOKENS_TOTAL = "glm_router_prompt_tokens_total"  # label version, as the engine counted
PROMPT_TOKENS_CACHED_TOTAL = "glm_router_prompt_tokens_cached_total"  # of them, from its cache
# The router's own prediction (router/prefix.py): prompt characters sent, and those the chosen
# pod should hold from earlier requests. Beside the engines' count: a placement that missed
# against an engine that evicted.
PROMPT_CHARS_TOTAL = "glm_router_prompt_chars_total"  # label version
PROMPT_CHARS_PREDICTED_TOTAL = "glm_router_prompt_chars_predicted_cached_total"  # label version

PICK_REASONS = ("endpoint_picker", "fail_open", "least_loaded", "long_context", "single")
PICK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                1.0)


@dataclass
class RouterMetrics:
    registry: CollectorRegistry
    requests: Counter
    refusals: Counter
    picks: Counter
    picker_failures: Counter
    pick_duration: Histogram
    waiting: Gauge
    wakes: Counter
    prompt_tokens: Counter
    prompt_tokens_cached: Counter
    prompt_chars: Counter
    prompt_chars_predicted: Counter

    @classmethod
    def create(cls, service: str) -> RouterMetrics:
        registry = CollectorRegistry()

        def counter(name: str, help_text: str, *labels: str) -> Counter:
            return Counter(name.removesuffix("_total"), help_text, ["service", *labels],
                           registry=registry)

        metrics = cls(
            registry=registry,
            requests=counter(REQUESTS_TOTAL,
                             "Requests answered, by version, status and how they ended",
                             "version", "code", "outcome"),
            refusals=counter(REFUSALS_TOTAL,
                             "Requests and connections the HTTP server refused itself, before "
                             "any handler, by status and reason", "code", "reason"),
            picks=counter(PICKS_TOTAL, "How each request's pod was chosen", "reason"),
            picker_failures=counter(PICKER_FAILURES_TOTAL,
                                    "Picker calls that gave no pod, by why", "reason"),
            pick_duration=Histogram(PICK_DURATION, "Seconds the picker took to answer",
                                    ["service"], buckets=PICK_BUCKETS, registry=registry),
            waiting=Gauge(WAITING, "Requests held for a version to have a ready pod",
                          ["service"], registry=registry),
            wakes=counter(WAKES_TOTAL, "Main pools this router scaled from zero", "version"),
            prompt_tokens=counter(PROMPT_TOKENS_TOTAL, "Prompt tokens, as the engines counted",
                                  "version"),
            prompt_tokens_cached=counter(PROMPT_TOKENS_CACHED_TOTAL,
                                         "Prompt tokens the engines took from their cache",
                                         "version"),
            prompt_chars=counter(PROMPT_CHARS_TOTAL, "Prompt characters routed", "version"),
            prompt_chars_predicted=counter(
                PROMPT_CHARS_PREDICTED_TOTAL,
                "Prompt characters the chosen pod should hold from earlier requests",
                "version"),
        )
        metrics.waiting.labels(service).set(0)
        for reason in PICK_REASONS:
            metrics.picks.labels(service, reason)
        return metrics
