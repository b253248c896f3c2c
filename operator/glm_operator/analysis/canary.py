"""What a canary check asks Prometheus, and how the answers are judged (pure).

The queries read the gateway sidecar's own series (names imported from the gateway, so the
two cannot drift apart), for one GLMService's main pool, over the window since the step (or
the last check) started: the canary version's, and by default the stable version's over
the same window, as Kayenta judges a canary against its baseline. A request fails the
version that served it when it ended in a server error, a timeout, a stream the engine
broke, or a client who gave up before the first token (the gateway's `outcome` label);
client errors, 429s and clients who left after tokens flowed do not. Requests still running
past their bound (the gateway's overdue gauge, read at the check) count as failing while
they last, so a version that never answers is judged within one interval. A window with
fewer than `minRequestCount` canary requests cannot be judged: the step holds (and rolls
back once undecided for `undecidedDeadline`, decide/rollout.py).

p99s are estimates from the histograms' buckets (histogram_quantile interpolates inside a
bucket: a 3 s answer in the 2.5-5 s bucket may read 4.9 s), and the messages say so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from glm_operator.api import AnalysisResult, CanaryAnalysis
from glm_operator.gateway.metrics import (
    FAILED_OUTCOMES,
    REQUEST_DURATION,
    REQUESTS_OVERDUE,
    REQUESTS_TOTAL,
    TIME_TO_FIRST_TOKEN,
)
from glm_operator.wellknown import MAIN_POOL

# The inference endpoints; /v1/models and the health endpoints are not requests to judge.
INFERENCE_ENDPOINTS = "chat|completions"
# The failure rate's bound when there is no stable to compare with.
DEFAULT_MAX_ERROR_RATE_PERCENT = 1.0
# A p99 that is higher than the stable's by less than this never fails (bucket noise).
LATENCY_SLACK_MS = 100.0
CANARY, STABLE = "canary", "stable"


@dataclass(frozen=True)
class VersionQueries:
    requests: str
    failures: str
    overdue: str
    latency_p99_seconds: str
    ttft_p99_seconds: str

    def all(self) -> dict[str, str]:
        return {"requests": self.requests, "failures": self.failures, "overdue": self.overdue,
                "latency_p99_seconds": self.latency_p99_seconds,
                "ttft_p99_seconds": self.ttft_p99_seconds}


@dataclass(frozen=True)
class CanaryQueries:
    canary: VersionQueries
    stable: VersionQueries | None  # None: the canary is judged on absolute bounds only

    def all(self) -> dict[str, str]:
        """Every query, by "<canary|stable>.<name>"."""
        queries = {f"{CANARY}.{k}": v for k, v in self.canary.all().items()}
        if self.stable is not None:
            queries.update({f"{STABLE}.{k}": v for k, v in self.stable.all().items()})
        return queries


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def version_queries(namespace: str, service: str, model_version: str,
                    window_seconds: int) -> VersionQueries:
    """PromQL for one version over one window. `namespace` is the target label the
    ServiceMonitor adds; the others are the gateway's own labels (kept by honorLabels)."""
    version = (f"namespace={_quote(namespace)},service={_quote(service)},"
               f"model_version={_quote(model_version)},pool={_quote(MAIN_POOL)}")
    selector = f'{version},endpoint=~"{INFERENCE_ENDPOINTS}"'
    window = f"[{max(1, window_seconds)}s]"
    failed = "|".join(FAILED_OUTCOMES)

    def p99(histogram: str) -> str:
        return (f"histogram_quantile(0.99, sum by (le) "
                f"(rate({histogram}_bucket{{{selector}}}{window})))")

    return VersionQueries(
        requests=f"sum(increase({REQUESTS_TOTAL}{{{selector}}}{window}))",
        failures=f'sum(increase({REQUESTS_TOTAL}{{{selector},outcome=~"{failed}"}}{window}))',
        overdue=f"sum({REQUESTS_OVERDUE}{{{version}}})",
        latency_p99_seconds=p99(REQUEST_DURATION),
        ttft_p99_seconds=p99(TIME_TO_FIRST_TOKEN),
    )


def canary_queries(namespace: str, service: str, canary_version: str,
                   stable_version: str | None, window_seconds: int,
                   compare_to_stable: bool = True) -> CanaryQueries:
    stable = (version_queries(namespace, service, stable_version, window_seconds)
              if compare_to_stable and stable_version else None)
    return CanaryQueries(version_queries(namespace, service, canary_version, window_seconds),
                         stable)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


@dataclass(frozen=True)
class Measured:
    """One version's window: requests (finished + overdue), failure rate, p99s in ms."""

    requests: float
    overdue: float
    error_rate_percent: float | None
    latency_p99_ms: float | None
    ttft_p99_ms: float | None

    @classmethod
    def of(cls, values: dict[str, float | None], prefix: str) -> Measured:
        def get(name: str) -> float | None:
            return _finite(values.get(f"{prefix}.{name}"))

        overdue = get("overdue") or 0.0
        requests = (get("requests") or 0.0) + overdue
        failures = (get("failures") or 0.0) + overdue
        latency, ttft = get("latency_p99_seconds"), get("ttft_p99_seconds")
        return cls(requests, overdue,
                   round(100 * min(failures, requests) / requests, 3) if requests else None,
                   round(latency * 1000, 1) if latency is not None else None,
                   round(ttft * 1000, 1) if ttft is not None else None)


def _ms(value: float) -> str:
    return f"~{value:g} ms"


def _percent(value: float) -> str:
    return f"{value:g}%"


Check = tuple[str, float | None, float | None, Callable[[float], str]]


def _relative_failures(canary: Measured, stable: Measured, gates: CanaryAnalysis
                       ) -> list[str]:
    failed: list[str] = []
    if canary.error_rate_percent is not None and stable.error_rate_percent is not None:
        allowed = stable.error_rate_percent + gates.max_error_rate_increase_percent
        if canary.error_rate_percent > allowed:
            failed.append(f"failure rate {_percent(canary.error_rate_percent)} > stable's "
                          f"{_percent(stable.error_rate_percent)} + "
                          f"{gates.max_error_rate_increase_percent:g} points")
    factor = 1 + gates.max_latency_increase_percent / 100
    for name, mine, theirs in (("p99 latency", canary.latency_p99_ms, stable.latency_p99_ms),
                               ("p99 time to first token", canary.ttft_p99_ms,
                                stable.ttft_p99_ms)):
        if mine is None or theirs is None:
            continue
        if mine > theirs * factor and mine - theirs >= LATENCY_SLACK_MS:
            failed.append(f"{name} {_ms(mine)} > stable's {_ms(theirs)} + "
                          f"{gates.max_latency_increase_percent}% (histogram estimates)")
    return failed


def _absolute_failures(canary: Measured, gates: CanaryAnalysis, error_bound: float | None
                       ) -> list[str]:
    checks: list[Check] = [
        ("failure rate", canary.error_rate_percent, error_bound, _percent),
        ("p99 latency", canary.latency_p99_ms, gates.max_latency_p99_ms, _ms),
        ("p99 time to first token", canary.ttft_p99_ms, gates.max_time_to_first_token_p99_ms,
         _ms),
    ]
    return [f"{name} {unit(measured)} > {unit(float(bound))}"
            for name, measured, bound, unit in checks
            if bound is not None and measured is not None and measured > bound]


def judge(gates: CanaryAnalysis, values: dict[str, float | None], window_seconds: int,
          now: datetime) -> AnalysisResult:
    """The verdict of one check from the measured values ("canary.<name>" and, compared
    with stable, "stable.<name>"; None: no samples)."""
    canary = Measured.of(values, CANARY)
    compared = gates.compare_to_stable and any(k.startswith(STABLE + ".") for k in values)
    stable = Measured.of(values, STABLE) if compared else None
    result = AnalysisResult(
        time=now, window_seconds=window_seconds, request_count=round(canary.requests, 2),
        error_rate_percent=canary.error_rate_percent,
        overdue_requests=canary.overdue or None,
        latency_p99_ms=canary.latency_p99_ms, time_to_first_token_p99_ms=canary.ttft_p99_ms,
        stable_request_count=round(stable.requests, 2) if stable else None,
        stable_error_rate_percent=stable.error_rate_percent if stable else None,
        stable_latency_p99_ms=stable.latency_p99_ms if stable else None,
        stable_time_to_first_token_p99_ms=stable.ttft_p99_ms if stable else None,
    )
    minimum = max(gates.min_request_count, 1)
    if canary.requests < minimum:
        return result.model_copy(update={
            "verdict": "InsufficientTraffic",
            "message": f"{canary.requests:.0f} requests to the canary in {window_seconds}s, "
                       f"fewer than minRequestCount {gates.min_request_count}: cannot judge "
                       "it, holding the step"})
    # Compared only with a stable that had traffic enough to say something; otherwise the
    # failure rate falls back to an absolute bound.
    comparable = stable is not None and stable.requests >= minimum
    error_bound = gates.max_error_rate_percent
    if error_bound is None and not comparable:
        error_bound = DEFAULT_MAX_ERROR_RATE_PERCENT
    failed = _absolute_failures(canary, gates, error_bound)
    if comparable:
        assert stable is not None
        failed += _relative_failures(canary, stable, gates)
    if failed:
        message = "; ".join(failed)
        if canary.overdue:
            message += (f" ({canary.overdue:.0f} requests still running past their bound "
                        "count as failing)")
        return result.model_copy(update={"verdict": "Failed", "failed_gates": failed[:8],
                                         "message": message})
    return result.model_copy(update={"verdict": "Passed",
                                     "message": _summary(canary, stable, comparable)})


def _summary(canary: Measured, stable: Measured | None, comparable: bool) -> str:
    parts = [f"{canary.requests:.0f} requests, failure rate "
             f"{_percent(canary.error_rate_percent or 0.0)}"]
    if canary.latency_p99_ms is not None:
        parts.append(f"p99 latency {_ms(canary.latency_p99_ms)}")
    if canary.ttft_p99_ms is not None:
        parts.append(f"p99 TTFT {_ms(canary.ttft_p99_ms)}")
    text = ", ".join(parts)
    if stable is not None and comparable:
        text += (f"; stable: {stable.requests:.0f} requests, failure rate "
                 f"{_percent(stable.error_rate_percent or 0.0)}"
                 + (f", p99 latency {_ms(stable.latency_p99_ms)}"
                    if stable.latency_p99_ms is not None else ""))
    elif stable is not None:
        text += f"; stable had {stable.requests:.0f} requests, too few to compare with"
    return text + " (p99s estimated from histogram buckets)"


def unavailable(reason: str, window_seconds: int, now: datetime) -> AnalysisResult:
    return AnalysisResult(time=now, window_seconds=window_seconds, verdict="Unavailable",
                          message=reason)
