"""The canary's judge (pure): every gate and verdict, from the values Prometheus would give."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from glm_operator.analysis.canary import canary_queries, judge
from glm_operator.api import CanaryAnalysis
from glm_operator.gateway.metrics import FAILED_OUTCOMES

NOW = datetime(2026, 1, 1, tzinfo=UTC)
DEFAULT = CanaryAnalysis()


def values(canary: dict[str, float | None], stable: dict[str, float | None] | None = None
           ) -> dict[str, float | None]:
    out = {f"canary.{k}": v for k, v in canary.items()}
    if stable is not None:
        out.update({f"stable.{k}": v for k, v in stable.items()})
    return out


HEALTHY = {"requests": 100.0, "failures": 0.0, "overdue": 0.0, "latency_p99_seconds": 0.8,
           "ttft_p99_seconds": 0.05}


def run(canary: dict[str, float | None], stable: dict[str, float | None] | None = HEALTHY,
        gates: CanaryAnalysis = DEFAULT) -> tuple[str, str, list[str]]:
    result = judge(gates, values(canary, stable), 60, NOW)
    return str(result.verdict), str(result.message), list(result.failed_gates or [])


def test_the_queries_count_failures_by_outcome_and_read_the_overdue_gauge() -> None:
    queries = canary_queries("ns", "glm", "v2", "v1", 60)
    assert queries.stable is not None
    assert 'model_version="v2"' in queries.canary.failures
    assert 'model_version="v1"' in queries.stable.failures
    for outcome in FAILED_OUTCOMES:
        assert outcome in queries.canary.failures
    assert "code=" not in queries.canary.failures  # a broken stream went out as 200
    assert queries.canary.overdue == ('sum(glm_gateway_requests_overdue{namespace="ns",'
                                      'service="glm",model_version="v2",pool="main"})')
    assert set(queries.all()) == {f"{v}.{k}" for v in ("canary", "stable") for k in (
        "requests", "failures", "overdue", "latency_p99_seconds", "ttft_p99_seconds")}
    assert canary_queries("ns", "glm", "v2", "v1", 60, compare_to_stable=False).stable is None
    assert canary_queries("ns", "glm", "v2", None, 60).stable is None


def test_a_canary_like_its_stable_passes() -> None:
    verdict, message, _ = run(HEALTHY)
    assert verdict == "Passed"
    assert "stable: 100 requests" in message and "histogram" in message


def test_failures_beyond_the_stables_plus_tolerance_fail() -> None:
    stable = {**HEALTHY, "failures": 2.0}  # 2 %
    assert run({**HEALTHY, "failures": 3.0}, stable)[0] == "Passed"  # 3 % <= 2 + 1
    verdict, _, gates = run({**HEALTHY, "failures": 4.0}, stable)
    assert verdict == "Failed"
    assert gates == ["failure rate 4% > stable's 2% + 1 points"]


def test_a_stable_that_fails_as_much_does_not_fail_the_canary() -> None:
    # 5 % failing on both (an overloaded service): no worse, so no rollback by default...
    bad = {**HEALTHY, "failures": 5.0}
    assert run(bad, bad)[0] == "Passed"
    # ...unless an absolute bound is asked for.
    assert run(bad, bad, CanaryAnalysis(max_error_rate_percent=1))[0] == "Failed"


def test_without_a_stable_to_compare_the_failure_rate_bound_is_one_percent() -> None:
    thin_stable = {**HEALTHY, "requests": 3.0}
    verdict, message, gates = run({**HEALTHY, "failures": 2.0}, thin_stable)
    assert verdict == "Failed" and gates == ["failure rate 2% > 1%"]
    verdict, message, _ = run(HEALTHY, thin_stable)
    assert verdict == "Passed" and "too few to compare with" in message
    assert run({**HEALTHY, "failures": 2.0}, None,
               CanaryAnalysis(compare_to_stable=False))[0] == "Failed"


def test_a_slower_canary_fails_on_p99_latency_and_ttft_relative_to_stable() -> None:
    verdict, _, gates = run({**HEALTHY, "latency_p99_seconds": 4.975})
    assert verdict == "Failed"
    assert gates == ["p99 latency ~4975 ms > stable's ~800 ms + 50% (histogram estimates)"]
    verdict, _, gates = run({**HEALTHY, "ttft_p99_seconds": 2.0})
    assert gates == ["p99 time to first token ~2000 ms > stable's ~50 ms + 50% "
                     "(histogram estimates)"]
    # 50 % higher but under 100 ms apart: bucket noise, not a regression
    assert run({**HEALTHY, "ttft_p99_seconds": 0.09})[0] == "Passed"
    assert run({**HEALTHY, "latency_p99_seconds": 1.1})[0] == "Passed"  # within 50 %


def test_absolute_latency_and_ttft_gates() -> None:
    gates = CanaryAnalysis(max_latency_p99_ms=500, max_time_to_first_token_p99_ms=40)
    verdict, _, failed = run(HEALTHY, HEALTHY, gates)
    assert verdict == "Failed"
    assert failed == ["p99 latency ~800 ms > ~500 ms", "p99 time to first token ~50 ms > ~40 ms"]


def test_a_canary_that_never_answers_fails_on_its_overdue_requests() -> None:
    hung = {"requests": 0.0, "failures": 0.0, "overdue": 120.0, "latency_p99_seconds": None,
            "ttft_p99_seconds": None}
    result = judge(DEFAULT, values(hung, HEALTHY), 60, NOW)
    assert result.verdict == "Failed" and result.overdue_requests == 120
    assert result.error_rate_percent == 100
    assert "120 requests still running past their bound" in str(result.message)


def test_clients_who_gave_up_before_the_first_token_count_and_few_requests_hold() -> None:
    gave_up = {**HEALTHY, "requests": 168.0, "failures": 168.0}  # all abandoned, as 499s
    assert run(gave_up)[0] == "Failed"
    verdict, message, _ = run({**HEALTHY, "requests": 4.0})
    assert verdict == "InsufficientTraffic" and "cannot judge" in message


@pytest.mark.parametrize("missing", [None, float("nan"), float("inf")])
def test_no_samples_are_no_numbers_not_zeros(missing: float | None) -> None:
    canary = {**HEALTHY, "latency_p99_seconds": missing, "ttft_p99_seconds": missing}
    result = judge(DEFAULT, values(canary, HEALTHY), 60, NOW)
    assert result.verdict == "Passed" and result.latency_p99_ms is None
    assert result.stable_latency_p99_ms == 800
