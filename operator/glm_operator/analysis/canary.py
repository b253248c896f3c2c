"""What a canary check asks Prometheus, and how the answers are judged (pure).

The queries read the gateway sidecar's own series (names imported from the gateway, so the
two cannot drift apart), for one GLMService's canary version in its main pool, over the
window since the step (or the last check) started. Only server errors (5xx) count against
the canary: 4xx are the client's fault and 429 is our own rate limit working. A window with
fewer than `minRequestCount` requests proves nothing either way, so it holds the step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from glm_operator.api import AnalysisResult, CanaryAnalysis
from glm_operator.gateway.metrics import REQUEST_DURATION, REQUESTS_TOTAL, TIME_TO_FIRST_TOKEN
from glm_operator.wellknown import MAIN_POOL

# The inference endpoints; /v1/models and the health endpoints are not requests to judge.
INFERENCE_ENDPOINTS = "chat|completions"


@dataclass(frozen=True)
class CanaryQueries:
    requests: str
    server_errors: str
    latency_p99_seconds: str
    ttft_p99_seconds: str

    def all(self) -> dict[str, str]:
        return {"requests": self.requests, "server_errors": self.server_errors,
                "latency_p99_seconds": self.latency_p99_seconds,
                "ttft_p99_seconds": self.ttft_p99_seconds}


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def canary_queries(namespace: str, service: str, model_version: str,
                   window_seconds: int) -> CanaryQueries:
    """PromQL for one check. `namespace` is the target label the ServiceMonitor adds; the
    others are the gateway's own labels (kept by honorLabels)."""
    selector = (f"namespace={_quote(namespace)},service={_quote(service)},"
                f"model_version={_quote(model_version)},pool={_quote(MAIN_POOL)},"
                f'endpoint=~"{INFERENCE_ENDPOINTS}"')
    window = f"[{max(1, window_seconds)}s]"

    def p99(histogram: str) -> str:
        return (f"histogram_quantile(0.99, sum by (le) "
                f"(rate({histogram}_bucket{{{selector}}}{window})))")

    return CanaryQueries(
        requests=f"sum(increase({REQUESTS_TOTAL}{{{selector}}}{window}))",
        server_errors=f'sum(increase({REQUESTS_TOTAL}{{{selector},code=~"5.."}}{window}))',
        latency_p99_seconds=p99(REQUEST_DURATION),
        ttft_p99_seconds=p99(TIME_TO_FIRST_TOKEN),
    )


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def judge(gates: CanaryAnalysis, values: dict[str, float | None], window_seconds: int,
          now: datetime) -> AnalysisResult:
    """The verdict of one check from the measured values (None: no samples)."""
    requests = _finite(values.get("requests")) or 0.0
    errors = _finite(values.get("server_errors")) or 0.0
    latency = _finite(values.get("latency_p99_seconds"))
    ttft = _finite(values.get("ttft_p99_seconds"))
    result = AnalysisResult(
        time=now, window_seconds=window_seconds, request_count=round(requests, 2),
        error_rate_percent=round(100 * errors / requests, 3) if requests else None,
        latency_p99_ms=round(latency * 1000, 1) if latency is not None else None,
        time_to_first_token_p99_ms=round(ttft * 1000, 1) if ttft is not None else None,
    )
    if requests < max(gates.min_request_count, 1):
        return result.model_copy(update={
            "verdict": "InsufficientTraffic",
            "message": f"{requests:.0f} requests to the canary in {window_seconds}s, fewer than "
                       f"minRequestCount {gates.min_request_count}: holding the step"})
    failed: list[str] = []
    checks: list[tuple[str, float | None, float | None, Callable[[float], str]]] = [
        ("error rate", result.error_rate_percent, gates.max_error_rate_percent,
         lambda v: f"{v:g}%"),
        ("p99 latency", result.latency_p99_ms, gates.max_latency_p99_ms, lambda v: f"{v:g} ms"),
        ("p99 time to first token", result.time_to_first_token_p99_ms,
         gates.max_time_to_first_token_p99_ms, lambda v: f"{v:g} ms"),
    ]
    for name, measured, bound, unit in checks:
        if bound is not None and measured is not None and measured > bound:
            failed.append(f"{name} {unit(measured)} > {unit(float(bound))}")
    if failed:
        return result.model_copy(update={"verdict": "Failed", "failed_gates": failed,
                                         "message": "; ".join(failed)})
    summary = (f"{requests:.0f} requests, error rate {result.error_rate_percent:g}%"
               + (f", p99 latency {result.latency_p99_ms:g} ms" if latency is not None else "")
               + (f", p99 TTFT {result.time_to_first_token_p99_ms:g} ms"
                  if ttft is not None else ""))
    return result.model_copy(update={"verdict": "Passed", "message": summary})


def unavailable(reason: str, window_seconds: int, now: datetime) -> AnalysisResult:
    return AnalysisResult(time=now, window_seconds=window_seconds, verdict="Unavailable",
                          message=reason)
