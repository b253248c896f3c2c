"""The real Prometheus scraping stand-in gateways: the queries canary analysis will run.

Three stand-ins of one GLMService serve the gateway's own metrics (GatewayMetrics) while
Debian's Prometheus scrapes them every second through file_sd: a stable `v1` with no errors
and 50 ms answers, a canary `v2` where half the answers are 500s and every answer takes 0.8 s,
and a `v3` whose clients are refused (429, 401) 40% of the time and 10% get a 503. The
queries are built from the metric names gateway/metrics.py exports. No cluster is needed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest
from glm_operator.gateway.metrics import (
    READY,
    REQUEST_DURATION,
    REQUESTS_TOTAL,
    TIME_TO_FIRST_TOKEN,
)
from glm_operator.render.scaling_metrics import (
    REJECTED_CODES,
    REQUESTS_PER_SECOND,
    adapter_query,
)

from e2e.gateway_standin import GatewayStandIn, gateway_standins
from e2e.prometheus import PrometheusError, PrometheusServer, prometheus

__all__ = ["gateway_standins", "prometheus"]  # fixtures, imported for pytest

SERVICE = "glm-chat"
WINDOW = "20s"
RATE = 20  # requests a second per stand-in
ENOUGH = 150  # requests of v2 seen in the window before the ratios are judged (~8 s)


@pytest.fixture(scope="module")
def scraped(prometheus: PrometheusServer) -> Iterator[dict[str, GatewayStandIn]]:
    namespace = f"e2e-prometheus-{uuid.uuid4().hex[:5]}"
    with ExitStack() as stack:
        standins = {
            version: stack.enter_context(GatewayStandIn(namespace, SERVICE, version))
            for version in ("v1", "v2", "v3")
        }
        for standin in standins.values():
            standin.register(prometheus)
        standins["v1"].set_traffic(RATE, latency_seconds=0.05)
        standins["v2"].set_traffic(RATE, error_ratio=0.5, latency_seconds=0.8)
        standins["v3"].set_traffic(RATE, error_ratio=0.1, status_code_for_errors=503,
                                   client_error_ratio=0.4)
        prometheus.wait_for_series(
            f"sum({increase(namespace, 'v2')}) > {ENOUGH}", timeout=40)
        yield standins


def selector(namespace: str, version: str, extra: str = "") -> str:
    return (f'namespace="{namespace}", service="{SERVICE}", model_version="{version}"'
            + (f", {extra}" if extra else ""))


def increase(namespace: str, version: str, extra: str = "") -> str:
    return f"increase({REQUESTS_TOTAL}{{{selector(namespace, version, extra)}}}[{WINDOW}])"


def ratio(prometheus: PrometheusServer, namespace: str, version: str, codes: str) -> float:
    """The share of `version`'s requests in the window whose code matches the regex. A code
    never answered has no series at all, hence `or vector(0)`."""
    matching = increase(namespace, version, f'code=~"{codes}"')
    value = prometheus.value(
        f"(sum({matching}) or vector(0)) / sum({increase(namespace, version)})")
    assert value is not None, f"no requests of {version} in the last {WINDOW}"
    return value


def p99(prometheus: PrometheusServer, namespace: str, version: str) -> float:
    value = prometheus.value(
        f"histogram_quantile(0.99, sum by (le) (rate({REQUEST_DURATION}_bucket"
        f"{{{selector(namespace, version)}}}[{WINDOW}])))")
    assert value is not None, f"no duration histogram for {version}"
    return value


def test_series_carry_the_gateway_labels_and_the_targets(
    prometheus: PrometheusServer, scraped: dict[str, GatewayStandIn]
) -> None:
    canary = scraped["v2"]
    samples = prometheus.query(f'{REQUESTS_TOTAL}{{pod="{canary.pod}"}}')
    assert samples
    for labels, _ in samples:
        assert labels["namespace"] == canary.namespace
        assert labels["pod"] == canary.pod
        assert labels["service"] == SERVICE  # the gateway's own label, kept (honor_labels)
        assert labels["model_version"] == "v2"
        assert labels["pool"] == "main"
        assert labels["endpoint"] == "chat"
    assert {labels["code"] for labels, _ in samples} == {"200", "500"}


def test_canary_error_ratio_is_measured(
    prometheus: PrometheusServer, scraped: dict[str, GatewayStandIn]
) -> None:
    namespace = scraped["v2"].namespace
    assert ratio(prometheus, namespace, "v2", "5..") == pytest.approx(0.5, abs=0.05)
    assert ratio(prometheus, namespace, "v1", "5..") == 0
    assert prometheus.query(increase(namespace, "v1", 'code=~"5.."')) == []  # no 5xx series


def test_latency_quantiles_fall_in_their_buckets(
    prometheus: PrometheusServer, scraped: dict[str, GatewayStandIn]
) -> None:
    namespace = scraped["v2"].namespace
    assert 0.5 < p99(prometheus, namespace, "v2") <= 1.0
    assert p99(prometheus, namespace, "v1") < 0.1


def test_client_errors_are_counted_under_their_codes_not_as_5xx(
    prometheus: PrometheusServer, scraped: dict[str, GatewayStandIn]
) -> None:
    namespace = scraped["v3"].namespace
    assert ratio(prometheus, namespace, "v3", "5..") == pytest.approx(0.1, abs=0.04)
    assert ratio(prometheus, namespace, "v3", "503") == pytest.approx(0.1, abs=0.04)
    assert ratio(prometheus, namespace, "v3", "429") == pytest.approx(0.2, abs=0.05)
    assert ratio(prometheus, namespace, "v3", "401") == pytest.approx(0.2, abs=0.05)
    assert ratio(prometheus, namespace, "v3", "4..") == pytest.approx(0.4, abs=0.05)


def test_requests_per_second_counts_served_requests_not_rejections(
    prometheus: PrometheusServer, scraped: dict[str, GatewayStandIn]
) -> None:
    """The HPA's requests-per-second rule, expanded as prometheus-adapter does, and the pool
    query KEDA runs: v3's 429/401 rejections (40 %) are left out, its 503s (10 %) are not.
    Compared with the same query over every code, in one evaluation (the 2 m rate window is
    longer than this test's traffic, so only the ratio is steady)."""
    v3 = scraped["v3"]
    rule = REQUESTS_PER_SECOND.adapter_rule()
    served = adapter_query(rule, v3.namespace, [v3.pod])
    everything = served.replace(f',code!~"{REJECTED_CODES}"', "")
    assert everything != served
    samples = prometheus.query(f"({served}) / on (pod) ({everything})")
    assert [labels["pod"] for labels, _ in samples] == [v3.pod]  # one value, for the pod
    assert samples[0][1] == pytest.approx(0.6, abs=0.05)
    pool = REQUESTS_PER_SECOND.pool_query(v3.namespace, SERVICE, "v3", "main")
    pool_all = pool.replace(f',code!~"{REJECTED_CODES}"', "")
    assert prometheus.value(f"({pool}) / ({pool_all})") == pytest.approx(0.6, abs=0.05)


def test_targets_come_and_go_by_file_and_the_gateway_labels_win(
    prometheus: PrometheusServer,
) -> None:
    with GatewayStandIn(f"e2e-prometheus-{uuid.uuid4().hex[:5]}", SERVICE, "v9") as standin:
        # The Prometheus Operator also puts the Kubernetes Service's name in `service`;
        # honorLabels keeps the gateway's (the GLMService's) on the scraped series.
        prometheus.add_target(standin.pod, standin.address,
                              {**standin.target_labels, "service": "glm-chat-gateway"})
        up = prometheus.wait_for_series(f'up{{pod="{standin.pod}"}} == 1', timeout=20)
        assert up[0][0]["service"] == "glm-chat-gateway"  # `up` has the target's labels only
        ready = prometheus.query(f'{READY}{{pod="{standin.pod}"}}')
        assert [(labels["service"], labels["namespace"], value) for labels, value in ready] \
            == [(SERVICE, standin.namespace, 1.0)]
        prometheus.remove_target(standin.pod)
        prometheus.wait_for_absent(f'up{{pod="{standin.pod}"}}', timeout=20)


def test_the_fixture_makes_registered_standins_with_streams_timed_to_first_token(
    prometheus: PrometheusServer, gateway_standins: Callable[..., GatewayStandIn]
) -> None:
    standin = gateway_standins(f"e2e-prometheus-{uuid.uuid4().hex[:5]}", SERVICE, "v1",
                               pool="long-context")
    standin.set_traffic(RATE, ttft_seconds=0.02)
    pod = f'pod="{standin.pod}"'
    prometheus.wait_for_series(f"{TIME_TO_FIRST_TOKEN}_count{{{pod}}} > 10", timeout=20)
    standin.stop_traffic()
    answered = f'{REQUESTS_TOTAL}{{{pod}, endpoint="chat", code="200"}}'
    prometheus.wait_for_series(f"{answered} == {standin.requests_recorded}", timeout=10)
    first_tokens = prometheus.value(f'{TIME_TO_FIRST_TOKEN}_count{{{pod}, pool="long-context"}}')
    assert first_tokens == standin.requests_recorded


def test_a_bad_query_raises_with_prometheus_error_text(prometheus: PrometheusServer) -> None:
    with pytest.raises(PrometheusError, match="parse error"):
        prometheus.query(f"sum({REQUESTS_TOTAL}")
